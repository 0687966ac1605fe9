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


def namespace_node(tmp_path: Path):
    """A private mount namespace over this machine standing in for a node (its /etc, /usr, /var/lib and /run are
    overlays: tests/unit/test_lab_nvidia_installer.py), with the lab's dkms status stand-in and an update-initramfs
    that records its calls; each run is a new namespace, as after a boot, where the lab's boot unit loads what DKMS
    installed. Returns (sh for run_role_playbook, the outputs of the runs)."""
    (tmp_path / "ns").mkdir()
    ns = Namespace(tmp_path / "ns")
    dkms = OVERLAY / "usr" / "local" / "sbin" / "dkms"
    ns.setup += (
        f" && printf '#!/bin/sh\\nexec {sys.executable} {dkms} \"$@\"\\n' > /usr/local/sbin/dkms"
        " && printf '#!/bin/sh\\necho \"$*\" >> /run/initramfs-calls\\n' > /usr/local/sbin/update-initramfs"
        # no systemd here, and no NVIDIA unit installed: `systemctl stop` answers as for a unit not loaded (exit 5)
        " && printf '#!/bin/sh\\necho \"Unit $3 not loaded.\" >&2; exit 5\\n' > /usr/local/sbin/systemctl"
        " && chmod 0755 /usr/local/sbin/dkms /usr/local/sbin/update-initramfs /usr/local/sbin/systemctl"
        " && mkdir -p /etc/modprobe.d"  # kmod's, on every PVE node; this machine has no kmod
        " && /usr/local/lib/lab/fake-nvidia.sh"
    )
    runs = []

    def sh(command: str, check: bool) -> subprocess.CompletedProcess:
        proc = ns.run(f"{command}; echo \"== initramfs\"; cat /run/initramfs-calls 2>/dev/null; "
                      "echo \"== version\"; cat /proc/driver/nvidia/version 2>/dev/null; "
                      "echo \"== dkms\"; dkms status -m nvidia; "
                      "echo \"== blacklist\"; cat /etc/modprobe.d/provision-blacklist-nouveau.conf")  # fmt: skip
        runs.append(proc.stdout)
        return proc

    return sh, runs


def pinned(tmp_path: Path, version: str) -> dict:
    installer = wheelhouse.build_fake_nvidia_installer(tmp_path, version)
    return {
        "provision_state_dir": str(tmp_path / "state"),
        "nvidia_driver_version": version,
        "nvidia_driver_installer": str(installer),
        "nvidia_driver_installer_sha256": hashlib.sha256(installer.read_bytes()).hexdigest(),
        "nvidia_driver_headers_packages": [],
        "nvidia_driver_packages": [],
        "nvidia_driver_persistenced": False,
    }  # fmt: skip  (no systemd here)


@pytest.mark.skipif(not shutil.which("unshare"), reason="needs unshare (a private mount namespace)")
def test_a_bare_machine_gets_the_driver_and_a_second_run_changes_nothing(tmp_path):
    """The whole role, for real, with the lab's stand-in installer from a local mirror."""
    sh, runs = namespace_node(tmp_path)
    extra = pinned(tmp_path, VERSION)
    first = run_role_playbook(sh, tmp_path, PLAYBOOK, extra, COLLECTIONS)
    assert first["failed"] is None, runs[-1][-3000:]
    assert "Run the NVIDIA installer with DKMS" in changed_tasks(runs[-1])
    assert "== initramfs\n-u -k all\n" in runs[-1]
    assert f"x86_64  {VERSION}" in runs[-1].split("== version")[1]
    assert "blacklist nouveau\noptions nouveau modeset=0\n" in runs[-1].split("== blacklist")[1]
    second = run_role_playbook(sh, tmp_path, PLAYBOOK, extra, COLLECTIONS)
    assert second["failed"] is None, runs[-1][-3000:]
    assert second["reason"].endswith("installed, registered with DKMS and loaded")
    assert changed_tasks(runs[-1]) == [], runs[-1][-3000:]


@pytest.mark.skipif(not shutil.which("unshare"), reason="needs unshare (a private mount namespace)")
def test_an_upgrade_whose_old_module_stays_loaded_installs_and_asks_for_the_reboot(tmp_path):
    """With reboots off (--reboot never), a new pin beside a module that cannot be unloaded: the installer runs with
    --allow-installation-with-running-driver, DKMS holds the new version, the old one stays loaded, and the phase
    stops with one line saying so."""
    sh, runs = namespace_node(tmp_path)
    assert run_role_playbook(sh, tmp_path, PLAYBOOK, pinned(tmp_path, VERSION), COLLECTIONS)["failed"] is None
    upgrade = {**pinned(tmp_path, "580.105.08"), "nvidia_driver_reboot": "never"}
    failed = run_role_playbook(sh, tmp_path, PLAYBOOK, upgrade, COLLECTIONS)["failed"]
    assert failed == (
        f"localhost: driver 580.105.08 is installed but {VERSION} stays loaded (held by a process), and "
        "nvidia_driver_reboot is never (--reboot never): reboot the node to load it"
    ), runs[-1][-3000:]
    assert "Run the NVIDIA installer with DKMS" in changed_tasks(runs[-1])
    assert "nvidia/580.105.08, " in runs[-1].split("== dkms")[1] and f"nvidia/{VERSION}" not in runs[-1]
    assert f"x86_64  {VERSION}" in runs[-1].split("== version")[1]
