"""Labs that come up at once (one per pytest-xdist worker in CI) take turns with the lab's cache
(provision/lab/image.py, `cache_lock`): the second waits, says so, and goes on once the first is done. A rootfs
build killed mid-way leaves no mount behind, and mounts an older killed build left are taken down before its tree is
removed."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time

from provision.lab import image

SECOND = """
import sys, time
from provision.lab.image import cache_lock
with cache_lock(progress=lambda msg: print(msg, flush=True)):
    print("entered", time.monotonic(), flush=True)
"""


def test_a_second_lab_waits_for_the_cache_until_the_first_releases_it(tmp_path, monkeypatch):
    monkeypatch.setenv("PROVISION_LAB_CACHE", str(tmp_path / "cache"))
    with image.cache_lock(progress=lambda msg: None):
        second = subprocess.Popen([sys.executable, "-c", SECOND], stdout=subprocess.PIPE, text=True, env={**os.environ})
        waiting = second.stdout.readline()
        time.sleep(1)
        assert second.poll() is None, "the second entered while the first held the cache"
        released = time.monotonic()
    out, _ = second.communicate(timeout=30)
    assert "waiting for another lab's bring-up" in waiting and str(tmp_path / "cache" / ".lock") in waiting
    assert float(out.split()[1]) >= released


def _mounted_under(tree) -> list[str]:
    with open("/proc/self/mountinfo") as f:
        return [p for p in (line.split()[4] for line in f) if p.startswith(f"{tree}/")]


def test_a_rootfs_build_killed_mid_way_leaves_no_mount_in_its_tree(tmp_path):
    """The build's command runs after image.PRIVATE_MOUNTS: a process of it that mounts /proc in the tree, as
    mmdebstrap does, and is killed with SIGKILL leaves nothing mounted there."""
    tree = tmp_path / "rootfs-x.tmp"
    (tree / "proc").mkdir(parents=True)
    mount = f"mount -t proc proc {tree}/proc && echo mounted && exec sleep 60"
    build = subprocess.Popen([*image.PRIVATE_MOUNTS, "sh", "-c", mount], stdout=subprocess.PIPE, text=True)
    assert build.stdout.readline().strip() == "mounted"
    with open(f"/proc/{build.pid}/mountinfo") as f:  # unshare and sh exec: the pid is the sleep's
        assert f"{tree}/proc" in f.read().split()
    os.kill(build.pid, signal.SIGKILL)
    build.wait(timeout=10)
    assert _mounted_under(tree) == []
    shutil.rmtree(tree)


def test_mounts_an_older_killed_build_left_are_taken_down_deepest_first(tmp_path):
    tree = tmp_path / "rootfs-x.tmp"
    (tree / "proc").mkdir(parents=True)
    (tree / "dev").mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "none", str(tree / "dev")], check=True)
    (tree / "dev" / "pts").mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "none", str(tree / "dev" / "pts")], check=True)
    subprocess.run(["mount", "-t", "proc", "proc", str(tree / "proc")], check=True)
    try:
        assert sorted(_mounted_under(tree)) == [f"{tree}/dev", f"{tree}/dev/pts", f"{tree}/proc"]
        unmounted = image.unmount_under(tree)
        assert unmounted.index(f"{tree}/dev/pts") < unmounted.index(f"{tree}/dev")
        assert _mounted_under(tree) == []
        shutil.rmtree(tree)  # nothing of another filesystem left to walk into
    finally:
        for point in reversed(sorted(_mounted_under(tree))):
            subprocess.run(["umount", "--lazy", point], check=False)
