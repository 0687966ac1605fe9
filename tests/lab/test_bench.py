"""`provision bench` against the lab: SGLang's real benchmark client (the sglang wheel and what its
benchmark module imports, installed offline into the container) against the stand-in server, with
the tokenizer made locally. The figures mean nothing; every step of the pipeline runs for real."""

from __future__ import annotations

import json
import subprocess
import threading
import time
from pathlib import Path

import pytest

from provision.lab import wheelhouse
from tests.conftest import run_provision
from tests.lab.common import apply, restart_and_wait_ready, set_host_vars

LAB_CHANGES = {"kernel", "gpu", "sglang", "ct"}  # tests/lab/conftest.py
LAB_NODES = "nspawn"  # no bootloader, no kernel line changed: nodes as nspawn containers (docs/lab.md)

API_KEY = "bench-key-" + "5be1c0de"
# the service listens on IPv6 loopback here: readiness, the bench client and the fault window reach it on [::1]
KEY = {
    "sglang_api_key": "{{ lookup('ansible.builtin.env', 'SGLANG_API_KEY') }}",
    "sglang_p2p": "off",
    "sglang_host": "::1",
}
ENV = {"SGLANG_API_KEY": API_KEY}
LEVELS = (1, 4, 8)
K = 2  # prompts per level, times the concurrency


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    return tmp_path_factory.mktemp("bench-runs")


@pytest.fixture(scope="module")
def converged(lab, lab_inventory, runs):
    set_host_vars(lab_inventory, "sglang-01", KEY)
    rc, _, err = apply(lab_inventory, runs, env=ENV)
    assert rc == 0, err[-3000:]
    yield lab_inventory
    set_host_vars(lab_inventory, "sglang-01", None)


def bench(inventory: Path, runs: Path, *extra: str):
    proc = run_provision(
        "bench",
        "--inventory",
        str(inventory),
        "--json",
        "--runs-dir",
        str(runs),
        "--input-len",
        "64",
        "--output-len",
        "16",
        "--prompts-per-level",
        str(K),
        *extra,
        env=ENV,
        timeout=1800,
    )
    return proc.returncode, json.loads(proc.stdout)["result"] if proc.stdout.strip() else {}, proc.stderr


@pytest.fixture(scope="module")
def sweep(converged, runs):
    rc, report, err = bench(converged, runs, "--concurrency", ",".join(map(str, LEVELS)))
    return {"rc": rc, "report": report, "err": err}


def test_sweep_runs_every_level_with_the_real_client(sweep):
    assert sweep["rc"] == 0, sweep["err"][-3000:]
    host = sweep["report"]["hosts"]["sglang-01"]
    assert [(lv["concurrency"], lv["completed"], lv["sent"]) for lv in host["levels"]] == [
        (c, K * c, K * c) for c in LEVELS
    ]
    assert host["failed_requests"] == 0 and not host["problems"] and not host["regressions"]
    assert all(lv["output_throughput"] > 0 and lv["p99_ttft_ms"] is not None for lv in host["levels"])


def test_the_jsonl_is_sglangs_own(sweep):
    host_dir = Path(sweep["report"]["record_dir"]) / "hosts" / "sglang-01"
    rows = [json.loads(line) for line in (host_dir / "results.jsonl").read_text().splitlines()]
    assert [r["max_concurrency"] for r in rows] == list(LEVELS)
    for r in rows:
        assert (r["backend"], r["dataset_name"], r["random_range_ratio"]) == ("sglang", "random-ids", 1.0)
        assert (r["random_input_len"], r["random_output_len"]) == (64, 16)
        assert r["total_output_tokens"] == 16 * r["completed"]
        # the stand-in's /server_info carries the key as real SGLang's does; the container's copy is scrubbed
        info = r["server_info"]
        assert info["api_key"] == "<redacted>" and "--api-key <redacted>" in info["launch_command"]


def test_report_has_capacity_policy_version_and_both_charts(sweep):
    host_dir = Path(sweep["report"]["record_dir"]) / "hosts" / "sglang-01"
    md = (host_dir / "report.md").read_text()
    assert "the figures measure nothing" in md
    assert md.index("**Capacity:**") < md.index("| concurrency |")
    assert f"SGLang {wheelhouse.SGLANG_VERSION}, P2P policy `off`, client `sglang.benchmark.serving`" in md
    for c in LEVELS:
        assert f"| {K * c} / {K * c} |" in md
    for png in ("throughput.png", "ttft_p99.png"):
        assert (host_dir / png).read_bytes()[:4] == b"\x89PNG"


def test_no_secret_in_the_run_record(sweep, runs):
    hits = subprocess.run(["grep", "-rl", API_KEY, str(runs)], capture_output=True, text=True).stdout
    assert hits == "", f"API key found in: {hits}"


def test_no_secret_in_the_results_left_on_the_container(lab, sweep):
    """The stand-in leaks the key into /server_info as SGLang 0.5.23 does, and the client copies it into every
    line it writes on the container: the bench role takes it out there too."""
    ct = lab.container()
    results = ct.ssh("ls /var/lib/provision/bench/*/results.jsonl").stdout.split()
    assert results, "the sweep left no results on the container"
    assert '"launch_command"' in ct.ssh(f"cat {' '.join(results)}").stdout, "the client copied no /server_info"
    hits = ct.ssh(f"grep -l -F -- {API_KEY} {' '.join(results)}").stdout
    assert hits == "", f"API key found in the container's {hits}"


def test_a_regression_against_a_baseline_sets_the_exit_code(sweep, converged, runs, tmp_path):
    saved = json.loads((Path(sweep["report"]["record_dir"]) / "hosts" / "sglang-01" / "baseline.json").read_text())
    saved["levels"] = {"1": {"output_throughput": saved["levels"]["1"]["output_throughput"] * 100}}
    baseline = tmp_path / "inflated.json"
    baseline.write_text(json.dumps(saved))
    rc, report, err = bench(converged, runs, "--concurrency", "1", "--baseline", str(baseline))
    assert rc == 3, err[-2000:]
    assert report["hosts"]["sglang-01"]["regressions"][0].startswith("C=1: output tok/s")
    md = Path(report["hosts"]["sglang-01"]["report"]).read_text()
    assert "## Regressions against the baseline" in md


def test_a_gpu_dma_fault_during_the_sweep_fails_bench_naming_the_line(lab, converged, runs):
    """The fault is logged on the node while SGLang's client runs, as the IOMMU would log it mid-sweep."""
    node, ct = lab.state()["vms"][0]["name"], lab.container()
    line = "nvidia 0000:42:00.0: AMD-Vi: Event logged [IO_PAGE_FAULT domain=0x001a address=0x7ffe1000 flags=0x0020]"
    injected = threading.Event()
    when: dict[str, float] = {}

    def inject_while_the_client_runs():
        # the launcher with the client's module after it: only the sweep's own client (not a task that writes the
        # launcher or finds the module before the sweep's start is marked)
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline and ct.ssh("pgrep -f 'sglang-bench-client sglang'").returncode:
            time.sleep(0.5)
        when["seen"] = time.time()
        lab.inject_kernel_line(node, line)
        when["injected"] = time.time()
        injected.set()

    thread = threading.Thread(target=inject_while_the_client_runs, daemon=True)
    thread.start()
    try:
        # 64 prompts at concurrency 8: the client runs for seconds, so the line lands while it does
        rc, report, err = bench(converged, runs, "--concurrency", "8", "--prompts-per-level", "8")
        thread.join(60)
    finally:  # the line stays in the node's log: a new start of the service opens a new window for verify
        restart_and_wait_ready(ct)
    assert injected.is_set()
    assert rc != 0, (when, err[-2000:])
    text = json.dumps(report) + err
    assert f"node {node} logged 1 GPU DMA fault line(s) during the sweep" in text
    assert "IO_PAGE_FAULT domain=0x001a address=0x7ffe1000 flags=0x0020" in text
