"""The processes of a provision run, as /proc shows them: to interrupt a run and prove that nothing of it is left
(tests/test_apply_ssh.py on sshd targets, tests/lab/test_kernel.py in the kernel phase)."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path


def tree(root_pid: int) -> dict[int, str]:
    """pid -> command line of root_pid's descendants."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    found, todo = {}, list(children.get(root_pid, []))
    while todo:
        pid = todo.pop()
        found[pid] = cmdline(pid)
        todo += children.get(pid, [])
    return found


def cmdline(pid: int) -> str:
    try:
        return (Path("/proc") / str(pid) / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def live() -> dict[int, tuple[int, str]]:
    """pid -> (process group, command line) of every process that is not a zombie."""
    found = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if fields[0] != "Z":
            found[int(stat.parent.name)] = (int(fields[2]), cmdline(int(stat.parent.name)))
    return found


def private_dir(proc: subprocess.Popen) -> str | None:
    """The private data dir of the run's ansible-playbook (its ANSIBLE_LOCAL_TEMP's parent), where runner writes the
    job events while it runs; None while no ansible-playbook runs under `proc`."""
    for pid, cmd in tree(proc.pid).items():
        if "ansible-playbook" in cmd:
            try:
                environ = (Path("/proc") / str(pid) / "environ").read_bytes().split(b"\0")
            except OSError:
                continue
            temp = next((e.split(b"=", 1)[1].decode() for e in environ if e.startswith(b"ANSIBLE_LOCAL_TEMP=")), None)
            if temp:
                return str(Path(temp).parent)
    return None


def the_runs_processes(proc: subprocess.Popen) -> tuple[str, set[int]]:
    """The run's private data dir (from ansible-playbook's environment) and the process groups of everything
    provision started, ssh's ControlPersist masters included (they name the private dir)."""
    descendants = tree(proc.pid)
    private = private_dir(proc)
    assert private, "no ansible-playbook running under the run"
    running = live()
    groups = {running[pid][0] for pid in descendants if pid in running}
    groups |= {g for g, cmd in running.values() if private + "/" in cmd}
    assert any(private + "/cp/" in cmd for _, cmd in running.values()), "no ControlPersist master: the check is blind"
    return private, groups - {os.getpgrp()}


def assert_nothing_left(private: str, groups: set[int]) -> None:
    deadline = time.monotonic() + 5  # init reaps what was reparented
    while True:
        left = {pid: cmd for pid, (group, cmd) in live().items() if group in groups or private + "/" in cmd}
        if not left or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert not left, f"processes of the run left: {left}"


def interrupt(proc: subprocess.Popen, sig: signal.Signals, gate: Path | None = None) -> None:
    """Send `sig` to a running apply, which must exit 128+sig, open its gate (where the test holds the run at one),
    and check that none of the run's processes is left."""
    try:
        private, groups = the_runs_processes(proc)
        proc.send_signal(sig)
        assert proc.wait(timeout=60) == 128 + sig
    finally:
        if gate is not None:
            gate.unlink(missing_ok=True)
        proc.kill()
    assert_nothing_left(private, groups)


def start_apply(inventory: Path, runs: Path, out: Path, *args: str, env: dict | None = None) -> subprocess.Popen:
    """`provision apply --yes --json` with `args` (and `env` added to this process's environment), in the
    background: its stdout in `out`, its stderr beside it (`out` with the suffix .err)."""
    argv = [
        sys.executable,
        "-m",
        "provision",
        "apply",
        "--inventory",
        str(inventory),
        "--yes",
        "--json",
        "--runs-dir",
        str(runs),
        *args,
    ]
    return subprocess.Popen(
        argv,
        stdin=subprocess.DEVNULL,
        stdout=out.open("w"),
        stderr=out.with_suffix(".err").open("w"),
        env={**os.environ, **(env or {})},
    )


def wait_for_task(proc: subprocess.Popen, host: str, task: str, timeout: float = 600) -> None:
    """Until `task` has started on `host`: its start event among the job events runner writes, while the run goes,
    into its private data dir."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert proc.poll() is None, f"the run ended (rc {proc.returncode}) before {task!r} started on {host}"
        private = private_dir(proc)
        for event in Path(private).glob("artifacts/*/job_events/*.json") if private else ():
            with contextlib.suppress(ValueError, OSError):
                data = json.loads(event.read_text())
                if (
                    data.get("event") == "runner_on_start"
                    and data["event_data"].get("host") == host
                    and data["event_data"].get("task") == task
                ):
                    return
        time.sleep(0.3)
    raise AssertionError(f"{task!r} never started on {host}")
