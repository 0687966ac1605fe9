"""Pure parts of the runner: event counting (secret scrubbing: test_secrets.py)."""

from provision.runner import EventCollector


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


def test_collector_keeps_diffs_and_sees_an_aborted_playbook():
    c = EventCollector()
    c.handle({"event": "playbook_on_play_start", "event_data": {"name": "kernel"}})
    diff = {"before": "a\n", "after": "b\n", "before_header": "/etc/x"}
    c.handle(_ev("runner_on_ok", res={"changed": True, "diff": diff}))
    c.handle({"event": "playbook_on_no_hosts_remaining", "event_data": {}})
    assert c.changed_tasks[0]["diff"] == [diff]
    assert c.aborted and c.play_hosts == {"h1"}


def test_a_modules_warnings_reach_the_result_once_per_host():
    """module.warn() travels in the task's result, not as an event of its own (the event below is what
    ansible-runner 2.4 gives for it under ansible-core 2.19): the run's warnings must still say it."""
    c = EventCollector()
    warned = {
        "changed": False,
        "warnings": ["proxmox_api_validate_certs is false: the PVE API's TLS certificate is NOT verified"],
    }
    for host in ("ct1", "ct1", "ct2"):
        c.handle(_ev("runner_on_ok", host=host, res=warned))
    c.handle(_ev("runner_on_ok", host="ct3", res={"results": [{"warnings": ["item warning"]}]}))
    assert c.warnings == [
        "ct1: proxmox_api_validate_certs is false: the PVE API's TLS certificate is NOT verified",
        "ct2: proxmox_api_validate_certs is false: the PVE API's TLS certificate is NOT verified",
        "ct3: item warning",
    ]


def test_the_console_shows_warnings_about_hosts_and_the_summary_keeps_every_warning():
    from rich.console import Console

    from provision import present
    from provision.runner import RunResult

    c = EventCollector()
    c.handle({"event": "warning", "stdout": "[WARNING]: Could not match supplied host pattern, ignoring: x"})
    c.handle(_ev("runner_on_ok", host="ct1", res={"warnings": ["proxmox_api_validate_certs is false: NOT verified"]}))
    result = RunResult("site.yml", "successful", 0, False, "", 1.0, hosts=c.live, warnings=c.warnings)
    console = Console(record=True, width=200)
    present.print_apply(console, result, "apply")
    shown = console.export_text()
    assert "warning: ct1: proxmox_api_validate_certs is false: NOT verified" in shown
    assert "Could not match" not in shown and len(result.to_dict()["warnings"]) == 2


def test_a_connection_lost_mid_task_says_what_happened_not_to_file_a_bug():
    """Mitogen's own text, as the lab's container stopped through the API under `Install SGLang into its venv`
    (tests/lab/test_sglang.py) gave it."""
    c = EventCollector()
    lost = (
        "Task failed: Mitogen was disconnected from the remote environment while a call was in-progress. If you "
        "feel this is in error, please file a bug. Original error was: the respondent Context has disconnected"
    )
    c.handle(_ev("runner_on_unreachable", host="sglang-01", task="Install SGLang into its venv", res={"msg": lost}))
    assert c.failures == [
        {
            "host": "sglang-01",
            "task": "Install SGLang into its venv",
            "message": "unreachable: the connection was lost while the task ran (the host stopped, rebooted or "
            "lost its network: the respondent Context has disconnected); run apply again once it answers ssh",
        }
    ]


def test_a_failure_a_rescue_handled_is_not_among_the_runs_failures():
    """A block's rescue ran after the first failure (the host ran on, and the stats count one rescue); the rescue's
    own failure, the host's last, stays. A failure followed only by an `always` stays too."""
    c = EventCollector()
    events = [
        _ev("runner_on_start", task="wait"),
        _ev("runner_on_failed", task="wait", res={"msg": "WARNING: REMOTE HOST IDENTIFICATION\nHAS CHANGED"}),
        _ev("runner_on_start", task="refuse"),
        _ev("runner_on_failed", task="refuse", res={"msg": "h1: serves another key: refusing to connect"}),
        _ev("runner_on_start", host="h2", task="step"),
        _ev("runner_on_failed", host="h2", task="step", res={"msg": "broke"}),
        _ev("runner_on_start", host="h2", task="always"),
        _ev("runner_on_ok", host="h2", task="always", res={}),
        {"event": "playbook_on_stats", "event_data": {"rescued": {"h1": 1}, "failures": {"h1": 1, "h2": 1}}},
    ]
    assert all(c.handle(e) is True for e in events)
    assert [(f["host"], f["message"]) for f in c.failures] == [
        ("h1", "h1: serves another key: refusing to connect"),
        ("h2", "broke"),
    ]
    assert (c.live["h1"].failed, c.live["h1"].rescued, c.live["h2"].failed) == (1, 1, 1)


def test_an_unreachable_the_task_ignored_is_not_a_failure_and_one_that_stops_the_host_is():
    """ignore_unreachable: Ansible counts the result as ignored and the host runs on (kernel_cmdline's
    before_reboot.yml reading a stopped container); without it the host leaves the play."""
    c = EventCollector()
    for event in (
        _ev("runner_on_start", task="read the container"),
        _ev("runner_on_unreachable", task="read the container", res={"msg": "ssh: connect refused"}),
        _ev("runner_on_start", task="next"),
        _ev("runner_on_ok", task="next", res={}),
        _ev("runner_on_start", host="h2", task="read"),
        _ev("runner_on_unreachable", host="h2", task="read", res={"msg": "ssh: no route"}),
    ):
        c.handle(event)
    assert [(f["host"], f["message"]) for f in c.failures] == [("h2", "unreachable: ssh: no route")]
    assert (c.live["h1"].unreachable, c.live["h1"].ignored, c.live["h1"].status) == (0, 1, "ok")
    assert c.live["h2"].status == "unreachable"


def test_a_run_that_failed_before_any_host_says_why_in_one_line(tmp_path):
    from provision.runner import _stdout_tail

    run = tmp_path / "artifacts" / "run"
    run.mkdir(parents=True)
    (run / "stdout").write_text(
        "\x1b[0;31m[WARNING]: something earlier\x1b[0m\nERROR! couldn't resolve module/action 'nope'.\n\n"
        "The error appears to be in '/site/roles/x/tasks/main.yml': line 3, column 3, but may\n"
        "be elsewhere in the file depending on the exact syntax problem.\n"
    )
    assert _stdout_tail(tmp_path) == (
        "ERROR! couldn't resolve module/action 'nope'. The error appears to be in '/site/roles/x/tasks/main.yml': "
        "line 3, column 3, but may be elsewhere in the file depending on the exact syntax problem."
    )


def test_a_failed_raw_command_says_what_it_printed_though_its_stderr_came_back_in_stdout():
    """ansible.builtin.raw over ssh runs on a pseudo-terminal: the command's stderr comes back in stdout, and stderr
    holds only ssh's word that the shared connection closed (verify's probe, the fingerprint read)."""
    from provision.runner import _failure_message

    printed = "Traceback (most recent call last):\r\n  File \"<string>\", line 3\r\nNameError: name 'x'\r\n"
    raw = {
        "rc": 1,
        "msg": "non-zero return code",
        "stderr": "Shared connection to 10.0.0.5 closed.\r\n",
        "stdout": printed,
    }
    assert _failure_message(raw).endswith("NameError: name 'x'"), _failure_message(raw)
    assert "Shared connection" not in _failure_message(raw)
    module = {"rc": 2, "msg": "non-zero return code", "stderr": "python3: not found", "stdout": "ignored"}
    assert _failure_message(module) == "non-zero return code: python3: not found"
    assert _failure_message({"rc": 0, "msg": "something else", "stdout": "all fine"}) == "something else"


def test_the_run_and_provision_print_nothing_on_stderr(tmp_path, monkeypatch):
    """provision, the ansible-playbook a run starts (with the run's environment) and verify's pytest: a bare command
    of each prints no warning of the libraries they import (cryptography's DSA notice, through ansible-core), while a
    user's own PYTHONWARNINGS still applies to them."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    from provision.runner import _environment

    monkeypatch.delenv("PYTHONWARNINGS", raising=False)
    env = {**os.environ, **_environment(tmp_path, 1, True)}
    bindir = Path(sys.executable).parent
    for argv in ([bindir / "provision", "--version"], [bindir / "ansible-playbook", "--version"]):
        proc = subprocess.run(argv, capture_output=True, text=True, env=env, check=True)
        assert proc.stderr == "", argv
    user = {**env, "PYTHONWARNINGS": "error::UserWarning"}
    user["PYTHONWARNINGS"] = __import__("provision").child_warnings(user)
    said = "import warnings; warnings.warn('mine'); print('unreached')"
    proc = subprocess.run([sys.executable, "-c", said], capture_output=True, text=True, env=user)
    assert proc.returncode == 1 and "UserWarning: mine" in proc.stderr
