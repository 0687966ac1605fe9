"""The driver phase's role up to its installer, run through ansible-playbook on this machine: a wrong sha256 stops it
before anything is installed, naming the file and the variable; a pin below the CUDA 13 floor stops it before
anything is read or fetched. Runs as root (CI does), as the role's root-only download directory needs."""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from provision.lab import wheelhouse
from tests.playbooks import role_outcome_playbook, run_role_playbook
from tests.unit.collection import COLLECTIONS
from tests.unit.test_lab_nvidia_installer import OVERLAY, Namespace

VERSION = "580.95.05"
PLAYBOOK = role_outcome_playbook(
    "nvidia_driver", "The driver phase", extra_outcome=", 'reason': _nvidia_driver_state.decision.reason | default('')"
)

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="the role makes a root-owned directory: run as root")


def run(tmp_path: Path, check: bool = False, **overrides) -> str | None:
    return outcome(tmp_path, check, **overrides)["failed"]


def outcome(tmp_path: Path, check: bool = False, **overrides) -> dict:
    source = tmp_path / "mirror" / f"NVIDIA-Linux-x86_64-{VERSION}.run"
    marker = tmp_path / "ran"
    if not source.exists():
        source.parent.mkdir()
        source.write_text(f'#!/bin/sh\necho "$0 $*" >> {marker}\n')
    extra = {"provision_state_dir": str(tmp_path / "state"), "nvidia_driver_version": VERSION,
             "nvidia_driver_installer": str(source),
             "nvidia_driver_installer_sha256": hashlib.sha256(source.read_bytes()).hexdigest(),
             # nothing from apt, and no blacklist outside tmp_path: the run must stop before either anyway
             "nvidia_driver_headers_packages": [], "nvidia_driver_packages": ["provision-test-no-such-package"],
             "nvidia_driver_nouveau_blacklist": str(tmp_path / "blacklist.conf"), **overrides}  # fmt: skip

    def sh(command: str, check: bool) -> subprocess.CompletedProcess:
        command = command.replace(" -i localhost,", " --check -i localhost,") if check_mode else command
        return subprocess.run(["bash", "-c", command], capture_output=True, text=True, check=check)

    check_mode = check
    return run_role_playbook(sh, tmp_path, PLAYBOOK, extra, COLLECTIONS)


def test_a_wrong_sha256_stops_before_anything_is_installed_naming_the_file(tmp_path):
    wrong = "0" * 64
    failed = run(tmp_path, nvidia_driver_installer_sha256=wrong)
    source = tmp_path / "mirror" / f"NVIDIA-Linux-x86_64-{VERSION}.run"
    real = hashlib.sha256(source.read_bytes()).hexdigest()
    assert failed == (
        f"localhost: {source} has sha256 {real}, not nvidia_driver_installer_sha256 ({wrong}); "
        "it was removed and not run"
    )
    assert not (tmp_path / "ran").exists() and not (tmp_path / "blacklist.conf").exists()
    assert not (tmp_path / "state" / "downloads" / source.name).exists()


def test_a_pin_below_the_cuda_13_floor_stops_before_anything_is_fetched(tmp_path):
    failed = run(tmp_path, nvidia_driver_version="575.57.08")
    assert failed.startswith("localhost: nvidia_driver_version: 575.57.08 is older than 580.65.06, the CUDA 13 floor")
    assert not (tmp_path / "state").exists() and not (tmp_path / "blacklist.conf").exists()


def test_check_mode_reports_the_install_and_writes_nothing(tmp_path):
    found = outcome(tmp_path, check=True, nvidia_driver_packages=[])
    assert found["failed"] is None
    assert found["reason"].startswith("no NVIDIA kernel module installed for kernel ")
    assert not (tmp_path / "state").exists() and not (tmp_path / "blacklist.conf").exists()
    assert not (tmp_path / "ran").exists()


def changed_tasks(stdout: str) -> list[str]:
    """The names of the tasks ansible-playbook reported changed, but the test's own outcome file."""
    names, task = [], ""
    for line in stdout.splitlines():
        if line.startswith("TASK ["):
            task = line[6:].split("]")[0].split(" : ")[-1]  # without the role's prefix
        elif line.startswith("changed:") and task != "Write the outcome for the test":
            names.append(task)
    return names


@pytest.mark.skipif(not shutil.which("unshare"), reason="needs unshare (a private mount namespace)")
def test_a_bare_machine_gets_the_driver_and_a_second_run_changes_nothing(tmp_path):
    """The whole role, for real, in a private mount namespace over this machine (its /etc, /usr, /var/lib and /run
    are overlays: tests/unit/test_lab_nvidia_installer.py), with the lab's stand-in installer from a local mirror
    and the lab's dkms status stand-in; update-initramfs is a recorder. No systemd here: nvidia-persistenced is off."""
    (tmp_path / "ns").mkdir()
    ns = Namespace(tmp_path / "ns")
    dkms = OVERLAY / "usr" / "local" / "sbin" / "dkms"
    ns.setup += (
        f" && printf '#!/bin/sh\\nexec {sys.executable} {dkms} \"$@\"\\n' > /usr/local/sbin/dkms"
        " && printf '#!/bin/sh\\necho \"$*\" >> /run/initramfs-calls\\n' > /usr/local/sbin/update-initramfs"
        " && chmod 0755 /usr/local/sbin/dkms /usr/local/sbin/update-initramfs"
        " && mkdir -p /etc/modprobe.d"  # kmod's, on every PVE node; this machine has no kmod
        # each run is a new namespace, as a boot: the lab's boot unit loads what DKMS installed (nothing at first)
        " && /usr/local/lib/lab/fake-nvidia.sh"
    )
    installer = wheelhouse.build_fake_nvidia_installer(tmp_path, VERSION)
    extra = {"provision_state_dir": str(tmp_path / "state"), "nvidia_driver_version": VERSION,
             "nvidia_driver_installer": str(installer),
             "nvidia_driver_installer_sha256": hashlib.sha256(installer.read_bytes()).hexdigest(),
             "nvidia_driver_headers_packages": [], "nvidia_driver_packages": [],
             "nvidia_driver_persistenced": False}  # fmt: skip
    runs = []

    def sh(command: str, check: bool) -> subprocess.CompletedProcess:
        proc = ns.run(f"{command}; echo \"== initramfs\"; cat /run/initramfs-calls 2>/dev/null; "
                      "echo \"== version\"; cat /proc/driver/nvidia/version 2>/dev/null; "
                      "echo \"== blacklist\"; cat /etc/modprobe.d/provision-blacklist-nouveau.conf")  # fmt: skip
        runs.append(proc.stdout)
        return proc

    first = run_role_playbook(sh, tmp_path, PLAYBOOK, extra, COLLECTIONS)
    assert first["failed"] is None, runs[-1][-3000:]
    assert "Run the NVIDIA installer with DKMS" in changed_tasks(runs[-1])
    assert "== initramfs\n-u -k all\n" in runs[-1]
    assert f"x86_64  {VERSION}" in runs[-1].split("== version")[1]
    assert "blacklist nouveau\noptions nouveau modeset=0\n" in runs[-1].split("== blacklist")[1]
    # the namespace is new for each run: what the first left on the overlays' upper layers is what the second finds
    second = run_role_playbook(sh, tmp_path, PLAYBOOK, extra, COLLECTIONS)
    assert second["failed"] is None, runs[-1][-3000:]
    assert second["reason"].endswith("installed, registered with DKMS and loaded")
    assert changed_tasks(runs[-1]) == [], runs[-1][-3000:]
