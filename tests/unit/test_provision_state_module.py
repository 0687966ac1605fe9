"""roles/provision_state/library/provision_state.py run as Ansible runs a module: a JSON args file."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

MODULE = Path(__file__).resolve().parents[2] / "roles" / "provision_state" / "library" / "provision_state.py"


def run(tmp_path: Path, state_dir: Path, version: str = "1.0", check: bool = False, diff: bool = False) -> dict:
    args = {"dir": str(state_dir), "phase": "kernel", "version": version, "_ansible_check_mode": check,
            "_ansible_diff": diff}  # fmt: skip
    args_file = tmp_path / "args.json"
    args_file.write_text(json.dumps({"ANSIBLE_MODULE_ARGS": args}))
    proc = subprocess.run([sys.executable, str(MODULE), str(args_file)], capture_output=True, text=True)
    return json.loads(proc.stdout)


@pytest.mark.skipif(os.geteuid() != 0, reason="the record is owned by root")
def test_one_call_creates_the_directory_writes_once_and_then_changes_nothing(tmp_path):
    state_dir = tmp_path / "state"
    assert run(tmp_path, state_dir, check=True)["changed"] is True
    assert not state_dir.exists(), "check mode wrote something"
    assert run(tmp_path, state_dir)["changed"] is True
    record = state_dir / "kernel.json"
    assert json.loads(record.read_text()) == {"phase": "kernel", "provision_version": "1.0"}
    assert oct(record.stat().st_mode & 0o7777) == "0o644"
    mtime = record.stat().st_mtime_ns
    assert run(tmp_path, state_dir)["changed"] is False
    assert record.stat().st_mtime_ns == mtime, "an unchanged record was written again"


@pytest.mark.skipif(os.geteuid() != 0, reason="the record is owned by root")
def test_a_new_release_or_a_wrong_mode_is_a_change_with_a_diff(tmp_path):
    state_dir = tmp_path / "state"
    run(tmp_path, state_dir)
    out = run(tmp_path, state_dir, version="2.0", diff=True)
    assert out["changed"] is True and '"1.0"' in out["diff"]["before"] and '"2.0"' in out["diff"]["after"]
    (state_dir / "kernel.json").chmod(0o666)
    assert run(tmp_path, state_dir, version="2.0")["changed"] is True
    assert oct((state_dir / "kernel.json").stat().st_mode & 0o7777) == "0o644"


def test_the_record_keeps_the_bytes_that_to_nice_json_wrote():
    # hosts converged before this module existed must not show a change
    sys.path.insert(0, str(MODULE.parent))
    try:
        import provision_state
    finally:
        sys.path.pop(0)
    from ansible.plugins.filter.core import to_nice_json

    data = {"phase": "gpu", "provision_version": "0.1.0"}
    assert provision_state.record_text("gpu", "0.1.0") == to_nice_json(data) + "\n"
