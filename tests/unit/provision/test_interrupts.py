"""provision/interrupts.py: a signal during a run stops every process of the run, and the record says what each
host was left in."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest
import yaml

from provision import interrupts
from provision.apply import host_states, stopped_at
from provision.runner import EventCollector, HostStats, RunResult
from tests.loaders import REPO


def _tasks(node) -> list[str]:
    """Every task name in a task list or play, blocks included; not `meta` tasks, which run on no host (a
    flush_handlers task is never a host's last task: the handlers it runs are)."""
    names = []
    for item in node if isinstance(node, list) else []:
        if isinstance(item, dict):
            if not any(key in item for key in ("meta", "ansible.builtin.meta")):
                names.append(item.get("name", ""))
            for key in ("block", "rescue", "always", "tasks"):
                names += _tasks(item.get(key))
    return names


def test_every_task_the_table_names_exists():
    """A renamed task would silently lose its description: the table follows the roles, and names tasks that run
    on a host."""
    names = set()
    for path in [
        *REPO.glob("roles/*/tasks/*.yml"),
        *REPO.glob("roles/*/handlers/*.yml"),
        *REPO.glob("playbooks/*.yml"),
    ]:
        names.update(_tasks(yaml.safe_load(path.read_text())))
    assert set(interrupts.LEFT_BY_TASK) - names == set()


def test_every_task_that_runs_while_a_rolling_restart_has_the_server_out_says_the_next_run_puts_it_back():
    """A SIGINT anywhere between the restart and the rejoin of tasks/rolling.yml (the restart itself, then every
    task of tasks/ready.yml, its rescue included) leaves the server out of its gateways: the record must say so."""
    rolling = yaml.safe_load((REPO / "roles/sglang/tasks/rolling.yml").read_text())
    ready = yaml.safe_load((REPO / "roles/sglang/tasks/ready.yml").read_text())
    (restart,) = [t["name"] for t in rolling if "ansible.builtin.systemd_service" in t]
    while_out = [restart, *(t["name"] for block in ready for t in [*block["block"], *block["rescue"]])]
    for task in while_out:
        for finished in (False, True):
            assert interrupts.left_behind(task, "sglang", finished).endswith("the next run puts it back"), task


def test_left_behind_by_task_and_by_phase():
    assert interrupts.left_behind("Regenerate the boot configuration for this bootloader", finished=True) == (
        "boot config written, not rebooted into it"
    )
    assert "not rebooted" in interrupts.left_behind("Regenerate the boot configuration for this bootloader")
    assert interrupts.left_behind("Something new", "provision.pve_sglang.kernel_cmdline") == (
        "the kernel phase stopped in 'Something new': run apply again to finish it"
    )
    assert interrupts.left_behind("X", "", finished=True).startswith("the run stopped after 'X'")


def test_the_record_names_each_hosts_last_task_and_whether_it_finished():
    c = EventCollector()
    c.handle({"event": "runner_on_start", "event_data": {"host": "n1", "task": "A", "role": "kernel_cmdline"}})
    c.handle({"event": "runner_on_ok", "event_data": {"host": "n1", "task": "A", "role": "kernel_cmdline"}})
    c.handle(
        {"event": "runner_on_start", "event_data": {"host": "n1", "task": "Reboot into the new kernel command line"}}
    )
    c.handle({"event": "runner_on_start", "event_data": {"host": "ct1", "task": "B", "role": "sglang"}})
    c.handle({"event": "runner_on_ok", "event_data": {"host": "ct1", "task": "B", "role": "sglang"}})
    result = RunResult("site.yml", "interrupted", 254, False, "now", 1.0, last_tasks=c.last_tasks, interrupted="SIGINT")
    result.hosts = {"n1": HostStats(ok=1), "ct1": HostStats(ok=1)}
    where = stopped_at(result)
    assert where["n1"]["task"] == "Reboot into the new kernel command line" and where["n1"]["finished"] is False
    assert where["n1"]["leaves"].startswith("reboot under way")
    assert where["ct1"] == {
        "task": "B",
        "role": "sglang",
        "finished": True,
        "leaves": "the sglang phase stopped after 'B': run apply again to finish it",
    }
    assert host_states(result, ["n1", "ct1", "n2"]) == {"n1": "interrupted", "ct1": "interrupted", "n2": "interrupted"}


def _spawn(marker: str, script: str) -> subprocess.Popen:
    """A process tree of 'the run': its own session (as pexpect gives ansible-playbook), marked."""
    env = {**os.environ, interrupts.RUN_MARKER: marker}
    return subprocess.Popen(["sh", "-c", script], env=env, start_new_session=True)


def _wait_for(marker: str, count: int) -> None:
    deadline = time.monotonic() + 10
    while len(interrupts.run_processes(marker)) < count and time.monotonic() < deadline:
        time.sleep(0.05)
    assert len(interrupts.run_processes(marker)) >= count


def test_a_signal_stops_every_process_of_the_run_and_no_other(tmp_path):
    found = signal.getsignal(signal.SIGINT)  # the handler the trap must give back (a worker's may be its own)
    marker = str(tmp_path / "run")
    # a child in the run's group, and one that starts a session of its own (as ssh's ControlPersist master does)
    run = _spawn(marker, "sleep 300 & setsid sleep 300 & wait")
    # and one known by its title only, as ssh's ControlPersist master writes it over its environment and argv
    master = subprocess.Popen(
        ["bash", "-c", f'exec -a "ssh: {marker}/cp/0123456789 [mux]" sleep 300'],
        env={"PATH": os.environ["PATH"]},
        start_new_session=True,
    )
    bystander = _spawn(str(tmp_path / "other"), "sleep 300")
    # an operator's command that names the run's directory is not the run's
    reader = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(300)", f"{marker}/artifacts/run/stdout"], start_new_session=True
    )
    try:
        _wait_for(marker, 4)
        with interrupts.SignalTrap() as trap:
            cancel = trap.cancel_callback(marker)
            assert cancel() is False
            os.kill(os.getpid(), signal.SIGINT)  # no KeyboardInterrupt: the trap keeps it
            time.sleep(0.1)
            assert trap.name == "SIGINT"
            assert cancel() is True
        assert interrupts.run_processes(marker) == {}
        run.wait(timeout=5)
        assert master.wait(timeout=5) == -signal.SIGTERM
        assert bystander.poll() is None, "a process of another run was stopped"
        assert reader.poll() is None, "a process that only names the run's directory was stopped"
    finally:
        for proc in (run, master, bystander, reader):
            proc.kill()
            proc.wait()
    assert signal.getsignal(signal.SIGINT) is found


def test_what_ignores_term_is_killed_after_the_grace(tmp_path):
    marker = str(tmp_path / "run")
    run = _spawn(marker, "trap '' TERM; sleep 300 & wait")
    try:
        _wait_for(marker, 2)
        started = time.monotonic()
        interrupts.stop_run(marker, grace_s=0.5)
        assert interrupts.run_processes(marker) == {}
        assert 0.5 <= time.monotonic() - started < 5
    finally:
        run.kill()
        run.wait()


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_the_trap_names_the_first_signal(signum):
    with interrupts.SignalTrap() as trap:
        os.kill(os.getpid(), signum)
        time.sleep(0.05)
        os.kill(os.getpid(), signal.SIGINT if signum == signal.SIGTERM else signal.SIGTERM)
        time.sleep(0.05)
    assert trap.signum == signum
