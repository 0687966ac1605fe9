"""`provision apply` and `provision plan`: converge hosts by running the site playbook."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.markup import escape

from provision import inventory as inventory_mod
from provision.errors import UsageError
from provision.progress import LiveProgress, summary_table
from provision.runner import RunResult, new_record_dir, run_playbook, write_summary

PHASES = ("kernel", "gpu", "sglang", "verify")
SITE_PLAYBOOK = "site.yml"
ROLLBACK_PLAYBOOK = "rollback.yml"


@dataclass
class ApplyOptions:
    inventory: str
    limit: str | None = None
    tags: list[str] = field(default_factory=list)
    check: bool = False
    diff: bool = False
    reboot: str | None = None  # auto | never; None leaves the inventory's choice
    runs_dir: Path = Path(".provision/runs")
    host_key_checking: bool = True
    vault_password_file: Path | None = None
    full: bool = False  # run every phase's tasks, even where its recorded fingerprint still holds


def parse_tags(text: str | None) -> list[str]:
    if not text:
        return []
    tags = [t.strip() for t in text.split(",") if t.strip()]
    unknown = [t for t in tags if t not in PHASES]
    if unknown:
        raise UsageError(f"--tags: unknown phase(s) {', '.join(unknown)}; choose from {', '.join(PHASES)}")
    return tags


def _extravars(opts: ApplyOptions) -> dict[str, Any]:
    extra: dict[str, Any] = {}
    if opts.reboot is not None:
        if opts.reboot not in ("auto", "never"):
            raise UsageError(f"--reboot: expected auto or never, got {opts.reboot!r}")
        extra["kernel_cmdline_reboot"] = opts.reboot
    if opts.full:
        extra["provision_state_skip"] = False
    return extra


def inventory_secrets(inv: inventory_mod.Inventory) -> set[str]:
    """Literal secret values written in the inventory, so the run record can scrub them too."""
    found = set()
    for host in inv.hosts.values():
        for name in inventory_mod.SECRET_VARIABLES:
            value = host.value(name)
            if isinstance(value, str) and "{{" not in value and not isinstance(value, inventory_mod.VaultValue):
                found.add(value)
    return found


def apply(
    opts: ApplyOptions, console: Console | None = None, kind: str = "apply", playbook: str = SITE_PLAYBOOK
) -> RunResult:
    """Validate the inventory, run the playbook (site.yml), write the run record and return the result."""
    console = console or Console(stderr=True)
    inv = inventory_mod.load(opts.inventory)
    for warning in inv.warnings:
        console.print(f"[yellow]warning:[/] {warning}", highlight=False)
    extravars = _extravars(opts)
    record = new_record_dir(opts.runs_dir, kind)
    secrets = inventory_secrets(inv)
    result = run_playbook(
        playbook,
        inv.path,
        record_dir=record,
        host_count=len(inv.hosts),
        limit=opts.limit,
        tags=opts.tags,
        check=opts.check,
        diff=opts.diff,
        extravars=extravars,
        host_key_checking=opts.host_key_checking,
        vault_password_file=opts.vault_password_file,
        secrets=secrets,
        progress=LiveProgress(console, f"provision {kind} --inventory {opts.inventory}"),
    )
    summary = {
        "command": kind,
        "inventory": str(inv.path),
        "limit": opts.limit,
        "tags": opts.tags,
        **result.to_dict(),
    }
    write_summary(record, summary, secrets)
    return result


def plan_summary(result: RunResult) -> dict[str, list[str]]:
    """Per host, the tasks that would change."""
    per_host: dict[str, list[str]] = {h: [] for h in result.hosts}
    for item in result.changed_tasks:
        per_host.setdefault(item["host"], []).append(item["task"])
    return per_host


def print_result(console: Console, result: RunResult, title: str) -> None:
    console.print(summary_table(result, title))
    for host, messages in sorted(result.reports.items()):
        for message in messages:
            console.print(f"{escape(host)}: {escape(message)}", highlight=False)
    for failure in result.failures:
        where = f"{failure['host']}: " if failure["host"] else ""
        task = f"[{failure['task']}] " if failure["task"] else ""
        console.print(f"[red]FAILED[/] {escape(where + task + failure['message'])}", highlight=False)
    console.print(f"run record: {result.record_dir}", highlight=False)
