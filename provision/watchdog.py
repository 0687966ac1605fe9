"""A run's watchdog: a process of its own, in a session of its own, that outlives provision, so that a run whose
provision dies without a word (kill -9, the OOM killer, a CI runner's hard kill) does not go on working on the hosts.

provision starts it before the run and keeps the write end of a pipe that only provision holds (the pipe's ends are
not inherited across exec, so ansible-playbook and ssh never hold it). When the run has ended its own way, provision
writes DONE and closes the pipe: the watchdog exits. An end of file without DONE means provision is gone: the watchdog
stops every process of the run (provision/run_processes.py: TERM, then KILL) and removes the run's private data dir,
where runner keeps the run's environment and events. Standard library only, so that it starts in milliseconds.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

from provision.run_processes import RUN_MARKER, stop_run

DONE = b"done\n"


def watch(fd: int, private_dir: str) -> bool:
    """Wait until the pipe closes; False when provision said DONE, True when it went without a word and the run was
    stopped and its private data dir removed."""
    said = b""
    while chunk := os.read(fd, 64):
        said += chunk
    if said == DONE:
        return False
    stop_run(private_dir)
    shutil.rmtree(private_dir, ignore_errors=True)
    return True


@contextlib.contextmanager
def watched(private_dir: Path) -> Iterator[None]:
    """The run in `private_dir` under a watchdog, for as long as the block runs."""
    read_end, write_end = os.pipe()
    env = {k: v for k, v in os.environ.items() if k != RUN_MARKER}
    try:
        subprocess.Popen(
            [sys.executable, "-m", "provision.watchdog", str(private_dir)],
            stdin=read_end, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            start_new_session=True, env=env, close_fds=True,
        )  # fmt: skip
    finally:
        os.close(read_end)
    try:
        yield
    finally:
        with contextlib.suppress(OSError):
            os.write(write_end, DONE)
        os.close(write_end)


if __name__ == "__main__":
    watch(sys.stdin.fileno(), sys.argv[1])
