"""Pure parts of the runner: event counting, ansible.cfg, secret scrubbing."""

import json

from provision.runner import REDACTED, EventCollector, redact_tree, secret_values


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
    assert c.play_hosts == {"h1", "h2"} and not c.aborted
    assert c.failures[0]["message"] == "boom: disk full"
    assert c.failures[1]["message"] == "unreachable: ssh: connect refused"
    assert c.host_seconds["h1"] == 1.5


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


def test_collector_keeps_diffs_and_sees_an_aborted_playbook():
    c = EventCollector()
    c.handle({"event": "playbook_on_play_start", "event_data": {"name": "kernel"}})
    diff = {"before": "a\n", "after": "b\n", "before_header": "/etc/x"}
    c.handle(_ev("runner_on_ok", res={"changed": True, "diff": diff}))
    c.handle({"event": "playbook_on_no_hosts_remaining", "event_data": {}})
    assert c.changed_tasks[0]["diff"] == [diff]
    assert c.aborted and c.play_hosts == {"h1"}


def test_redact_obj_scrubs_strings_only():
    from provision.runner import redact_obj

    data = {"exit_code": 4000, "hosts": {"ops-node": "ok"}, "msg": ["pw s3cret-x here"]}
    assert redact_obj(data, {"s3cret-x", "4000"}) == {"exit_code": 4000, "hosts": {"ops-node": "ok"},
                                                      "msg": [f"pw {REDACTED} here"]}  # fmt: skip
