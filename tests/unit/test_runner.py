"""Pure parts of the runner: event counting, ansible.cfg, secret scrubbing."""

import json
from pathlib import Path

from provision.runner import REDACTED, EventCollector, ansible_cfg, redact_tree, secret_values


def _ev(kind, host="h1", task="T", **data):
    return {"event": kind, "event_data": {"host": host, "task": task, **data}}


def test_collector_counts_and_always_returns_true():
    c = EventCollector()
    events = [
        {"event": "playbook_on_task_start", "event_data": {"task": "T"}},
        _ev("runner_on_ok", res={"changed": True}, duration=1.5),
        _ev("runner_on_ok", res={"changed": False}),
        _ev("runner_on_failed", res={"msg": "boom", "stderr": "disk full"}),
        _ev("runner_on_failed", res={"msg": "ignored"}, ignore_errors=True),
        _ev("runner_on_skipped"),
        _ev("runner_on_unreachable", host="h2", res={"msg": "ssh: connect refused"}),
    ]
    assert all(c.handle(e) is True for e in events)
    h1, h2 = c.live["h1"], c.live["h2"]
    assert (h1.ok, h1.changed, h1.failed, h1.ignored, h1.skipped) == (2, 1, 1, 1, 1)
    assert h2.unreachable == 1 and h2.status == "unreachable"
    assert c.changed_tasks == [{"host": "h1", "task": "T", "play": ""}]
    assert c.failures[0]["message"] == "boom: disk full"
    assert c.failures[1]["message"] == "unreachable: ssh: connect refused"
    assert c.host_seconds["h1"] == 1.5


def test_ansible_cfg_keeps_host_key_checking_and_pipelining(tmp_path):
    cfg = ansible_cfg(7, True, tmp_path)
    assert "host_key_checking = True" in cfg
    assert "forks = 7" in cfg and "pipelining = True" in cfg and "ControlPersist" in cfg


def test_redact_tree_scrubs_plain_and_json_escaped_secrets(tmp_path):
    secret = 'pa"ss\\word-123'
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "plain.txt").write_text(f"password={secret}\n")
    (tmp_path / "event.json").write_text(json.dumps({"res": {"msg": f"login {secret} failed"}}))
    assert redact_tree(tmp_path, {secret}) == 2
    assert secret not in (tmp_path / "a" / "plain.txt").read_text()
    assert json.dumps(secret)[1:-1] not in (tmp_path / "event.json").read_text()
    assert REDACTED in (tmp_path / "event.json").read_text()


def test_secret_values_from_environment(monkeypatch):
    monkeypatch.setenv("PROXMOX_PASSWORD", "hunter2-long")
    monkeypatch.setenv("MY_API_KEY", "k-123456")
    monkeypatch.setenv("HOME_DIR", "/root")
    found = secret_values({"extra-secret"})
    assert {"hunter2-long", "k-123456", "extra-secret"} <= found
    assert "/root" not in found


def test_ansible_cfg_uses_mitogen_unless_switched_off(tmp_path, monkeypatch):
    monkeypatch.delenv("PROVISION_ANSIBLE_STRATEGY", raising=False)
    cfg = ansible_cfg(3, True, tmp_path)
    assert "strategy = mitogen_linear" in cfg
    plugins = next(line for line in cfg.splitlines() if line.startswith("strategy_plugins = "))
    assert (Path(plugins.split(" = ", 1)[1]) / "mitogen_linear.py").is_file()
    monkeypatch.setenv("PROVISION_ANSIBLE_STRATEGY", "linear")
    cfg = ansible_cfg(3, True, tmp_path)
    assert "strategy = linear" in cfg and "strategy_plugins" not in cfg
