"""The lab's stand-in NVIDIA installer (provision/lab/standin/nvidia_installer.sh, built by
wheelhouse.build_fake_nvidia_installer) run for real, as root, in a private mount namespace whose /etc, /usr, /var
and /run are overlays on this machine's (nothing it writes reaches the machine): NVIDIA's flags taken and unknown ones
refused, the DKMS tree written so that the lab's `dkms status` stand-in (overlay/.../sbin/dkms) reads it as dkms
reads its own, the module "loaded" through the lab's fake driver, an upgrade refused while a module is loaded unless
--allow-installation-with-running-driver, and then left for a reboot; and the role's decision from what it leaves."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from provision.lab import wheelhouse
from provision.paths import module_util

OVERLAY = Path(wheelhouse.__file__).resolve().parent / "overlay" / "common"
rules = module_util("nvidia_driver")
V1, V2 = "580.95.05", "580.105.08"
ARGS = "--silent --dkms --no-questions --ui=none"

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0 or not shutil.which("unshare"), reason="needs root and unshare (a private mount namespace)"
)


class Namespace:
    """One shell in a private mount namespace with overlays on the directories the installer writes."""

    def __init__(self, tmp: Path):
        self.tmp = tmp
        mounts = []
        lowers = ("/etc", "/usr/bin", "/usr/src", "/usr/local", "/var/lib", "/var/log", "/run", "/usr/lib")
        for i, lower in enumerate(lowers):
            upper, work = tmp / f"upper{i}", tmp / f"work{i}"
            upper.mkdir()
            work.mkdir()
            mounts.append(f"mount -t overlay overlay -o lowerdir={lower},upperdir={upper},workdir={work} {lower}")
        lab = OVERLAY / "usr" / "local" / "lib" / "lab" / "fake-nvidia.sh"
        self.setup = " && ".join(
            [
                *mounts,
                "mkdir -p /usr/local/lib/lab /etc/lab /var/lib/dkms",
                f"cp {lab} /usr/local/lib/lab/fake-nvidia.sh",
                "echo 2 > /etc/lab/gpus",
            ]
        )

    def run(self, script: str) -> subprocess.CompletedProcess:
        body = f"set -e; {self.setup}; set +e; {script}"
        return subprocess.run(
            ["unshare", "--mount", "--propagation", "private", "sh", "-c", body],
            capture_output=True,
            text=True,
            timeout=60,
        )


@pytest.fixture
def ns(tmp_path):
    return Namespace(tmp_path)


@pytest.fixture
def installers(tmp_path):
    out = tmp_path / "mirror"
    out.mkdir()
    return {v: wheelhouse.build_fake_nvidia_installer(out, v) for v in (V1, V2)}


def dkms_status() -> str:
    return f"{sys.executable} {OVERLAY / 'usr' / 'local' / 'sbin' / 'dkms'} status -m nvidia"


def sections(out: str) -> dict[str, str]:
    """`== name` headed parts of a script's output."""
    found, name = {}, None
    for line in out.splitlines():
        if line.startswith("== "):
            name = line[3:]
            found[name] = ""
        elif name:
            found[name] += line + "\n"
    return found


def test_a_bare_node_gets_the_driver_registered_with_dkms_and_loaded(ns, installers):
    proc = ns.run(f"""sh {installers[V1]} {ARGS}; echo "== rc $?"
        echo "== version"; cat /proc/driver/nvidia/version
        echo "== dkms"; {dkms_status()}
        echo "== userspace"; cat /etc/lab/driver_version
        echo "== tools"; ls /usr/bin/nvidia-smi /usr/bin/nvidia-persistenced /usr/src/nvidia-{V1}/dkms.conf""")
    out = sections(proc.stdout)
    assert "== rc 0" in proc.stdout and proc.stderr == "", proc.stderr
    assert f"Kernel Module for x86_64  {V1}" in out["version"]
    kernel = os.uname().release
    assert out["dkms"] == f"nvidia/{V1}, {kernel}, {os.uname().machine}: installed\n"
    assert out["userspace"] == f"{V1}\n"
    # what the role reads from it: the pinned driver installed, registered with DKMS and loaded
    report = {
        "kernel": kernel,
        "loaded": rules.module_version(out["version"]),
        "nouveau_loaded": False,
        "dkms": rules.parse_dkms_status(out["dkms"]),
    }
    report["installed"] = rules.installed_version(None, report["dkms"], kernel)
    assert rules.decide(V1, report)["current"]


def test_an_unknown_flag_is_refused_before_anything_is_written(ns, installers):
    proc = ns.run(f"""sh {installers[V1]} --silent --dkms --bogus; echo "== rc $?"
        ls /var/lib/dkms/nvidia /etc/lab/driver_version 2>&1""")
    assert "== rc 1" in proc.stdout
    assert 'nvidia-installer: unrecognized option: "--bogus"' in proc.stderr
    assert "No such file" in proc.stdout.split("== rc 1")[1]


def test_an_upgrade_beside_a_loaded_module_needs_the_flag_and_then_a_reboot(ns, installers):
    proc = ns.run(f"""sh {installers[V1]} {ARGS} || exit 3
        sh {installers[V2]} {ARGS}; echo "== refused $?"
        echo "== dkms before"; {dkms_status()}
        sh {installers[V2]} {ARGS} --allow-installation-with-running-driver; echo "== allowed $?"
        echo "== dkms after"; {dkms_status()}
        echo "== loaded"; cat /proc/driver/nvidia/version
        umount /proc/driver; rm -rf /run/lab/driver; /usr/local/lib/lab/fake-nvidia.sh  # the reboot's module load
        echo "== after reboot"; cat /proc/driver/nvidia/version""")
    out = sections(proc.stdout)
    assert "== refused 1" in proc.stdout and "appears to be already loaded" in proc.stderr
    assert f"nvidia/{V1}" in out["dkms before"] and V2 not in out["dkms before"]
    assert "== allowed 0" in proc.stdout
    kernel = os.uname().release
    assert out["dkms after"] == f"nvidia/{V2}, {kernel}, {os.uname().machine}: installed\n"  # the old one removed
    assert rules.after_install(V2, rules.module_version(out["loaded"]))["reboot"]
    assert f"x86_64  {V2}" in out["after reboot"]


def test_the_container_userspace_install_leaves_no_module(ns, installers):
    proc = ns.run(f"""sh {installers[V1]} --silent --no-kernel-module; echo "== rc $?"
        echo "== userspace"; cat /etc/lab/driver_version
        echo "== dkms"; ls /var/lib/dkms/nvidia 2>&1; test -e /proc/driver/nvidia/version && echo loaded""")
    out = sections(proc.stdout)
    assert "== rc 0" in proc.stdout and out["userspace"] == f"{V1}\n"
    assert "No such file" in out["dkms"] and "loaded" not in out["dkms"]


def test_a_refusal_is_logged_as_nvidias_installer_logs_it(ns, installers):
    """The upgrade refused beside a loaded module: the reason is an `ERROR: ` line in /var/log/nvidia-installer.log,
    then the closing "Installation has failed." naming the log, as NVIDIA's installer writes them; the role's rule
    (last_installer_error) quotes the reason, not the closing line. --log-file-name moves the log."""
    proc = ns.run(f"""sh {installers[V1]} {ARGS} || exit 3
        sh {installers[V2]} {ARGS}; echo "== refused $?"
        echo "== log"; cat /var/log/nvidia-installer.log
        sh {installers[V2]} {ARGS} --log-file-name=/var/log/other.log
        echo "== moved"; grep -c ERROR /var/log/other.log""")
    out = sections(proc.stdout)
    assert "== refused 1" in proc.stdout
    errors = [line for line in out["log"].splitlines() if line.startswith("ERROR: ")]
    assert errors[-1].startswith(
        "ERROR: Installation has failed.  Please see the file '/var/log/nvidia-installer.log' for details."
    )
    assert rules.last_installer_error(out["log"]).startswith(
        "An NVIDIA kernel module 'nvidia' appears to be already loaded in your kernel."
    )
    assert out["log"].startswith("nvidia-installer log file '/var/log/nvidia-installer.log'")
    assert out["moved"] == "2\n"


def test_dkms_kernel_hook_builds_for_a_new_kernel_only_where_its_headers_are(ns, installers):
    """Debian's dkms kernel hook as the lab installs it (/etc/kernel/postinst.d/dkms, header_postinst.d/dkms): a new
    kernel without headers gets dkms's warning and no module, and its install goes on (exit 0); with the headers'
    build link and include directory, the hook's `dkms autoinstall` installs the AUTOINSTALL module for it."""
    new, arch = "6.99.0-1-lab", os.uname().machine
    stand_in, hook = OVERLAY / "usr" / "local" / "sbin" / "dkms", OVERLAY / "etc" / "kernel" / "postinst.d" / "dkms"
    proc = ns.run(f"""sh {installers[V1]} {ARGS} >/dev/null; mkdir -p /usr/local/sbin; cp {stand_in} /usr/local/sbin/
        echo "== without"; sh {hook} {new} 2>&1; echo "rc $?"; {dkms_status()} -k {new}
        echo "== refused"; /usr/local/sbin/dkms autoinstall --kernelver {new} 2>&1; echo "rc $?"
        mkdir -p /lib/modules/{new}/build/include
        echo "== with"; sh {hook} {new} 2>&1; echo "rc $?"
        echo "== status"; {dkms_status()} -k {new}""")
    out = sections(proc.stdout)
    assert out["without"] == (
        "dkms: WARNING: Linux headers are missing, which may explain the above failures.\n"
        f"      please install the linux-headers-{new} package to fix this.\nrc 0\nnvidia/{V1}: added\n"
    ), proc.stdout + proc.stderr
    assert out["refused"].endswith(f"(nvidia: no headers for {new})\nrc 11\n"), out["refused"]
    assert out["with"] == f"Installing /lib/modules/{new}/updates/dkms/nvidia.ko\nrc 0\n", out["with"]
    assert out["status"] == f"nvidia/{V1}, {new}, {arch}: installed\n"
