"""plan/apply: every host in scope gets a state; an aborted playbook's unreached hosts say so."""

from __future__ import annotations

from provision.apply import host_states
from provision.cli import _plan_exit
from provision.present import diff_lines
from provision.runner import HostStats, RunResult


def _result(check=True, aborted=False, last=()):
    r = RunResult("site.yml", "failed", 2, check, "now", 1.0, aborted=aborted, last_play_hosts=list(last))
    r.hosts = {
        "down": HostStats(unreachable=1),
        "broken": HostStats(ok=2, failed=1),
        "drifted": HostStats(ok=5, changed=2),
        "clean": HostStats(ok=5),
    }
    return r


def test_states_in_check_mode():
    states = host_states(_result(), ["down", "broken", "drifted", "clean", "never"])
    assert states == {
        "down": "unreachable",
        "broken": "failed",
        "drifted": "changes pending",
        "clean": "up to date",
        "never": "not reached",
    }
    assert _plan_exit(states) == 1
    assert _plan_exit({"a": "changes pending", "b": "up to date"}) == 4
    assert _plan_exit({"a": "up to date"}) == 0


def test_hosts_after_an_abort_were_not_reached():
    states = host_states(_result(check=False, aborted=True, last=["drifted"]), ["drifted", "clean"])
    assert states == {"drifted": "changed", "clean": "not reached"}


def test_diff_lines_unified_and_prepared():
    lines = diff_lines({"before": "a\nb\n", "after": "a\nc\n", "before_header": "/etc/x"})
    assert lines[:2] == ["--- /etc/x", "+++ after"] and "-b" in lines and "+c" in lines
    assert diff_lines({"prepared": "line1\nline2"}) == ["line1", "line2"]
    assert '+  "k": 2' in diff_lines({"before": {"k": 1}, "after": {"k": 2}})


def test_a_run_that_ended_in_error_with_no_host_to_blame_reached_nobody():
    r = RunResult("site.yml", "failed", 250, True, "now", 1.0)
    r.hosts = {"a": HostStats(ok=3), "b": HostStats(ok=3)}
    states = host_states(r, ["a", "b"])
    assert states == {"a": "not reached", "b": "not reached"} and _plan_exit(states) == 1


def test_reboot_never_holds_for_the_containers_restart_too():
    """--reboot never reaches the gpu phase's container restart (a serving container is not restarted for a pending
    devN or nesting change), and --reboot auto the same way; without the flag the inventory decides both."""
    from provision.apply import ApplyOptions, _extravars

    never = _extravars(ApplyOptions("prod", reboot="never"))
    assert (never["kernel_cmdline_reboot"], never["gpu_passthrough_restart"]) == ("never", "never")
    assert _extravars(ApplyOptions("prod", reboot="auto"))["gpu_passthrough_restart"] == "auto"
    assert "gpu_passthrough_restart" not in _extravars(ApplyOptions("prod"))
