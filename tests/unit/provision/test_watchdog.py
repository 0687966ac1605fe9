"""The run's watchdog (provision/watchdog.py): the run stopped and its private data dir removed when provision goes
without a word, nothing done when it says DONE, and the dirs of runs killed with their watchdog swept later."""

from __future__ import annotations

import os
import subprocess
import time

from provision import watchdog
from provision.run_processes import RUN_MARKER, run_processes


def _private_dir(root, name: str, age_s: float = 0.0):
    path = root / f"{watchdog.PREFIX}{name}"
    (path / "env").mkdir(parents=True)
    (path / "env" / "settings").write_text("{}")
    (path / "env" / "secret").write_text("a secret runner kept")
    then = time.time() - age_s
    os.utime(path, (then, then))
    return path


def test_provision_gone_without_a_word_stops_the_run_and_removes_its_private_dir(tmp_path):
    private = _private_dir(tmp_path, "gone")
    child = subprocess.Popen(["sleep", "60"], env={**os.environ, RUN_MARKER: str(private)}, start_new_session=True)
    read_end, write_end = os.pipe()
    os.close(write_end)  # provision died: the pipe's end of file, with no DONE
    try:
        assert watchdog.watch(read_end, str(private)) is True
        assert child.wait(timeout=10) is not None and run_processes(str(private)) == {}
        assert not private.exists()
    finally:
        child.kill()
        os.close(read_end)


def test_done_leaves_everything_alone(tmp_path):
    private = _private_dir(tmp_path, "done")
    read_end, write_end = os.pipe()
    os.write(write_end, watchdog.DONE)
    os.close(write_end)
    assert watchdog.watch(read_end, str(private)) is False and private.exists()
    os.close(read_end)


def test_the_sweep_removes_only_this_users_stale_private_dirs_that_no_process_names(tmp_path):
    stale = _private_dir(tmp_path, "stale", age_s=watchdog.STALE_S + 5)
    fresh = _private_dir(tmp_path, "fresh")
    named = _private_dir(tmp_path, "named", age_s=watchdog.STALE_S + 5)
    other = tmp_path / f"{watchdog.PREFIX}not-a-run"  # no runner settings: not one of ours
    other.mkdir()
    os.utime(other, (0, 0))
    holder = subprocess.Popen(["sh", "-c", "sleep 30", "watchdog", str(named)])  # a live watchdog names its dir
    try:
        assert watchdog.sweep(str(tmp_path)) == [str(stale)]
        assert not stale.exists() and fresh.exists() and named.exists() and other.exists()
    finally:
        holder.kill()
        holder.wait()
