"""Structured results: what the roles report, diag's verdicts and verify's readings travel as values the tasks
return (`msg: {provision_report: ...}`) and as the run's stats (set_stats), never by a task's name."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from provision import diag, runner, verify
from provision.job_events import run_stats
from provision.record import RunRecord
from provision.runner import REPORT_KEY, EventCollector
from tests.loaders import REPO


def _ok(task: str, res: dict, host: str = "n1") -> dict:
    return {"event": "runner_on_ok", "event_data": {"host": host, "task": task, "res": res}}


def test_a_report_is_what_a_task_returns_whatever_its_name():
    c = EventCollector()
    c.handle(_ok("Say which bootloader", {"msg": {REPORT_KEY: "grub   (found /etc/default/grub)\n"}}))
    c.handle(_ok("Report the old way", {"msg": "a plain debug message is not a report"}))
    c.handle(
        _ok(
            "Report each item",
            {"results": [{"msg": {REPORT_KEY: "C=1: ok"}}, {"skipped": True}, {"msg": {REPORT_KEY: "C=4: ok"}}]},
        )
    )
    c.handle(_ok("Read something", {"stdout": "x"}, host="n2"))
    assert c.reports == {"n1": ["grub (found /etc/default/grub)", "C=1: ok", "C=4: ok"]}, "n2 reported nothing"


def _tasks(node) -> list[dict]:
    found = []
    for item in node if isinstance(node, list) else []:
        if isinstance(item, dict):
            found.append(item)
            for key in ("block", "rescue", "always", "tasks"):
                found += _tasks(item.get(key))
    return found


def _all_tasks() -> list[tuple[Path, dict]]:
    paths = [*REPO.glob("roles/*/tasks/*.yml"), *REPO.glob("roles/*/handlers/*.yml"), *REPO.glob("playbooks/*.yml")]
    return [(path, task) for path in paths for task in _tasks(yaml.safe_load(path.read_text()))]


def test_every_message_the_roles_print_is_a_report():
    """A debug task whose message is not under REPORT_KEY would print in Ansible's output and never reach
    provision's console or run record."""
    debug = [(p, t) for p, t in _all_tasks() if "ansible.builtin.debug" in t]
    assert debug, "the pattern no longer finds the roles' debug tasks"
    for path, task in debug:
        msg = task["ansible.builtin.debug"].get("msg")
        assert isinstance(msg, dict) and set(msg) == {REPORT_KEY}, f"{path.relative_to(REPO)}: {task['name']}"


@pytest.mark.parametrize("key", [verify.PROBE_STATS, diag.DIAG_STATS])
def test_every_stats_key_python_reads_is_handed_over_by_a_task(key):
    handed = [t for _, t in _all_tasks() if key in ((t.get("ansible.builtin.set_stats") or {}).get("data") or {})]
    assert handed, f"no set_stats task hands over {key}"


def test_diag_verdicts_come_from_the_runs_stats(tmp_path):
    folder = tmp_path / "artifacts" / "run" / "job_events"
    folder.mkdir(parents=True)
    data = {diag.DIAG_STATS: {"ct1": {"verdict": "healthy", "gpu_count": 2}, "ct2": "not a verdict"}}
    event = {"event": "playbook_on_stats", "counter": 7, "event_data": {"artifact_data": data}}
    (folder / "7-stats.json").write_text(json.dumps(event))
    assert diag.results_from_stats(tmp_path) == {
        "ct1": {"verdict": "healthy", "gpu_count": 2},
        "ct2": {"verdict": "error", "reason": "the diagnostic printed no JSON"},
    }
    assert diag.results_from_stats(tmp_path / "none") == {}


def test_a_real_run_brings_back_reports_and_stats(tmp_path, monkeypatch):
    """Through ansible-runner on this machine (local connection): a debug report and a set_stats value, from tasks
    whose names follow no convention, reach the result and the record."""
    playbooks = tmp_path / "playbooks"
    playbooks.mkdir()
    tasks = [
        {"name": "Say something", "ansible.builtin.debug": {"msg": {REPORT_KEY: "hello {{ inventory_hostname }}"}}},
        {"name": "Hand something over", "ansible.builtin.set_stats": {"data": {"k": "{{ {inventory_hostname: 42} }}"}}},
    ]
    play = [{"name": "p", "hosts": "all", "gather_facts": False, "tasks": tasks}]
    (playbooks / "t.yml").write_text(yaml.safe_dump(play))
    (tmp_path / "hosts.yml").write_text(
        yaml.safe_dump(
            {
                "all": {
                    "hosts": {"h1": {"ansible_connection": "local", "ansible_python_interpreter": "/usr/bin/python3"}}
                }
            }
        )
    )
    monkeypatch.setattr(runner, "playbooks_dir", lambda: playbooks)
    monkeypatch.setenv("PROVISION_ANSIBLE_STRATEGY", "linear")
    with RunRecord(tmp_path / "runs", "test") as record:
        result = runner.run_playbook("t.yml", tmp_path / "hosts.yml", record=record, host_count=1)
    assert result.succeeded, result.failures
    assert result.reports == {"h1": ["hello h1"]}
    assert run_stats(record.path) == {"k": {"h1": 42}}
