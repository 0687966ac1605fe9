"""`provision apply` and `provision plan`: converge hosts by running the site playbook."""

from __future__ import annotations

import difflib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.markup import escape

from provision import inventory as inventory_mod
from provision.errors import UsageError
from provision.progress import LiveProgress, summary_table
from provision.runner import RunResult, new_record_dir, redact_text, run_playbook, write_summary

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
    vault: inventory_mod.VaultOptions = field(default_factory=inventory_mod.VaultOptions)
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


def apply(
    opts: ApplyOptions, console: Console | None = None, kind: str = "apply", playbook: str = SITE_PLAYBOOK
) -> RunResult:
    """Validate the inventory, run the playbook (site.yml), write the run record and return the result."""
    console = console or Console(stderr=True)
    inv = inventory_mod.load(opts.inventory, opts.vault, opts.host_key_checking)
    scope = inv.scope(opts.limit)
    for warning in inv.warnings:
        console.print(f"[yellow]warning:[/] {warning}", highlight=False)
    extravars = _extravars(opts)
    record = new_record_dir(opts.runs_dir, kind)
    secrets = inventory_mod.secret_values(inv)
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
        vault=opts.vault,
        secrets=secrets,
        progress=LiveProgress(console, f"provision {kind} --inventory {opts.inventory}"),
    )
    result.host_states = host_states(result, scope)
    summary = {
        "command": kind,
        "inventory": str(inv.path),
        "limit": opts.limit,
        "tags": opts.tags,
        **result.to_dict(),
    }
    write_summary(record, summary, secrets)
    return result


def host_states(result: RunResult, scope: list[str]) -> dict[str, str]:
    """Per host the run was meant for: unreachable, failed, not reached (no play ran for it, or
    Ansible stopped before its turn, or the run ended in error with no host to blame), changed
    (changes pending, in check mode) or ok (up to date)."""
    blamed = any(s.failed or s.unreachable for s in result.hosts.values())
    broken = (result.rc != 0 or result.status != "successful") and not blamed
    states = {}
    for host in scope:
        stats = result.hosts.get(host)
        if stats is not None and stats.unreachable:
            states[host] = "unreachable"
        elif stats is not None and stats.failed:
            states[host] = "failed"
        elif stats is None or broken or (result.aborted and host not in result.last_play_hosts):
            states[host] = "not reached"
        elif stats.changed:
            states[host] = "changes pending" if result.check else "changed"
        else:
            states[host] = "up to date" if result.check else "ok"
    return states


def plan_summary(result: RunResult) -> dict[str, list[str]]:
    """Per host, the tasks that would change."""
    per_host: dict[str, list[str]] = {h: [] for h in result.hosts}
    for item in result.changed_tasks:
        per_host.setdefault(item["host"], []).append(item["task"])
    return per_host


def diff_lines(diff: dict[str, Any]) -> list[str]:
    """One task's --diff as unified diff lines (Ansible's before/after form, or its prepared text)."""
    if diff.get("prepared"):
        return str(diff["prepared"]).splitlines()
    before, after = diff.get("before", ""), diff.get("after", "")
    if not isinstance(before, str) or not isinstance(after, str):
        before, after = json.dumps(before, indent=2, sort_keys=True), json.dumps(after, indent=2, sort_keys=True)
    return list(
        difflib.unified_diff(
            before.splitlines(), after.splitlines(),
            str(diff.get("before_header") or "before"), str(diff.get("after_header") or "after"), lineterm="",
        )
    )  # fmt: skip


def print_diffs(console: Console, result: RunResult, secrets: set[str]) -> None:
    """Each pending change's diff, per host and task, scrubbed of the inventory's secrets."""
    for change in result.changed_tasks:
        for diff in change.get("diff", []):
            console.print(f"--- {escape(change['host'])}: {escape(change['task'])}", highlight=False)
            for line in diff_lines(diff):
                style = "green" if line.startswith("+") else "red" if line.startswith("-") else None
                console.print(escape(redact_text(line, secrets)), style=style, highlight=False)


def print_result(console: Console, result: RunResult, title: str, show_diff: bool = False, secrets=()) -> None:
    if show_diff:
        print_diffs(console, result, set(secrets))
    console.print(summary_table(result, title))
    for host, messages in sorted(result.reports.items()):
        for message in messages:
            console.print(f"{escape(host)}: {escape(message)}", highlight=False)
    for failure in result.failures:
        where = f"{failure['host']}: " if failure["host"] else ""
        task = f"[{failure['task']}] " if failure["task"] else ""
        console.print(f"[red]FAILED[/] {escape(where + task + failure['message'])}", highlight=False)
    pending = plan_summary(result) if result.check else {}
    for host, state in sorted(result.host_states.items()):
        console.print(f"{escape(host)}: {state}", highlight=False)
        for task in pending.get(host, []):
            console.print(f"  ~ {task}", highlight=False, markup=False)
    console.print(f"run record: {result.record_dir}", highlight=False)
