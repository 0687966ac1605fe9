"""`provision diag`: run the GPU peer-to-peer and NCCL diagnostic on every container
(and on the nodes, if asked) in parallel, return the verdicts and keep them with the run record.

The verdict is also stored on each target, with the context it holds in
(`gpu-diag-last.json` in the host's `provision_state_dir`; a verdict about P2P also in `gpu-diag.json`,
where the SGLang role reads it for `sglang_p2p: auto`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from provision import inventory as inventory_mod
from provision.job_events import run_stats
from provision.progress import SILENT, Progress
from provision.record import DEFAULT_RUNS_DIR, RunRecord
from provision.runner import RunResult, run_playbook

# what roles/gpu_diag hands back (set_stats): {host: the diagnostic's verdict}
DIAG_STATS = "provision_gpu_diag"


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


def results_from_stats(record_dir: Path) -> dict[str, dict[str, Any]]:
    """The diagnostic's verdict per host that ran it, as the run's stats carry it (DIAG_STATS)."""
    verdicts = run_stats(record_dir).get(DIAG_STATS) or {}
    return {
        host: verdict if isinstance(verdict, dict) else {"verdict": "error", "reason": "the diagnostic printed no JSON"}
        for host, verdict in verdicts.items()
    }


def diag(
    inventory: str | inventory_mod.Inventory,
    limit: str | None = None,
    include_hosts: bool = False,
    runs_dir: Path = DEFAULT_RUNS_DIR,
    progress: Progress | None = None,
    host_key_checking: bool = True,
    vault: inventory_mod.VaultOptions | None = None,
) -> DiagReport:
    """Run playbooks/diag.yml on the containers (and with `include_hosts` the nodes), keep each verdict in the
    record (diag-<host>.json) and return them; `progress` hears the run as it goes (silent when left out)."""
    inv = inventory_mod.loaded(inventory, vault, host_key_checking)
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
            progress=(progress or SILENT).playbook(f"provision diag --inventory {inventory}"),
        )
        report = DiagReport(results=record.redact(results_from_stats(record.path)), run=run)
        for host, result in report.results.items():
            record.write_json(f"diag-{host}.json", result)
        record.write_summary({"command": "diag", "inventory": str(inv.path), **report.to_dict()})
    return report
