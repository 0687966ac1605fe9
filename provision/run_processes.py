"""The processes of one run, found and stopped: the sweep that SIGINT, SIGTERM, the end of every run and the run's
watchdog share (provision/interrupts.py, provision/watchdog.py). Standard library only: the watchdog imports it.

A process is the run's when its environment carries RUN_MARKER=<the run's private data dir>, which every process the
run starts inherits, or when it is an ssh ControlPersist master whose title names its socket in that directory (its
title overwrites its environment).
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from pathlib import Path

RUN_MARKER = "PROVISION_RUN"
GRACE_S = 5.0


def _is_the_runs(proc: Path, marker: bytes, inside: bytes) -> bool:
    if marker in (proc / "environ").read_bytes().split(b"\0"):
        return True
    # ssh's ControlPersist master writes its title ("ssh: <control path> [mux]") over its environment; only that
    # title counts, not any command naming the run's directory (an operator's `tail -f .../stdout`)
    return (proc / "cmdline").read_bytes().startswith(b"ssh: " + inside)


def run_processes(marker: str) -> dict[int, int]:
    """pid -> process group of every process of the run: its environment carries RUN_MARKER=marker, or its
    command line names a path inside the marker's directory."""
    wanted, inside = f"{RUN_MARKER}={marker}".encode(), f"{marker}/".encode()
    found = {}
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit() or int(proc.name) == os.getpid():
            continue
        try:
            if _is_the_runs(proc, wanted, inside):
                found[int(proc.name)] = os.getpgid(int(proc.name))
        except OSError:
            continue  # gone, or not ours to read (then not the run's either)
    return found


def _signal_all(processes: dict[int, int], signum: int) -> None:
    own_group = os.getpgrp()
    for pgid in set(processes.values()) - {own_group}:
        with contextlib.suppress(OSError):
            os.killpg(pgid, signum)
    for pid in (pid for pid, pgid in processes.items() if pgid == own_group):
        with contextlib.suppress(OSError):
            os.kill(pid, signum)  # one by one in our own group: killpg would signal provision itself


def stop_run(marker: str, grace_s: float = GRACE_S) -> None:
    """TERM every process group holding a process of the run, wait up to grace_s, then KILL what is left."""
    for signum in (signal.SIGTERM, signal.SIGKILL):
        processes = run_processes(marker)
        if not processes:
            return
        _signal_all(processes, signum)
        deadline = time.monotonic() + grace_s
        while run_processes(marker) and time.monotonic() < deadline:
            time.sleep(0.1)
