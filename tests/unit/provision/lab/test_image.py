"""Labs that come up at once (one per pytest-xdist worker in CI) take turns with the lab's cache
(provision/lab/image.py, `cache_lock`): the second waits, says so, and goes on once the first is done."""

from __future__ import annotations

import os
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
