"""Benchmark results from SGLang's own client (`sglang.bench_serving` JSONL), as tables, charts and a
baseline comparison.

Each JSONL line is one concurrency level (sglang-nccl.md §2.2): `max_concurrency`, `completed`,
`output_throughput`, `total_throughput`, `request_throughput`, `{median,p99}_{ttft,itl}_ms`, ...
There is no `failed` key: failures are the prompts sent minus `completed`. The client also copies the
server's /server_info into each line (benchmark/serving.py), which carries the server's limit on
requests run at once: levels above it measure queueing, not more parallel work, and are flagged.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from provision.capacity import effective_max_running_requests

DEFAULT_THRESHOLD = 0.10  # a 10% drop in throughput, or rise in p99 TTFT, is a regression


@dataclass
class Level:
    concurrency: int
    sent: int
    completed: int
    output_throughput: float
    total_throughput: float
    request_throughput: float
    median_ttft_ms: float | None
    p99_ttft_ms: float | None
    median_itl_ms: float | None
    p99_itl_ms: float | None

    @property
    def failed(self) -> int:
        return self.sent - self.completed


def levels_from_jsonl(text: str, prompts_per_level: dict[int, int]) -> list[Level]:
    """One Level per JSONL line; `prompts_per_level` says how many prompts each concurrency sent."""
    levels = []
    for line in text.splitlines():
        if not line.strip():
            continue
        row = json.loads(line)
        c = int(row.get("max_concurrency") or row.get("concurrency") or 0)
        levels.append(
            Level(
                concurrency=c,
                sent=int(prompts_per_level.get(c, row.get("completed", 0))),
                completed=int(row.get("completed", 0)),
                output_throughput=float(row.get("output_throughput", 0.0)),
                total_throughput=float(row.get("total_throughput", 0.0)),
                request_throughput=float(row.get("request_throughput", 0.0)),
                median_ttft_ms=row.get("median_ttft_ms"),
                p99_ttft_ms=row.get("p99_ttft_ms"),
                median_itl_ms=row.get("median_itl_ms"),
                p99_itl_ms=row.get("p99_itl_ms"),
            )
        )
    return sorted(levels, key=lambda lv: lv.concurrency)


def missing_levels(levels: list[Level], prompts_per_level: dict[int, int]) -> list[int]:
    """Levels where no request succeeded: SGLang's client writes no line for them."""
    seen = {lv.concurrency for lv in levels}
    return sorted(c for c in prompts_per_level if c not in seen)


def server_max_running_requests(text: str) -> int | None:
    """The server's max_running_requests, from the first JSONL line whose server_info has one."""
    for line in text.splitlines():
        info = json.loads(line).get("server_info") if line.strip() else None
        limit = effective_max_running_requests(info) if isinstance(info, dict) else None
        if limit:
            return limit
    return None


def above_limit(levels: list[int], limit: int | None) -> list[int]:
    """Concurrency levels the server cannot run at once: the excess requests wait in its queue."""
    return sorted(c for c in levels if limit and c > limit)


@dataclass
class Regression:
    concurrency: int
    metric: str
    baseline: float
    measured: float
    change: float  # relative, signed

    def describe(self) -> str:
        return (
            f"C={self.concurrency}: {self.metric} {self.measured:,.1f} vs baseline {self.baseline:,.1f} "
            f"({self.change:+.0%})"
        )


def compare(levels: list[Level], baseline: dict[str, Any], threshold: float = DEFAULT_THRESHOLD) -> list[Regression]:
    """Throughput that fell, or p99 TTFT that rose, by more than `threshold`, level by level."""
    found = []
    base_levels = baseline.get("levels", {})
    for lv in levels:
        base = base_levels.get(str(lv.concurrency))
        if not base:
            continue
        if base.get("output_throughput"):
            change = lv.output_throughput / base["output_throughput"] - 1
            if change < -threshold:
                found.append(
                    Regression(lv.concurrency, "output tok/s", base["output_throughput"], lv.output_throughput, change)
                )
        if base.get("p99_ttft_ms") and lv.p99_ttft_ms is not None:
            change = lv.p99_ttft_ms / base["p99_ttft_ms"] - 1
            if change > threshold:
                found.append(Regression(lv.concurrency, "p99 TTFT ms", base["p99_ttft_ms"], lv.p99_ttft_ms, change))
    return found


def as_baseline(levels: list[Level], meta: dict[str, Any]) -> dict[str, Any]:
    """This run, in the baseline format, for `--baseline` next time."""
    return {
        **meta,
        "levels": {
            str(lv.concurrency): {"output_throughput": lv.output_throughput, "p99_ttft_ms": lv.p99_ttft_ms}
            for lv in levels
        },
    }


def format_ms(value: float | None) -> str:
    return "-" if value is None else f"{value:,.1f}"


def render_markdown(
    levels: list[Level],
    meta: dict[str, Any],
    capacity: str | None,
    regressions: list[Regression],
    missing: list[int],
    charts: dict[str, str],
    note: str | None = None,
    max_running: int | None = None,
    baseline: dict[str, Any] | None = None,
) -> str:
    lines = [f"# Throughput sweep: {meta.get('host', '')}", ""]
    if note:
        lines += [f"> **{note}**", ""]
    if capacity:
        lines += [f"**Capacity:** {capacity}", ""]
    lines += _limit_lines([lv.concurrency for lv in levels], max_running)
    if meta.get("gateway"):
        workers = meta.get("workers") or []
        served = f"- through the gateway ({meta['gateway']}) in front of {len(workers)} worker(s): {', '.join(workers)}"
    else:
        served = f"- SGLang {meta.get('sglang_version', '?')}, P2P policy `{meta.get('p2p_policy', '?')}`"
    lines += [
        f"{served}, client `{meta.get('client_module', '?')}`",
        f"- input {meta.get('input_len')} tokens, output {meta.get('output_len')} tokens "
        f"(fixed: --random-range-ratio 1), dataset `{meta.get('dataset')}`",
        "",
        "| concurrency | output tok/s | total tok/s | req/s | TTFT median ms | TTFT p99 ms "
        "| ITL median ms | ITL p99 ms | completed / sent |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    over = set(above_limit([lv.concurrency for lv in levels], max_running))
    for lv in levels:
        done = f"{lv.completed} / {lv.sent}" + (f" (**{lv.failed} FAILED**)" if lv.failed else "")
        c = f"{lv.concurrency} (> limit)" if lv.concurrency in over else str(lv.concurrency)
        lines.append(
            f"| {c} | {lv.output_throughput:,.1f} | {lv.total_throughput:,.1f} "
            f"| {lv.request_throughput:,.2f} | {format_ms(lv.median_ttft_ms)} | {format_ms(lv.p99_ttft_ms)} "
            f"| {format_ms(lv.median_itl_ms)} | {format_ms(lv.p99_itl_ms)} | {done} |"
        )
    for c in missing:
        lines.append(f"| {c} | - | - | - | - | - | - | - | **0 completed: every request failed** |")
    lines.append("")
    lines += scaling_lines(levels, meta, baseline)
    if regressions:
        lines += ["## Regressions against the baseline", ""] + [f"- {r.describe()}" for r in regressions] + [""]
    elif meta.get("baseline"):
        lines += [f"No regression against `{meta['baseline']}`.", ""]
    for title, path in charts.items():
        lines += [f"![{title}]({path})", ""]
    return "\n".join(lines)


def workers_label(meta: dict[str, Any] | None) -> str:
    """'2 workers' for a run through a gateway (its `workers`), else ''."""
    workers = (meta or {}).get("workers")
    if not (meta or {}).get("gateway") or not workers:
        return ""
    return f"{len(workers)} worker" + ("s" if len(workers) != 1 else "")


def scaling_lines(levels: list[Level], meta: dict[str, Any], baseline: dict[str, Any] | None) -> list[str]:
    """Through a gateway, against a baseline through a gateway with another number of workers: each level's output
    throughput at both, and their ratio."""
    now, then = workers_label(meta), workers_label(baseline)
    if not now or not then or now == then:
        return []
    base = (baseline or {}).get("levels", {})
    lines = [f"## Throughput against the number of workers ({then}, then {now})", ""]
    lines += [f"| concurrency | output tok/s, {then} | output tok/s, {now} | ratio |", "|---:|---:|---:|---:|"]
    for lv in levels:
        before = (base.get(str(lv.concurrency)) or {}).get("output_throughput")
        ratio = f"{lv.output_throughput / before:.2f}x" if before else "-"
        shown = f"{before:,.1f}" if before is not None else "-"
        lines.append(f"| {lv.concurrency} | {shown} | {lv.output_throughput:,.1f} | {ratio} |")
    return [*lines, ""]


def _limit_lines(levels: list[int], max_running: int | None) -> list[str]:
    if max_running is None:
        return ["The server's max_running_requests is unknown (no server_info in the client's lines).", ""]
    over = above_limit(levels, max_running)
    if not over:
        return [f"Server limit: max_running_requests = {max_running:,}; every level is within it.", ""]
    named = ", ".join(f"C={c}" for c in over)
    text = (
        f"**Above the server's limit:** max_running_requests = {max_running:,}, so at {named} the requests "
        "beyond it wait in the server's queue: those levels measure queueing, not more parallel work."
    )
    return [text, ""]


def render_charts(
    levels: list[Level],
    out_dir: Path,
    title: str,
    baseline: dict[str, Any] | None = None,
    meta: dict[str, Any] | None = None,
) -> dict[str, str]:
    """Two PNGs: throughput against concurrency, and p99 TTFT against concurrency; with a baseline,
    its figures for the same levels are drawn beside this run's."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    xs = [lv.concurrency for lv in levels]
    base_levels = (baseline or {}).get("levels", {})
    charts = {}
    now, then = workers_label(meta), workers_label(baseline)
    for name, key, label in (
        ("throughput.png", "output_throughput", "output tokens/s"),
        ("ttft_p99.png", "p99_ttft_ms", "p99 time to first token (ms)"),
    ):
        fig, ax = plt.subplots(figsize=(7, 4.2), dpi=110)
        ys = [getattr(lv, key) or 0 for lv in levels]
        ax.plot(xs, ys, marker="o", label=", ".join(filter(None, ["this run", now])))
        base = [(c, base_levels[str(c)][key]) for c in xs if base_levels.get(str(c), {}).get(key) is not None]
        if base:
            said = ", ".join(filter(None, ["baseline", then]))
            ax.plot(*zip(*base, strict=True), marker="s", linestyle="--", color="grey", label=said)
            ax.legend()
        ax.set_xscale("log", base=2)
        ax.set_xticks(xs, [str(x) for x in xs])
        ax.set_xlabel("concurrency (parallel requests)")
        ax.set_ylabel(label)
        ax.set_title(f"{title}: {label}")
        ax.grid(True, alpha=0.3)
        fig.tight_layout()
        fig.savefig(out_dir / name)
        plt.close(fig)
        charts[label] = name
    return charts
