"""`provision diag`: run the GPU peer-to-peer and NCCL diagnostic on every container
(and on the nodes, if asked) in parallel, show the verdicts and keep them with the run record.

The verdict is also stored on each target, with the context it holds in
(`/var/lib/provision/gpu-diag-last.json`; a verdict about P2P also in `gpu-diag.json`, where the
SGLang role reads it for `sglang_p2p: auto`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from provision import inventory as inventory_mod
from provision.job_events import task_outcomes
from provision.progress import LiveProgress
from provision.record import RunRecord
from provision.runner import RunResult, run_playbook

DIAG_TASK = "Run the GPU peer-to-peer diagnostic"


@dataclass
class DiagReport:
    results: dict[str, dict[str, Any]] = field(default_factory=dict)
    run: RunResult | None = None

    @property
    def healthy(self) -> bool:
        return (
            bool(self.results)
            and all(r.get("verdict") == "healthy" for r in self.results.values())
            and self.run is not None
            and self.run.succeeded
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "healthy": self.healthy,
            "results": self.results,
            "failures": self.run.failures if self.run else [],
            "record_dir": self.run.record_dir if self.run else "",
        }


def results_from_events(record_dir: Path) -> dict[str, dict[str, Any]]:
    """The diagnostic's JSON per host that ran it, read back from the run's job events."""
    results: dict[str, dict[str, Any]] = {}
    for host, outcome in task_outcomes(record_dir, DIAG_TASK).items():
        if outcome["event"] != "runner_on_ok":
            continue
        try:
            results[host] = json.loads(outcome["res"]["stdout"])
        except (KeyError, TypeError, ValueError):
            results[host] = {"verdict": "error", "reason": "the diagnostic printed no JSON"}
    return results


def diag(
    inventory: str,
    limit: str | None = None,
    include_hosts: bool = False,
    runs_dir: Path = Path(".provision/runs"),
    console: Console | None = None,
    host_key_checking: bool = True,
    vault: inventory_mod.VaultOptions | None = None,
) -> DiagReport:
    console = console or Console(stderr=True)
    inv = inventory_mod.load(inventory, vault, host_key_checking)
    targets = inventory_mod.GPU_CONTAINERS + (f":{inventory_mod.PROXMOX_HOSTS}" if include_hosts else "")
    with RunRecord(runs_dir, "diag", inv) as record:
        run = run_playbook(
            "diag.yml",
            inv.path,
            record=record,
            host_count=len(inv.hosts),
            limit=limit,
            extravars={"gpu_diag_targets": targets},
            host_key_checking=host_key_checking,
            vault=vault,
            progress=LiveProgress(console, f"provision diag --inventory {inventory}"),
        )
        report = DiagReport(results=record.redact(results_from_events(record.path)), run=run)
        for host, result in report.results.items():
            record.write_json(f"diag-{host}.json", result)
        record.write_summary({"command": "diag", "inventory": str(inv.path), **report.to_dict()})
    return report


def print_report(console: Console, report: DiagReport) -> None:
    table = Table(title="GPU peer-to-peer / NCCL diagnostic")
    for col in ("host", "verdict", "GPUs", "NCCL transport (P2P on / off)", "sglang_p2p", "reason"):
        table.add_column(col)
    for host, r in sorted(report.results.items()):
        tests = r.get("tests") or {}
        on = (tests.get("nccl_allreduce_p2p") or {}).get("transports") or []
        off = (tests.get("nccl_allreduce_p2p_disabled") or {}).get("transports") or []
        colour = "green" if r.get("verdict") == "healthy" else "red"
        table.add_row(
            host,
            f"[{colour}]{escape(str(r.get('verdict')))}[/]",
            str(r.get("gpu_count", "")),
            escape(f"{','.join(on) or '-'} / {','.join(off) or '-'}"),
            str(r.get("recommended_sglang_p2p") or "-"),
            escape(str(r.get("reason", ""))),
        )
    console.print(table)
    for failure in report.run.failures if report.run else []:
        console.print(f"[red]FAILED[/] {escape(failure['host'] + ': ' + failure['message'])}")
    if report.run:
        console.print(f"record: {escape(report.run.record_dir)}")
