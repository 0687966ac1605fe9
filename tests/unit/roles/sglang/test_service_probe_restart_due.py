"""A restart a stopped run did not do is still due: the sglang role's service_probe.py `stale` names what changed
since the unit's main process started (systemd's ExecMainStartTimestampMonotonic), run as the role runs it, with a
systemctl that answers as systemd does for a unit started ten seconds ago."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

from tests.loaders import repo_file

PROBE = repo_file("roles/sglang/files/service_probe.py").__file__


def stale(tmp_path, state: str, started_ago: float, *patterns: str) -> dict:
    started = int((time.monotonic() - started_ago) * 1e6) if state == "active" else 0
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    systemctl = bin_dir / "systemctl"
    systemctl.write_text(f"#!/bin/sh\necho ActiveState={state}\necho ExecMainStartTimestampMonotonic={started}\n")
    systemctl.chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}"}
    argv = [sys.executable, PROBE, "stale", "sglang", json.dumps(list(patterns))]
    return json.loads(subprocess.run(argv, env=env, capture_output=True, text=True, check=True).stdout)


def test_what_changed_after_the_server_started_is_named(tmp_path):
    conf = tmp_path / "etc"
    conf.mkdir()
    (conf / "environment").write_text("A=1\n")
    old = time.time() - 60
    (conf / "secrets.yaml").write_text("{}\n")
    os.utime(conf / "secrets.yaml", (old, old))
    unit = tmp_path / "sglang.service"
    unit.write_text("[Service]\n")
    os.utime(unit, (old, old))
    found = stale(tmp_path, "active", 10, str(unit), f"{conf}/*")
    assert found == {"active": True, "newer": [str(conf / "environment")]}


def test_nothing_is_due_where_everything_predates_the_start_or_the_unit_does_not_run(tmp_path):
    path = tmp_path / "sglang.service"
    path.write_text("[Service]\n")
    assert stale(tmp_path, "active", -5, str(path)) == {"active": True, "newer": []}  # started after the write
    assert stale(tmp_path, "inactive", 0, str(path)) == {"active": False, "newer": []}
