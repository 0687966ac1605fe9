"""plugins/modules/provision_state.py run as Ansible runs a module: a JSON args file."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.loaders import REPO
from tests.unit import collection

PLUGINS = REPO / "plugins"
MODULE = PLUGINS / "modules" / "provision_state.py"
FINGERPRINT = PLUGINS / "module_utils" / "provision_fingerprint.py"
# as AnsiballZ does: the collection importable as ansible_collections.provision.pve_sglang
RUNNER = "import sys, runpy; sys.path.insert(0, sys.argv.pop(1)); runpy.run_path(sys.argv.pop(1), run_name='__main__')"


def call(tmp_path: Path, module: Path, **args) -> dict:
    args_file = tmp_path / "args.json"
    args_file.write_text(json.dumps({"ANSIBLE_MODULE_ARGS": args}))
    argv = [sys.executable, "-c", RUNNER, str(collection.COLLECTIONS), str(module), str(args_file)]
    proc = subprocess.run(argv, capture_output=True, text=True)
    assert proc.stdout, proc.stderr
    return json.loads(proc.stdout)


def run(tmp_path: Path, state_dir: Path, version: str = "1.0", check: bool = False, diff: bool = False, **more):
    return call(
        tmp_path,
        MODULE,
        dir=str(state_dir),
        phase="kernel",
        version=version,
        _ansible_check_mode=check,
        _ansible_diff=diff,
        **more,
    )


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
    assert out["changed"] is True and '"1.0"' in out["diff"][0]["before"] and '"2.0"' in out["diff"][0]["after"]
    (state_dir / "kernel.json").chmod(0o666)
    assert run(tmp_path, state_dir, version="2.0")["changed"] is True
    assert oct((state_dir / "kernel.json").stat().st_mode & 0o7777) == "0o644"


def _module():
    return collection.module("provision_state")


def test_the_record_keeps_the_bytes_that_to_nice_json_wrote():
    # hosts converged before this module existed must not show a change
    provision_state = _module()
    from ansible.plugins.filter.core import to_nice_json

    data = {"phase": "gpu", "provision_version": "0.1.0"}
    assert provision_state.record_text("gpu", "0.1.0") == to_nice_json(data) + "\n"


@pytest.mark.skipif(os.geteuid() != 0, reason="the record is owned by root")
def test_a_recorded_fingerprint_holds_until_a_watched_path_changes(tmp_path):
    state_dir, watched = tmp_path / "state", tmp_path / "etc"
    watched.mkdir()
    (watched / "a.cfg").write_text("one")
    fingerprint = {"name": "kernel", "inputs": "in-1", "watch": [f"{watched}/*.cfg", str(tmp_path / "absent")]}
    first = run(tmp_path, state_dir, fingerprint=fingerprint)
    assert first["changed"] is True and first["fingerprint_written"] is True  # the kernel.json record changed
    path = state_dir / "fingerprint" / "kernel.json"
    assert oct(path.stat().st_mode & 0o7777) == "0o600"
    assert oct(path.parent.stat().st_mode & 0o7777) == "0o700"
    assert run(tmp_path, state_dir, fingerprint=fingerprint)["fingerprint_written"] is False
    fingerprint["inputs"] = "in-2"
    again = run(tmp_path, state_dir, fingerprint=fingerprint)
    assert again["fingerprint_written"] is True and again["changed"] is False, "a fingerprint alone is no change"
    fingerprint["inputs"] = "in-1"
    run(tmp_path, state_dir, fingerprint=fingerprint)

    def facts():
        # as tasks/facts.yml runs it through ansible.builtin.raw: the file's text as a script, system python3
        argv = ["python3", "-c", FINGERPRINT.read_text(), "read", str(state_dir)]
        return json.loads(subprocess.run(argv, capture_output=True, text=True, check=True).stdout)["fingerprints"]

    assert facts() == {"kernel": {"inputs": "in-1", "current": True}}
    (watched / "a.cfg").write_text("two")
    assert facts()["kernel"]["current"] is False, "a changed file must break the fingerprint"
    (watched / "a.cfg").write_text("one")
    assert facts()["kernel"]["current"] is True
    (watched / "b.cfg").write_text("new")
    assert facts()["kernel"]["current"] is False, "a new file under a watched pattern must break it"
    (watched / "b.cfg").unlink()
    (tmp_path / "absent").write_text("now here")
    assert facts()["kernel"]["current"] is False, "a watched path that appeared must break it"
    (tmp_path / "absent").unlink()
    (watched / "a.cfg").chmod(0o600)
    assert facts()["kernel"]["current"] is False, "a mode change must break it"


@pytest.mark.skipif(os.geteuid() != 0, reason="the record is owned by root")
def test_a_fingerprint_alone_writes_no_phase_record(tmp_path):
    state_dir = tmp_path / "state"
    fingerprint = {"name": "gpu@sglang-01", "inputs": "x", "watch": ["/proc/cmdline"]}
    out = call(tmp_path, MODULE, dir=str(state_dir), fingerprint=fingerprint)
    assert out["fingerprint_written"] is True and out["changed"] is False and "path" not in out
    assert sorted(p.name for p in state_dir.rglob("*")) == ["fingerprint", "gpu@sglang-01.json"]


@pytest.mark.skipif(os.geteuid() != 0, reason="the record is owned by root")
def test_a_directory_made_by_another_writer_in_between_is_no_error(tmp_path, monkeypatch):
    """Found by the fleet measure: containers recording their parts on one node at once raced to create
    the fingerprint directory, and the loser's module died with FileExistsError. Here the other writer
    wins between the check and the creation, every time."""
    module = _module()
    directory = tmp_path / "state" / "fingerprint"
    directory.mkdir(parents=True)
    real_isdir, asked = os.path.isdir, []

    def isdir_before_the_other_writer(path):  # the first look: not there yet
        asked.append(path)
        return real_isdir(path) if len(asked) > 1 else False

    monkeypatch.setattr(module.os.path, "isdir", isdir_before_the_other_writer)
    module.write(str(directory / "gpu@sglang-04.json"), "{}\n", 0o600, 0o700)
    assert (directory / "gpu@sglang-04.json").read_text() == "{}\n"
    assert oct(directory.stat().st_mode & 0o7777) == "0o700"
