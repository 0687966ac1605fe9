"""The NVIDIA userspace installer runs as root only from a root-only directory and only when its sha256 is the
inventory's: the role's userspace tasks through ansible-playbook on this machine, the installer a shell
script that leaves a mark where it ran. Runs as root (CI does), as the role's root-owned directory needs."""

from __future__ import annotations

import hashlib
import os
import stat
import subprocess
from pathlib import Path

import pytest

from tests.playbooks import role_outcome_playbook, run_role_playbook
from tests.unit.collection import COLLECTIONS

VERSION = "580.95.05"
PLAYBOOK = role_outcome_playbook("gpu_passthrough", "The container's userspace step", tasks_from="userspace.yml")

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="the role makes a root-owned directory: run as root")


def installer(tmp_path: Path, bindir: Path, marker: Path) -> Path:
    """Stands in for NVIDIA-Linux-x86_64-<v>.run: writes `marker`, and an nvidia-smi that reports VERSION."""
    script = tmp_path / "source" / f"NVIDIA-Linux-x86_64-{VERSION}.run"
    script.parent.mkdir(exist_ok=True)
    smi = f"#!/bin/sh\necho 'DRIVER version                      : {VERSION}'\n"
    script.write_text(
        f'#!/bin/sh\nset -eu\necho "$0 $*" >> {marker}\n'
        f"cat > {bindir}/nvidia-smi <<'EOF'\n{smi}EOF\nchmod 0755 {bindir}/nvidia-smi\n"
    )
    return script


def run(tmp_path: Path, source: Path, sha256: str, bindir: Path) -> str | None:
    extra = {
        "provision_state_dir": str(tmp_path / "state"),
        "gpu_passthrough_node_driver": VERSION,
        "gpu_passthrough_userspace_installer": str(source),
        "gpu_passthrough_userspace_installer_sha256": sha256,
    }
    env = {**os.environ, "PATH": f"{bindir}:{os.environ['PATH']}"}

    def sh(command: str, check: bool) -> subprocess.CompletedProcess:
        return subprocess.run(["bash", "-c", command], env=env, capture_output=True, text=True, check=check)

    return run_role_playbook(sh, tmp_path, PLAYBOOK, extra, COLLECTIONS)["failed"]


@pytest.fixture
def setup(tmp_path):
    bindir = tmp_path / "bin"
    bindir.mkdir()
    marker = tmp_path / "ran"
    source = installer(tmp_path, bindir, marker)
    return {
        "bindir": bindir,
        "marker": marker,
        "source": source,
        "sha256": hashlib.sha256(source.read_bytes()).hexdigest(),
        "target": tmp_path / "state" / "downloads" / source.name,
    }


def test_no_checksum_refuses_before_anything_is_copied_or_run(tmp_path, setup):
    failed = run(tmp_path, setup["source"], "", setup["bindir"])
    assert failed == (
        "localhost: gpu_passthrough_userspace_installer_sha256 must be the sha256 of "
        f"NVIDIA-Linux-x86_64-{VERSION}.run (64 hex digits; `sha256sum` of the file NVIDIA publishes for the node's "
        "driver): the installer runs as root and is checked against it first"
    )
    assert not setup["marker"].exists() and not (tmp_path / "state").exists()


def test_a_wrong_checksum_removes_the_file_and_runs_nothing(tmp_path, setup):
    wrong = "0" * 64
    failed = run(tmp_path, setup["source"], wrong, setup["bindir"])
    assert failed == (
        f"localhost: {setup['source']} has sha256 {setup['sha256']}, not gpu_passthrough_userspace_installer_sha256 "
        f"({wrong}); it was removed and not run"
    )
    assert not setup["marker"].exists() and not setup["target"].exists()


def test_the_checked_installer_runs_from_a_root_only_directory_and_a_planted_one_is_replaced(tmp_path, setup):
    downloads = setup["target"].parent
    downloads.mkdir(parents=True)
    setup["target"].write_text(f"#!/bin/sh\necho planted >> {setup['marker']}\n")  # a file already there
    assert run(tmp_path, setup["source"], setup["sha256"].upper(), setup["bindir"]) is None
    assert setup["marker"].read_text().split() == [str(setup["target"]), "--silent", "--no-kernel-module"]
    mode = downloads.stat()
    assert stat.S_IMODE(mode.st_mode) == 0o700 and mode.st_uid == 0
    assert hashlib.sha256(setup["target"].read_bytes()).hexdigest() == setup["sha256"]
    # converged: the userspace reports the node's version, so nothing is copied or run again
    setup["marker"].unlink()
    assert run(tmp_path, setup["source"], setup["sha256"], setup["bindir"]) is None
    assert not setup["marker"].exists()


def run_with_node(tmp_path: Path, setup: dict, node_installer: str) -> str | None:
    """The role for a container whose node pins VERSION with `node_installer` and the installer's sha256, and none of
    the container's own installer variables set."""
    import json

    node = {
        "nvidia_driver_version": VERSION,
        "nvidia_driver_installer_sha256": setup["sha256"],
        "nvidia_driver_installer": node_installer,
    }
    inventory = {
        "all": {"hosts": {"localhost": {"ansible_connection": "local", "proxmox_host": "node1"}, "node1": node}}
    }
    (tmp_path / "inventory.json").write_text(json.dumps(inventory))
    extra = {"provision_state_dir": str(tmp_path / "state"), "gpu_passthrough_node_driver": VERSION}
    env = {**os.environ, "PATH": f"{setup['bindir']}:{os.environ['PATH']}"}

    def sh(command: str, check: bool) -> subprocess.CompletedProcess:
        command = command.replace(" -i localhost,", f" -i {tmp_path / 'inventory.json'}")
        return subprocess.run(["bash", "-c", command], env=env, capture_output=True, text=True, check=check)

    return run_role_playbook(sh, tmp_path, PLAYBOOK, extra, COLLECTIONS)["failed"]


def test_by_default_the_container_installs_the_nodes_own_file_from_the_nodes_source(tmp_path, setup):
    """The node pins VERSION with its installer on a mirror (nvidia_driver_installer) and its sha256: the container's
    userspace, with neither of its own variables set, comes from the same source, checked against the same sha256
    (one rule, roles/gpu_passthrough vars `_gpu_passthrough_node_pinned`), not from NVIDIA's site."""
    source = str(setup["source"]).replace(VERSION, "{{ nvidia_driver_version }}")
    assert run_with_node(tmp_path, setup, source) is None
    assert setup["marker"].read_text().split() == [str(setup["target"]), "--silent", "--no-kernel-module"]


def test_a_local_source_missing_in_the_container_is_named_with_the_variable_and_runs_nothing(tmp_path, setup):
    """An offline site's node reads its installer from a path on the node (nvidia_driver_installer): by default the
    container's source is that path, which the container does not see. One line names the variable, the path and the
    node it came from, and nothing is copied or run (the container's default installer on an offline site)."""
    missing = str(tmp_path / "mirror-on-the-node" / f"NVIDIA-Linux-x86_64-{VERSION}.run")
    assert run_with_node(tmp_path, setup, missing) == (
        f"localhost: gpu_passthrough_userspace_installer is {missing}, which is not a file on localhost; it is "
        "node1's nvidia_driver_installer, a path on that node: set gpu_passthrough_userspace_installer to a URL, or "
        "to a path inside the container (an mpN bind mount of the mirror)"
    )
    assert not setup["marker"].exists() and not setup["target"].exists()
