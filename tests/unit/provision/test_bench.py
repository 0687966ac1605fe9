"""`provision bench` on the controller: flags, baselines, the per-host report from what the role fetched."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from provision import bench, cli
from provision.errors import EXIT_FAILED, EXIT_OK, EXIT_REGRESSION, EXIT_USAGE, UsageError
from tests.loaders import REPO

SCENARIO_BASELINE = REPO / "docs" / "baselines" / "scenario.json"


def row(c: int, completed: int, tput: float, api_key: str = "sk-lab-0123456789") -> dict:
    return {
        "max_concurrency": c,
        "completed": completed,
        "output_throughput": tput,
        "total_throughput": tput * 2,
        "request_throughput": c / 5,
        "median_ttft_ms": 50.0,
        "p99_ttft_ms": 90.0,
        "median_itl_ms": 8.0,
        "p99_itl_ms": 20.0,
        "server_info": {"api_key": api_key, "admin_api_key": None, "version": "0.5.23"},
    }


def fetched(tmp_path: Path, rows: list[dict], levels: list[dict], host: str = "sglang-01") -> Path:
    host_dir = tmp_path / host
    host_dir.mkdir()
    (host_dir / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (host_dir / "levels.json").write_text(
        json.dumps(
            {
                "host": host,
                "client_module": "sglang.benchmark.serving",
                "sglang_version": "0.5.23",
                "p2p_policy": "off",
                "p2p_reason": "iommu translating",
                "tp_size": 2,
                "dataset": "random-ids",
                "input_len": 1024,
                "output_len": 1024,
                "note": "",
                "levels": levels,
            }
        )
    )
    return host_dir


def level(c: int, rc: int = 0, k: int = 2, tail: list[str] | None = None) -> dict:
    return {"concurrency": c, "prompts": k * c, "rc": rc, "timed_out": rc == 124, "output_tail": tail or []}


@pytest.mark.parametrize("text", ["1,x", "0,4", "", "4,4", "-1"])
def test_bad_concurrency_lists_are_refused(text):
    with pytest.raises(UsageError, match="--concurrency"):
        bench.parse_concurrency(text)


def test_concurrency_keeps_the_given_order():
    assert bench.parse_concurrency("1, 4,16,128") == (1, 4, 16, 128)


def test_the_scenario_baseline_loads(tmp_path):
    data = bench.load_baseline(SCENARIO_BASELINE)
    assert data["levels"]["128"]["output_throughput"] == 2800


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("{not json", "not valid JSON"),
        ('{"levels": {}}', 'no "levels"'),
        ('{"levels": {"C1": {}}}', 'levels\\["C1"\\]'),
    ],
)
def test_a_bad_baseline_names_the_file(tmp_path, content, message):
    path = tmp_path / "base.json"
    path.write_text(content)
    with pytest.raises(UsageError, match=f"{path}.*{message}"):
        bench.load_baseline(path)


def test_report_from_fetched_results(tmp_path):
    host_dir = fetched(tmp_path, [row(1, 2, 100.0), row(4, 8, 300.0)], [level(1), level(4)])
    opts = bench.BenchOptions(inventory="x", concurrency=(1, 4), prompts_per_level=2)
    hb = bench.build_host_report(host_dir, opts, None, "24 concurrent 32K-token sessions")
    assert [lv.concurrency for lv in hb.levels] == [1, 4] and hb.failed_requests == 0 and not hb.problems
    md = (host_dir / "report.md").read_text()
    assert md.index("**Capacity:** 24 concurrent 32K-token sessions") < md.index("| concurrency |")
    assert "SGLang 0.5.23, P2P policy `off`" in md and "| 4 | 300.0 | 600.0 |" in md
    for png in ("throughput.png", "ttft_p99.png"):
        assert (host_dir / png).read_bytes()[:4] == b"\x89PNG" and f"]({png})" in md
    saved = json.loads((host_dir / "baseline.json").read_text())
    assert saved["levels"]["4"] == {"output_throughput": 300.0, "p99_ttft_ms": 90.0}
    assert saved["p2p_policy"] == "off"


def test_the_server_api_key_is_taken_out_of_the_results(tmp_path):
    host_dir = fetched(tmp_path, [row(1, 2, 100.0, api_key="sk-very-secret-key")], [level(1)])
    bench.build_host_report(
        host_dir, bench.BenchOptions(inventory="x", concurrency=(1,), prompts_per_level=2), None, None
    )
    text = (host_dir / "results.jsonl").read_text()
    assert "sk-very-secret-key" not in text and json.loads(text)["server_info"]["api_key"] == "<redacted>"


def test_failed_requests_and_dead_levels_are_reported(tmp_path):
    rows = [row(1, 2, 100.0), row(4, 5, 250.0)]  # C=4 sent 8, 3 failed; C=16: no line at all
    levels = [level(1), level(4), level(16, rc=1, tail=["ClientConnectorError: Cannot connect"])]
    host_dir = fetched(tmp_path, rows, levels)
    opts = bench.BenchOptions(inventory="x", concurrency=(1, 4, 16), prompts_per_level=2)
    hb = bench.build_host_report(host_dir, opts, None, None)
    assert hb.missing == [16] and hb.failed_requests == 3 + 32
    assert hb.problems == ["C=16: the benchmark client exited 1: ClientConnectorError: Cannot connect"]
    md = (host_dir / "report.md").read_text()
    assert "5 / 8 (**3 FAILED**)" in md and "| 16 | - |" in md and "Cannot connect" in md
    result = bench.BenchResult(hosts={"sglang-01": hb})
    assert not result.complete


def test_regression_against_the_scenario_baseline(tmp_path):
    k = 2
    rows = [row(c, k * c, t) for c, t in ((1, 108.0), (4, 286.0), (16, 873.0 * 0.6))]
    host_dir = fetched(tmp_path, rows, [level(c, k=k) for c in (1, 4, 16)])
    opts = bench.BenchOptions(inventory="x", concurrency=(1, 4, 16), prompts_per_level=k, baseline=SCENARIO_BASELINE)
    hb = bench.build_host_report(host_dir, opts, bench.load_baseline(SCENARIO_BASELINE), None)
    assert [r.concurrency for r in hb.regressions] == [16]
    assert "## Regressions against the baseline" in (host_dir / "report.md").read_text()
    assert hb.mismatches == []  # the scenario's baseline: 0.5.23, P2P off, like this run


def test_a_baseline_from_other_settings_is_called_out(tmp_path):
    host_dir = fetched(tmp_path, [row(1, 2, 100.0)], [level(1)])
    base = {
        "sglang_version": "0.5.22",
        "p2p_policy": "off",
        "input_len": 1024,
        "levels": {"1": {"output_throughput": 100}},
    }
    opts = bench.BenchOptions(inventory="x", concurrency=(1,), prompts_per_level=2, baseline=Path("b.json"))
    hb = bench.build_host_report(host_dir, opts, base, None)
    assert hb.mismatches == ["baseline sglang_version is '0.5.22', this run's is '0.5.23'"]
    assert "## Not like with like" in (host_dir / "report.md").read_text()


def test_no_summary_means_the_sweep_never_ran(tmp_path):
    (tmp_path / "sglang-01").mkdir()
    hb = bench.build_host_report(tmp_path / "sglang-01", bench.BenchOptions(inventory="x"), None, None)
    assert hb.problems and not hb.report


@pytest.mark.parametrize(
    ("regressed", "complete", "code"),
    [(False, True, EXIT_OK), (False, False, EXIT_FAILED), (True, True, EXIT_REGRESSION)],
)
def test_exit_code_says_whether_a_regression_was_found(monkeypatch, regressed, complete, code):
    class Result(bench.BenchResult):
        pass

    Result.regressed = property(lambda self: regressed)
    Result.complete = property(lambda self: complete)
    monkeypatch.setattr(bench, "bench", lambda opts, progress=None: Result())
    assert cli.main(["bench", "--inventory", "prod", "--json"]) == code


def test_bad_flags_fail_before_anything_is_contacted(tmp_path, capsys):
    assert cli.main(["bench", "--inventory", "prod", "--concurrency", "1,zero"]) == EXIT_USAGE
    missing = tmp_path / "nope.json"
    assert cli.main(["bench", "--inventory", "prod", "--baseline", str(missing)]) == EXIT_USAGE
    assert f"--baseline {missing}: cannot read it" in capsys.readouterr().err


def test_without_the_charts_extra_bench_names_it_before_anything_is_contacted(monkeypatch, capsys):
    real_find_spec = bench.importlib.util.find_spec
    monkeypatch.setattr(
        bench.importlib.util, "find_spec", lambda name, *a: None if name == "matplotlib" else real_find_spec(name, *a)
    )
    assert cli.main(["bench", "--inventory", "example"]) == EXIT_USAGE
    err = capsys.readouterr().err
    assert "pip install 'provision-pve-sglang[charts]'" in err and len(err.strip().splitlines()) == 1, err


def test_levels_above_the_servers_max_running_requests_are_flagged(tmp_path):
    # the client copies /server_info into each line; internal_states carries the scheduler's own limit
    # (for the scenario's Qwen3.5 at tp=2, the hybrid state pool caps it well below the sweep's top levels)
    limited = [
        {
            **row(c, 2 * c, 100.0 * c),
            "server_info": {
                "max_running_requests": None,
                "internal_states": [{"effective_max_running_requests_per_dp": 22}],
            },
        }
        for c in (16, 32, 64)
    ]
    host_dir = fetched(tmp_path, limited, [level(16), level(32), level(64)])
    opts = bench.BenchOptions(inventory="x", concurrency=(16, 32, 64), prompts_per_level=2)
    hb = bench.build_host_report(host_dir, opts, None, None)
    assert (hb.max_running_requests, hb.above_limit) == (22, [32, 64])
    assert hb.to_dict()["levels_above_max_running_requests"] == [32, 64]
    md = (host_dir / "report.md").read_text()
    assert "max_running_requests = 22, so at C=32, C=64 the requests beyond it wait" in md
    assert "| 32 (> limit) |" in md and "| 16 | 1,600.0 |" in md


def test_an_unknown_limit_is_said_not_assumed(tmp_path):
    host_dir = fetched(tmp_path, [row(1, 2, 100.0)], [level(1)])  # server_info without the limit
    hb = bench.build_host_report(host_dir, bench.BenchOptions(inventory="x", concurrency=(1,)), None, None)
    assert hb.max_running_requests is None and hb.above_limit == []
    assert "max_running_requests is unknown" in (host_dir / "report.md").read_text()
