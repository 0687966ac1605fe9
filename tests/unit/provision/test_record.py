"""The run record every command writes through (provision/record.py), and the ways a command can end."""

from __future__ import annotations

import base64
import json
import stat
import textwrap
from pathlib import Path

import pytest

from provision import bench, inventory
from provision.record import RunRecord
from provision.runner import RunResult

KEY = "sk-truncated-" + "line-key-77"
HOSTS = """\
all:
  children:
    proxmox_hosts:
      hosts:
        pve1: {}
    gpu_containers:
      hosts:
        ct1: {proxmox_host: pve1, proxmox_vmid: 110}
"""


@pytest.fixture
def inv(tmp_path, monkeypatch):
    """An inventory whose key comes from an environment variable whose name does not look secret, and
    whose node has a literal (warned about) PVE password."""
    monkeypatch.setenv("COLOUR_OF_THE_DAY", KEY)
    root = tmp_path / "inv"
    (root / "group_vars").mkdir(parents=True)
    (root / "hosts.yml").write_text(HOSTS)
    (root / "group_vars" / "all.yml").write_text(
        textwrap.dedent("""\
        sglang_api_key: "{{ lookup('ansible.builtin.env', 'COLOUR_OF_THE_DAY') }}"
        proxmox_api_password: literal-pve-pw
    """)
    )
    return inventory.load(root)


def files_with(root: Path, *needles: str) -> list[str]:
    return [str(p) for p in root.rglob("*") if p.is_file() and any(n in p.read_text(errors="replace") for n in needles)]


def test_the_record_is_private_scrubbed_and_its_summary_carries_the_inventorys_warnings(tmp_path, inv):
    with RunRecord(tmp_path / "runs", "verify", inv) as rec:
        (rec.path / "raw.txt").write_text(f"{KEY} {base64.b64encode(KEY.encode()).decode()} literal-pve-pw\n")
        rec.write_json("verify.json", {"reason": f"no answer to {KEY}", "count": 4})
        rec.write_summary({"command": "verify", "warnings": ["ct1: from the run"]})
    assert stat.S_IMODE(rec.path.stat().st_mode) == 0o700 and rec.path.name.endswith("-verify")
    assert files_with(rec.path, KEY, "literal-pve-pw", base64.b64encode(KEY.encode()).decode()[:12]) == []
    summary = json.loads((rec.path / "summary.json").read_text())
    assert summary["warnings"][0].endswith(
        "proxmox_api_password is in plain text; use ansible-vault or \"{{ lookup('ansible.builtin.env', 'NAME') }}\""
    )
    assert summary["warnings"][-1] == "ct1: from the run"
    assert json.loads((rec.path / "verify.json").read_text())["count"] == 4


def test_a_command_that_crashes_half_way_leaves_a_scrubbed_record_that_says_so(tmp_path, inv):
    with pytest.raises(ValueError), RunRecord(tmp_path / "runs", "bench", inv) as rec:
        (rec.path / "hosts").mkdir()
        (rec.path / "hosts" / "results.jsonl").write_text(json.dumps({"server_info": {"api_key": KEY}}) + "\n")
        raise ValueError(f"boom near {KEY}")
    assert files_with(rec.path, KEY) == []
    summary = json.loads((rec.path / "summary.json").read_text())
    assert summary["status"] == "error" and summary["error"] == "ValueError: boom near ********"


def test_a_discarded_record_leaves_nothing(tmp_path, inv):
    with RunRecord(tmp_path / "runs", "apply", inv) as rec:
        rec.discard()
    assert list((tmp_path / "runs").iterdir()) == []


def test_bench_survives_a_truncated_results_line_and_keeps_no_key(tmp_path, inv, monkeypatch):
    """The client was cut off mid-line (the container stopped): the line holding the server's api_key cannot be
    parsed, so it cannot have the key taken out: bench drops it, says so, and finishes its report. (The playbook
    run is replaced by what the role fetches; tests/lab runs the real one.)"""
    full = {"max_concurrency": 1, "completed": 2, "output_throughput": 100.0, "server_info": {"api_key": KEY}}
    cut = json.dumps({"server_info": {"api_key": KEY, "version": "0.5.23"}, **full})[:60]

    def fetch(playbook, inventory_path, *, record, extravars, **kwargs):
        host_dir = Path(extravars["sglang_bench_controller_dir"]) / "ct1"
        host_dir.mkdir(parents=True)
        (host_dir / "results.jsonl").write_text(json.dumps(full) + "\n" + cut + "\n")
        levels = [{"concurrency": 1, "prompts": 2, "rc": 0, "output_tail": [f"Authorization: Bearer {KEY}"]}]
        (host_dir / "levels.json").write_text(json.dumps({"sglang_version": "0.5.23", "levels": levels}))
        return RunResult(playbook, "successful", 0, False, "", 1.0, record_dir=str(record.path))

    monkeypatch.setattr(bench, "run_playbook", fetch)
    monkeypatch.setattr(bench, "_capacity", lambda opts, progress: {})
    opts = bench.BenchOptions(inventory=str(inv.path), concurrency=(1,), prompts_per_level=2, runs_dir=tmp_path / "r")
    result = bench.bench(opts)
    hb = result.hosts["ct1"]
    assert hb.problems == ["results.jsonl line 2 is not JSON (cut short?): left out"]
    assert [lv.completed for lv in hb.levels] == [2] and hb.report
    record = Path(result.record_dir)
    assert files_with(record, KEY, '{"server_info"') == []
    assert json.loads((record / "summary.json").read_text())["command"] == "bench"


def test_every_command_defaults_to_one_runs_dir(monkeypatch):
    """record.DEFAULT_RUNS_DIR, for the API of each command and for the CLI without $PROVISION_RUNS_DIR."""
    import inspect

    from provision import apply, bench, cli, diag, verify
    from provision.record import DEFAULT_RUNS_DIR

    assert apply.ApplyOptions(inventory="x").runs_dir == DEFAULT_RUNS_DIR
    assert bench.BenchOptions(inventory="x").runs_dir == DEFAULT_RUNS_DIR
    for command in (verify.verify, verify.capacity_report, diag.diag):
        assert inspect.signature(command).parameters["runs_dir"].default == DEFAULT_RUNS_DIR
    monkeypatch.delenv("PROVISION_RUNS_DIR", raising=False)
    assert cli.build_parser().parse_args(["verify", "--inventory", "x"]).runs_dir == DEFAULT_RUNS_DIR


def _stats_run(stats: dict):
    """A run_playbook stand-in that leaves what a real run leaves in its record: the job events (a stats event
    carrying `stats`, as set_stats hands data back) and runner's stdout, each holding the inventory's secrets."""

    def run(playbook, inventory_path, *, record, **kwargs):
        events = record.path / "artifacts" / "run" / "job_events"
        events.mkdir(parents=True)
        event = {"counter": 1, "event": "playbook_on_stats", "event_data": {"artifact_data": stats}}
        (events / "1-stats.json").write_text(json.dumps(event))
        (record.path / "artifacts" / "run" / "stdout").write_text(json.dumps(stats))
        return RunResult(playbook, "successful", 0, False, "", 1.0, record_dir=str(record.path))

    return run


def test_verify_and_diag_records_hold_no_literal_inventory_secret(tmp_path, inv, monkeypatch):
    """verify and diag keep their records through the same RunRecord as apply, with the inventory's secret
    set: the literal PVE password and the key from an oddly named environment variable, in the probe's and the
    diagnostic's answers, are in no file of either record, nor in what the API returns."""
    from provision import diag, verify

    leaked = f"{KEY} and literal-pve-pw"
    probe = {"ct1": {"vars": {"sglang_api_key": KEY}, "stdout": json.dumps({"unit": leaked}), "stderr": leaked}}
    monkeypatch.setattr(verify, "run_playbook", _stats_run({verify.PROBE_STATS: probe}))
    report = verify.verify(str(inv.path), runs_dir=tmp_path / "runs")
    verdict = {"ct1": {"verdict": "x", "reason": leaked}}
    monkeypatch.setattr(diag, "run_playbook", _stats_run({diag.DIAG_STATS: verdict}))
    found = diag.diag(str(inv.path), runs_dir=tmp_path / "runs")
    records = sorted((tmp_path / "runs").iterdir())
    assert sorted(r.name.rsplit("-", 1)[1] for r in records) == ["diag", "verify"]
    assert all((r / "artifacts" / "run" / "job_events" / "1-stats.json").is_file() for r in records)
    assert files_with(tmp_path / "runs", KEY, "literal-pve-pw") == []
    assert KEY not in json.dumps(report.to_dict()) and "literal-pve-pw" not in json.dumps(found.to_dict())
    assert found.results["ct1"]["reason"] == "******** and ********"
