"""A run's watchdog: a process of its own, in a session of its own, that outlives provision, so that a run whose
provision dies without a word (kill -9, the OOM killer, a CI runner's hard kill) does not go on working on the hosts.

provision starts it before the run and keeps the write end of a pipe that only provision holds (the pipe's ends are
not inherited across exec, so ansible-playbook and ssh never hold it). When the run has ended its own way, provision
writes DONE and closes the pipe: the watchdog exits. An end of file without DONE means provision is gone: the watchdog
stops every process of the run (provision/run_processes.py: TERM, then KILL) and removes the run's private data dir,
where runner keeps the run's environment and events. Standard library only, so that it starts in milliseconds.
Should the watchdog die with provision (a kill of the whole process group), the next run's start sweeps the dir.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import stat
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

from provision.run_processes import RUN_MARKER, run_processes, stop_run

DONE = b"done\n"
PREFIX = "provision-"  # a run's private data dir in $TMPDIR (provision/runner.py)
STALE_S = 60


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


def _named_by_a_process(private_dir: str) -> bool:
    """A process of the run (provision/run_processes.py), or one whose command line names the dir (its watchdog)."""
    if run_processes(private_dir):
        return True
    wanted = private_dir.encode()
    for proc in Path("/proc").iterdir():
        with contextlib.suppress(OSError):
            if proc.name.isdigit() and wanted in (proc / "cmdline").read_bytes():
                return True
    return False


def sweep(tmp: str | None = None, now: float | None = None) -> list[str]:
    """Remove the private data dirs of runs that are gone (provision and its watchdog killed together): this user's
    `provision-*` dirs with runner's settings file, untouched for STALE_S seconds, that no process names. Run at each
    run's start; what it removed."""
    now = time.time() if now is None else now
    removed = []
    for path in Path(tmp or tempfile.gettempdir()).glob(f"{PREFIX}*"):
        with contextlib.suppress(OSError):
            st = path.lstat()
            ours = stat.S_ISDIR(st.st_mode) and st.st_uid == os.getuid() and (path / "env" / "settings").is_file()
            if ours and now - st.st_mtime > STALE_S and not _named_by_a_process(str(path)):
                shutil.rmtree(path, ignore_errors=True)
                removed.append(str(path))
    return removed


@contextlib.contextmanager
def watched(private_dir: Path) -> Iterator[None]:
    """The run in `private_dir` under a watchdog, for as long as the block runs."""
    read_end, write_end = os.pipe()
    env = {k: v for k, v in os.environ.items() if k != RUN_MARKER}
    try:
        subprocess.Popen(
            [sys.executable, "-m", "provision.watchdog", str(private_dir)],
            stdin=read_end,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
            env=env,
            close_fds=True,
        )
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
