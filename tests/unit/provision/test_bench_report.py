"""Benchmark report: regression detection against the scenario's baseline, failed requests, charts."""

from __future__ import annotations

import copy
import json

from provision.bench_report import (
    above_limit,
    as_baseline,
    compare,
    levels_from_jsonl,
    missing_levels,
    render_charts,
    render_markdown,
    server_max_running_requests,
)
from tests.loaders import REPO

BASELINE = json.loads((REPO / "docs" / "baselines" / "scenario.json").read_text())
SCENARIO = {1: 108, 4: 286, 16: 873, 32: 1359, 64: 2327, 128: 2800}


def jsonl(throughputs: dict[int, float], completed: dict[int, int] | None = None, ttft_p99: float = 500.0) -> str:
    rows = []
    for c, tput in throughputs.items():
        rows.append(
            json.dumps(
                {
                    "max_concurrency": c,
                    "completed": (completed or {}).get(c, 3 * c),
                    "output_throughput": tput,
                    "total_throughput": tput * 2,
                    "request_throughput": c / 10,
                    "median_ttft_ms": 100.0,
                    "p99_ttft_ms": ttft_p99,
                    "median_itl_ms": 10.0,
                    "p99_itl_ms": 30.0,
                }
            )
        )
    return "\n".join(rows) + "\n"


SENT = {c: 3 * c for c in SCENARIO}


def test_scenario_figures_are_not_a_regression_of_themselves():
    levels = levels_from_jsonl(jsonl(SCENARIO), SENT)
    assert compare(levels, BASELINE) == []


def test_a_degraded_copy_is_flagged_level_by_level():
    degraded = {**SCENARIO, 32: 1359 * 0.85, 128: 2800 * 0.5, 4: 286 * 0.95}
    regressions = compare(levels_from_jsonl(jsonl(degraded), SENT), BASELINE)
    assert [(r.concurrency, r.metric) for r in regressions] == [(32, "output tok/s"), (128, "output tok/s")]
    assert regressions[1].describe() == "C=128: output tok/s 1,400.0 vs baseline 2,800.0 (-50%)"


def test_p99_ttft_rise_is_flagged_when_the_baseline_has_it():
    levels = levels_from_jsonl(jsonl(SCENARIO, ttft_p99=500.0), SENT)
    base = as_baseline(levels, {"sglang_version": "0.5.23"})
    worse = copy.deepcopy(base)
    worse["levels"]["16"]["p99_ttft_ms"] = 300.0  # the new run's 500 ms is 67% worse
    assert [(r.concurrency, r.metric) for r in compare(levels, worse)] == [(16, "p99 TTFT ms")]


def test_failed_requests_are_reported_not_averaged_away(tmp_path):
    completed = {c: 3 * c for c in SCENARIO} | {64: 150}
    levels = levels_from_jsonl(jsonl({c: t for c, t in SCENARIO.items() if c != 128}, completed), SENT)
    assert [lv.failed for lv in levels if lv.concurrency == 64] == [42]
    missing = missing_levels(levels, SENT)
    assert missing == [128]
    md = render_markdown(levels, {"host": "h"}, None, [], missing, {})
    assert "150 / 192 (**42 FAILED**)" in md
    assert "| 128 | - |" in md and "every request failed" in md


def test_charts_are_pngs(tmp_path):
    levels = levels_from_jsonl(jsonl(SCENARIO), SENT)
    charts = render_charts(levels, tmp_path, "test")
    for name in charts.values():
        assert (tmp_path / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_the_throughput_chart_draws_the_baseline_beside_the_run(tmp_path):
    levels = levels_from_jsonl(jsonl({c: t * 0.5 for c, t in SCENARIO.items()}), SENT)
    (tmp_path / "plain").mkdir()
    (tmp_path / "with").mkdir()
    render_charts(levels, tmp_path / "plain", "test")
    render_charts(levels, tmp_path / "with", "test", BASELINE)
    plain, drawn = ((tmp_path / d / "throughput.png").read_bytes() for d in ("plain", "with"))
    assert drawn != plain
    # the scenario's baseline has no TTFT: that chart is this run's alone
    assert (tmp_path / "with" / "ttft_p99.png").read_bytes() == (tmp_path / "plain" / "ttft_p99.png").read_bytes()


def test_server_limit_from_the_client_lines():
    lines = "\n".join(json.dumps({"max_concurrency": c, "server_info": {"max_running_requests": 48}}) for c in (1, 64))
    assert server_max_running_requests(lines) == 48
    assert server_max_running_requests('{"max_concurrency": 1}\n') is None
    assert above_limit([1, 4, 16, 32, 64, 128], 48) == [64, 128]
    assert above_limit([1, 128], None) == []
