"""`provision bench`: a throughput sweep with SGLang's own benchmark client on every container,
turned into a report people plan with.

1. Capacity (sessions that fit in the KV cache), for the report's top: `verify.capacity_report`, the probe of
   `provision verify` and `provision/capacity.py`, as `provision capacity` has it.
2. `playbooks/bench.yml` (role `sglang_bench`) runs the client once per concurrency level on the
   container and fetches its JSONL and a per-level summary into this run's record.
3. Per host: `report.md` with a table per level, two PNG charts, the P2P policy and SGLang
   version, failed requests counted as such, and the comparison with a baseline if one is given;
   `baseline.json` holds this run in the baseline format for next time.
"""

from __future__ import annotations

import importlib.util
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from provision import bench_report
from provision import inventory as inventory_mod
from provision.errors import UsageError
from provision.paths import module_util
from provision.progress import SILENT, Progress
from provision.record import DEFAULT_RUNS_DIR, RunRecord
from provision.runner import RunResult, run_playbook

BENCH_PLAYBOOK = "bench.yml"
DEFAULT_CONCURRENCY = (1, 4, 16, 32, 64, 128)


@dataclass
class BenchOptions:
    inventory: str | inventory_mod.Inventory  # as ApplyOptions.inventory
    concurrency: tuple[int, ...] = DEFAULT_CONCURRENCY
    input_len: int = 1024
    output_len: int = 1024
    prompts_per_level: int = 10  # multiple of the concurrency: num_prompts = this x C
    baseline: Path | None = None
    threshold: float = bench_report.DEFAULT_THRESHOLD
    # the client on each gateway, against it, instead of on each container against its own server
    through_gateway: bool = False
    limit: str | None = None
    runs_dir: Path = DEFAULT_RUNS_DIR
    host_key_checking: bool = True
    vault: inventory_mod.VaultOptions = field(default_factory=inventory_mod.VaultOptions)


@dataclass
class HostBench:
    host: str
    levels: list[bench_report.Level] = field(default_factory=list)
    missing: list[int] = field(default_factory=list)
    regressions: list[bench_report.Regression] = field(default_factory=list)
    meta: dict[str, Any] = field(default_factory=dict)
    capacity: str | None = None
    report: str = ""
    problems: list[str] = field(default_factory=list)
    mismatches: list[str] = field(default_factory=list)
    # prompts each level sent, as the role recorded them (levels.json)
    sent_per_level: dict[int, int] = field(default_factory=dict)
    # the server's limit on requests run at once (server_info in the client's lines), and the levels above it
    max_running_requests: int | None = None
    above_limit: list[int] = field(default_factory=list)

    @property
    def failed_requests(self) -> int:
        return sum(lv.failed for lv in self.levels) + sum(self.sent_per_level.get(c, 0) for c in self.missing)

    def to_dict(self) -> dict[str, Any]:
        return {
            "host": self.host,
            "report": self.report,
            "capacity": self.capacity,
            "failed_requests": self.failed_requests,
            "problems": self.problems,
            "baseline_mismatches": self.mismatches,
            "missing_levels": self.missing,
            "max_running_requests": self.max_running_requests,
            "levels_above_max_running_requests": self.above_limit,
            "regressions": [r.describe() for r in self.regressions],
            "levels": [{**lv.__dict__, "failed": lv.failed} for lv in self.levels],
        }


@dataclass
class BenchResult:
    hosts: dict[str, HostBench] = field(default_factory=dict)
    run: RunResult | None = None
    record_dir: str = ""

    @property
    def regressed(self) -> bool:
        return any(h.regressions for h in self.hosts.values())

    @property
    def complete(self) -> bool:
        """Every host measured every level, with no failed request, and the run itself succeeded."""
        return (
            bool(self.hosts)
            and self.run is not None
            and self.run.succeeded
            and all(not h.problems and not h.failed_requests and h.levels for h in self.hosts.values())
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "complete": self.complete,
            "regressed": self.regressed,
            "record_dir": self.record_dir,
            "hosts": {name: h.to_dict() for name, h in sorted(self.hosts.items())},
            "failures": self.run.failures if self.run else [],
        }


def parse_concurrency(text: str) -> tuple[int, ...]:
    try:
        levels = tuple(int(part) for part in text.split(",") if part.strip())
    except ValueError:
        raise UsageError(f"--concurrency {text!r}: expected comma-separated whole numbers, e.g. 1,4,16") from None
    if not levels or any(c < 1 for c in levels):
        raise UsageError(f"--concurrency {text!r}: every level must be 1 or more")
    if len(set(levels)) != len(levels):
        raise UsageError(f"--concurrency {text!r}: a level is listed twice")
    return levels


def load_baseline(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text())
    except OSError as exc:
        raise UsageError(f"--baseline {path}: cannot read it: {exc.strerror}") from None
    except ValueError as exc:
        raise UsageError(f"--baseline {path}: not valid JSON: {exc}") from None
    levels = data.get("levels") if isinstance(data, dict) else None
    if not isinstance(levels, dict) or not levels:
        raise UsageError(f'--baseline {path}: no "levels" object (concurrency -> output_throughput, p99_ttft_ms)')
    for key, value in levels.items():
        if not key.isdigit() or not isinstance(value, dict):
            raise UsageError(f'--baseline {path}: levels["{key}"] must be a concurrency with an object of figures')
    return data


def _validate(opts: BenchOptions) -> None:
    for name in ("input_len", "output_len", "prompts_per_level"):
        if getattr(opts, name) < 1:
            raise UsageError(f"--{name.replace('_', '-')} must be 1 or more (got {getattr(opts, name)})")
    if not 0 < opts.threshold < 1:
        raise UsageError(f"--threshold must be between 0 and 1 (got {opts.threshold})")
    if importlib.util.find_spec("matplotlib") is None:
        raise UsageError(
            "bench draws its report's charts with matplotlib, which is not installed: "
            "pip install 'provision-pve-sglang[charts]'"
        )


def _extravars(opts: BenchOptions, run_id: str, fetch_dir: Path) -> dict[str, Any]:
    return {
        "sglang_bench_concurrency": list(opts.concurrency),
        "sglang_bench_input_len": opts.input_len,
        "sglang_bench_output_len": opts.output_len,
        "sglang_bench_prompts_per_concurrency": opts.prompts_per_level,
        "sglang_bench_run_id": run_id,
        "sglang_bench_controller_dir": str(fetch_dir),
        "sglang_bench_hosts": inventory_mod.SGLANG_GATEWAYS if opts.through_gateway else inventory_mod.GPU_CONTAINERS,
    }


COMPARED_SETTINGS = ("sglang_version", "p2p_policy", "input_len", "output_len", "dataset")


def baseline_mismatches(meta: dict[str, Any], baseline: dict[str, Any]) -> list[str]:
    """Settings the baseline records that differ from this run's: its figures may not compare."""
    return [
        f"baseline {key} is {baseline[key]!r}, this run's is {meta.get(key)!r}"
        for key in COMPARED_SETTINGS
        if key in baseline and meta.get(key) is not None and str(baseline[key]) != str(meta.get(key))
    ]


def _capacity(opts: BenchOptions, progress: Progress) -> dict[str, str]:
    from provision import verify

    # capacity is the containers' (a node is read only as a container's node), and a gateway's their sum
    limit = opts.limit or inventory_mod.GPU_CONTAINERS
    if opts.through_gateway:  # the gateways, and every container, whose capacities a gateway's sums
        limit = f"{opts.limit or inventory_mod.SGLANG_GATEWAYS}:{inventory_mod.GPU_CONTAINERS}"
    report = verify.capacity_report(
        opts.inventory,
        limit=limit,
        runs_dir=opts.runs_dir,
        host_key_checking=opts.host_key_checking,
        vault=opts.vault,
        progress=progress,
    )
    found = {host: cap["summary"] for host, cap in report.capacity.items()}
    return found | {host: cap["summary"] for host, cap in report.fleet_capacity.items()}


def build_host_report(
    host_dir: Path, opts: BenchOptions, baseline: dict[str, Any] | None, capacity: str | None
) -> HostBench:
    """Read what the role fetched for one host and write report.md, the charts and baseline.json."""
    hb = HostBench(host=host_dir.name, capacity=capacity)
    summary = _read_summary(host_dir / "levels.json", hb.problems)
    if summary is None:
        return hb
    hb.meta = {**summary, "host": hb.host}
    hb.sent_per_level = {int(lv["concurrency"]): int(lv["prompts"]) for lv in summary.get("levels", [])}
    _read_levels(hb, host_dir / "results.jsonl")
    hb.problems += _left_out(summary.get("results_dropped_lines", []))  # left out on the container already
    hb.problems += _client_failures(summary)
    if baseline is not None:
        hb.meta["baseline"] = str(opts.baseline)
        hb.regressions = bench_report.compare(hb.levels, baseline, opts.threshold)
        hb.mismatches = baseline_mismatches(hb.meta, baseline)
    _write_host_report(hb, host_dir, baseline, summary.get("note") or None)
    return hb


def _read_summary(summary_file: Path, problems: list[str]) -> dict[str, Any] | None:
    """The role's levels.json, or None with the reason added to `problems`."""
    if not summary_file.is_file():
        problems.append("the benchmark wrote no summary (levels.json): the run stopped before the sweep")
        return None
    try:
        return json.loads(summary_file.read_text())
    except ValueError:
        problems.append("the benchmark's summary (levels.json) is not JSON: the run stopped while writing it")
        return None


def _read_levels(hb: HostBench, results_file: Path) -> None:
    """The client's results.jsonl (rewritten without its lines that are not JSON) as hb's levels."""
    sent = hb.sent_per_level
    text = results_file.read_text(errors="replace") if results_file.is_file() else ""
    if text:
        text, bad = module_util("bench_results").scrub_jsonl(text)
        results_file.write_text(text)
        hb.problems += _left_out(bad)
    hb.levels = bench_report.levels_from_jsonl(text, sent)
    hb.missing = bench_report.missing_levels(hb.levels, sent)
    hb.max_running_requests = bench_report.server_max_running_requests(text)
    hb.above_limit = bench_report.above_limit(list(sent), hb.max_running_requests)


def _left_out(lines: list[int]) -> list[str]:
    return [f"results.jsonl line {n} is not JSON (cut short?): left out" for n in lines]


def _client_failures(summary: dict[str, Any]) -> list[str]:
    """A line per level whose benchmark client failed or timed out, with the end of its output."""
    problems = []
    for lv in summary.get("levels", []):
        if lv.get("rc"):
            why = "timed out" if lv.get("timed_out") else f"exited {lv['rc']}"
            tail = " | ".join(lv.get("output_tail") or [])[-300:]
            problems.append(f"C={lv['concurrency']}: the benchmark client {why}: {tail}")
    return problems


def _write_host_report(hb: HostBench, host_dir: Path, baseline: dict[str, Any] | None, note: str | None) -> None:
    """report.md (with its charts) and baseline.json in host_dir."""
    charts = bench_report.render_charts(hb.levels, host_dir, hb.host, baseline, hb.meta) if hb.levels else {}
    markdown = bench_report.render_markdown(
        hb.levels, hb.meta, hb.capacity, hb.regressions, hb.missing, charts, note, hb.max_running_requests, baseline
    )
    if hb.mismatches:
        markdown += "\n## Not like with like\n\n" + "\n".join(f"- {m}" for m in hb.mismatches) + "\n"
    if hb.problems:
        markdown += "\n## Problems\n\n" + "\n".join(f"- {p}" for p in hb.problems) + "\n"
    report = host_dir / "report.md"
    report.write_text(markdown)
    hb.report = str(report)
    keys = ("host", "sglang_version", "p2p_policy", "input_len", "output_len", "dataset", "gateway", "workers")
    meta = {k: hb.meta.get(k) for k in keys}
    (host_dir / "baseline.json").write_text(json.dumps(bench_report.as_baseline(hb.levels, meta), indent=2) + "\n")


def bench(opts: BenchOptions, progress: Progress | None = None) -> BenchResult:
    """Capacity, the sweep, and per host the report, charts and baseline (module doc); `progress` hears the runs
    as they go (silent when left out)."""
    progress = progress or SILENT
    _validate(opts)
    baseline = load_baseline(opts.baseline) if opts.baseline else None
    inv = inventory_mod.loaded(opts.inventory, opts.vault, opts.host_key_checking)
    if not inv.gpu_containers:
        raise UsageError(f"{inv.path}: no hosts in group gpu_containers: nothing to benchmark")
    if opts.through_gateway and not inv.gateways:
        raise UsageError(f"--through-gateway: {inv.path} has no hosts in group {inventory_mod.SGLANG_GATEWAYS}")
    with RunRecord(opts.runs_dir, "bench", inv) as record:
        progress.note("collecting capacity (provision verify, capacity check)...")
        capacity = _capacity(opts, progress)
        fetch_dir = record.path / "hosts"
        run = run_playbook(
            BENCH_PLAYBOOK,
            inv.path,
            record=record,
            host_count=len(inv.hosts),
            limit=opts.limit,
            extravars=_extravars(opts, record.name, fetch_dir.resolve()),
            host_key_checking=opts.host_key_checking,
            vault=opts.vault,
            progress=progress.playbook(f"provision bench --inventory {opts.inventory}"),
        )
        result = BenchResult(run=run, record_dir=str(record.path))
        for host_dir in sorted(p for p in fetch_dir.glob("*") if p.is_dir()):
            hb = build_host_report(host_dir, opts, baseline, capacity.get(host_dir.name))
            hb.problems = record.redact(hb.problems)  # the client's output tails
            result.hosts[host_dir.name] = hb
        record.write_summary({"command": "bench", "inventory": str(inv.path), **result.to_dict()})
    return result
