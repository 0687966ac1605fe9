"""The driver phase's role, run through ansible-playbook on this machine (as root, as its root-only download
directory needs): its refusals (a wrong sha256, a pin below the CUDA 13 floor, a control character bound for the
persistenced unit) before anything is fetched or written; no pin, no management; and, on a node standing in a private
mount namespace, the whole role: the install and a second run that changes nothing, an upgrade that may not reboot
stopping before anything is stopped, a reinstall beside the loaded module, an installer failure in one line, and
check mode reporting each step it would take as a change."""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from provision.lab import wheelhouse
from provision.paths import module_util
from tests.playbooks import role_outcome_playbook, run_role_playbook
from tests.unit.collection import COLLECTIONS
from tests.unit.provision.lab.standin.test_nvidia_installer import OVERLAY, Namespace

VERSION = "580.95.05"
UPGRADE = "580.105.08"
BLACKLIST = "/etc/modprobe.d/provision-blacklist-nouveau.conf"  # the role's default
NAMESPACE = pytest.mark.skipif(not shutil.which("unshare"), reason="needs unshare (a private mount namespace)")
PLAYBOOK = role_outcome_playbook(
    "nvidia_driver", "The driver phase", extra_outcome=", 'reason': _nvidia_driver_state.decision.reason | default('')"
)

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="the role makes a root-owned directory: run as root")


UNSET = object()  # an override that leaves the variable out of the inventory


def run(tmp_path: Path, check: bool = False, **overrides) -> str | None:
    return outcome(tmp_path, check, **overrides)["failed"]


def outcome(tmp_path: Path, check: bool = False, runs: list | None = None, **overrides) -> dict:
    source = tmp_path / "mirror" / f"NVIDIA-Linux-x86_64-{VERSION}.run"
    marker = tmp_path / "ran"
    if not source.exists():
        source.parent.mkdir()
        source.write_text(f'#!/bin/sh\necho "$0 $*" >> {marker}\n')
    extra = {
        "provision_state_dir": str(tmp_path / "state"),
        "nvidia_driver_version": VERSION,
        "nvidia_driver_installer": str(source),
        "nvidia_driver_installer_sha256": hashlib.sha256(source.read_bytes()).hexdigest(),
        # nothing from apt, and no blacklist outside tmp_path: the run must stop before either anyway
        "nvidia_driver_headers_packages": [],
        "nvidia_driver_packages": ["provision-test-no-such-package"],
        "nvidia_driver_nouveau_blacklist": str(tmp_path / "blacklist.conf"),
        **overrides,
    }
    extra = {k: v for k, v in extra.items() if v is not UNSET}

    def sh(command: str, check: bool) -> subprocess.CompletedProcess:
        command = command.replace(" -i localhost,", " --check -i localhost,") if check_mode else command
        proc = subprocess.run(["bash", "-c", command], capture_output=True, text=True, check=check)
        if runs is not None:
            runs.append(proc.stdout)
        return proc

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


@pytest.mark.parametrize("pin", [UNSET, ""], ids=["unset", "empty"])
def test_no_pin_means_the_driver_is_not_managed_and_the_phase_skips_the_node_saying_so(tmp_path, pin):
    """An inventory that pins no driver (inventory/prod leaves it commented out): the node is read and reported in
    one line, nothing is fetched, written or installed, and the phase does not fail."""
    runs = []
    found = outcome(
        tmp_path,
        runs=runs,
        nvidia_driver_version=pin,
        nvidia_driver_installer=UNSET,
        nvidia_driver_installer_sha256=UNSET,
    )
    assert found["failed"] is None, runs[-1][-3000:]
    assert found["reason"].startswith("driver not managed (nvidia_driver_version is not set), skipped: ")
    assert reports(runs[-1]) == [found["reason"]]
    assert changed_tasks(runs[-1]) == []
    assert not (tmp_path / "state").exists() and not (tmp_path / "blacklist.conf").exists()
    assert not (tmp_path / "ran").exists()


def test_a_control_character_in_the_persistenced_user_stops_before_anything_is_written(tmp_path):
    """nvidia_driver_persistenced_user goes into the unit's ExecStart=: a newline would add a directive."""
    failed = run(tmp_path, nvidia_driver_persistenced_user="root\nExecStartPre=/bin/touch /tmp/x")
    assert failed == "localhost: nvidia_driver_persistenced_user holds a control character (newline, tab, ...)"
    assert not (tmp_path / "state").exists() and not (tmp_path / "blacklist.conf").exists()


def test_check_mode_reports_the_install_and_writes_nothing(tmp_path):
    found = outcome(tmp_path, check=True, nvidia_driver_packages=[])
    assert found["failed"] is None
    assert found["reason"].startswith("no NVIDIA kernel module installed for kernel ")
    assert not (tmp_path / "state").exists() and not (tmp_path / "blacklist.conf").exists()
    assert not (tmp_path / "ran").exists()


def reports(stdout: str) -> list[str]:
    """The provision_report lines the run printed (ansible.builtin.debug's default callback output)."""
    import re

    return [" ".join(m.split()) for m in re.findall(r'"provision_report": "(.*)"', stdout)]


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
    """A private mount namespace over this machine standing in for a node (its /etc, /usr, /var/lib, /var/log and /run
    are overlays: tests/unit/provision/lab/standin/test_nvidia_installer.py), with the lab's dkms status stand-in and an
    update-initramfs, a systemctl and a modprobe that record their calls (this machine has neither systemd nor kmod);
    each run is a new namespace, as after a boot, where the lab's boot unit loads what DKMS installed. Returns (sh for
    run_role_playbook, the outputs of the runs); sh.check: the playbooks run in check mode; sh.before (a shell
    command) runs first in the next run's namespace, to leave the node as the test needs it."""
    (tmp_path / "ns").mkdir()
    ns = Namespace(tmp_path / "ns")
    stubs = tmp_path / "stubs"
    stubs.mkdir()
    dkms = OVERLAY / "usr" / "local" / "sbin" / "dkms"
    (stubs / "dkms").write_text(f'#!/bin/sh\nexec {sys.executable} {dkms} "$@"\n')
    (stubs / "update-initramfs").write_text('#!/bin/sh\necho "$*" >> /run/initramfs-calls\n')
    # no NVIDIA unit installed: `systemctl stop` answers as for a unit not loaded (exit 5)
    (stubs / "systemctl").write_text(
        '#!/bin/sh\necho "$*" >> /run/systemctl-calls\necho "Unit $3 not loaded." >&2\nexit 5\n'
    )
    # the lab's module cannot be unloaded (as one a CUDA process holds); a load loads what DKMS installed
    (stubs / "modprobe").write_text(
        '#!/bin/sh\necho "$*" >> /run/modprobe-calls\n'
        'if [ "$1" = -r ]; then echo "modprobe: FATAL: Module nvidia is in use." >&2; exit 1; fi\n'
        "exec /usr/local/lib/lab/fake-nvidia.sh\n"
    )
    # its own /boot (empty at first: it boots the running kernel next) and /lib/modules (no kernel headers)
    boot, upper, work = (tmp_path / "ns" / name for name in ("boot", "lib-upper", "lib-work"))
    for path in (boot, upper, work):
        path.mkdir()
    ns.setup += f" && mount --bind {boot} /boot && mount -t overlay overlay -o lowerdir=/usr/lib,upperdir={upper},"
    ns.setup += f"workdir={work} /usr/lib && mkdir -p /usr/lib/modules"
    ns.setup += (
        f" && install -m 0755 {stubs}/* /usr/local/sbin/"
        " && mkdir -p /etc/modprobe.d"  # kmod's, on every PVE node
        " && /usr/local/lib/lab/fake-nvidia.sh"
    )
    runs = []

    def sh(command: str, check: bool) -> subprocess.CompletedProcess:
        if sh.check:
            command = command.replace(" -i localhost,", " --check -i localhost,")
        before, sh.before = sh.before, ":"
        reads = (
            ("initramfs", "cat /run/initramfs-calls"),
            ("version", "cat /proc/driver/nvidia/version"),
            ("dkms", "dkms status -m nvidia"),
            ("systemctl", "cat /run/systemctl-calls"),
            ("modprobe", "cat /run/modprobe-calls"),
            ("blacklist", f"cat {BLACKLIST}"),
        )
        show = "; ".join(f'echo "== {name}"; {read} 2>/dev/null' for name, read in reads)
        calls = "/run/initramfs-calls /run/systemctl-calls /run/modprobe-calls"
        # the playbook's exit status is the run's: the reads after it say what it left
        proc = ns.run(f"rm -f {calls}; {before}; {command}; rc=$?; {show}; exit $rc")
        runs.append(proc.stdout)
        return proc

    sh.before, sh.check = ":", False
    return sh, runs


def section(out: str, name: str) -> str:
    """One `== name` part of what a namespace run printed after the playbook."""
    found, inside = [], False
    for line in out.splitlines():
        if line.startswith("== "):
            inside = line == f"== {name}"
        elif inside:
            found.append(line)
    return "\n".join(found)


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
    }  # (no systemd here)


@NAMESPACE
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


NEXT = "6.99.1-1-pve"  # a kernel update's, newer than whatever this machine runs


@NAMESPACE
def test_a_kernel_installed_without_its_headers_gets_the_module_before_the_node_boots_it(tmp_path):
    """The node boots a newer kernel next (GRUB's default entry after a kernel update) whose headers were not
    installed, so DKMS built no module for it: the phase stops naming that kernel and DKMS's own words. With its
    headers there, the phase builds and installs the pinned driver for it (the running kernel's untouched), and a
    second run changes nothing."""
    sh, runs = namespace_node(tmp_path)
    extra = pinned(tmp_path, VERSION)
    assert run_role_playbook(sh, tmp_path, PLAYBOOK, extra, COLLECTIONS)["failed"] is None, runs[-1][-3000:]
    grub_cfg = f"menuentry pve {{\\n  linux /boot/vmlinuz-{NEXT} root=/dev/x ro\\n}}\\n"
    sh.before = f"mkdir -p /boot/grub && printf '{grub_cfg}' > /boot/grub/grub.cfg"
    failed = run_role_playbook(sh, tmp_path, PLAYBOOK, extra, COLLECTIONS)["failed"]
    assert failed == (
        f"localhost: the kernel the node boots next, {NEXT}, has no NVIDIA module and DKMS could not build driver "
        f"{VERSION} for it: Error! Your kernel headers for kernel {NEXT} cannot be found at /lib/modules/{NEXT}/build "
        f"or /lib/modules/{NEXT}/source. (install its headers, proxmox-headers-{NEXT}, then run apply again)"
    ), runs[-1][-3000:]
    sh.before = f"mkdir -p /lib/modules/{NEXT}/build"
    assert run_role_playbook(sh, tmp_path, PLAYBOOK, extra, COLLECTIONS)["failed"] is None, runs[-1][-3000:]
    assert changed_tasks(runs[-1]) == ["Build and install the NVIDIA module for the kernel the node boots next"]
    machine, running = os.uname().machine, os.uname().release
    assert section(runs[-1], "dkms").splitlines() == sorted(
        [f"nvidia/{VERSION}, {running}, {machine}: installed", f"nvidia/{VERSION}, {NEXT}, {machine}: installed"]
    )
    assert run_role_playbook(sh, tmp_path, PLAYBOOK, extra, COLLECTIONS)["failed"] is None, runs[-1][-3000:]
    assert changed_tasks(runs[-1]) == [], runs[-1][-3000:]


@NAMESPACE
def test_an_upgrade_that_may_not_reboot_stops_before_anything_is_stopped(tmp_path):
    """With reboots off (--reboot never), a new pin beside a loaded module of another version: only a reboot would load
    the new one wherever a process holds the old, so the phase stops first, in one line: no service stopped, no
    module unloaded, no installer run; DKMS and the loaded module as they were."""
    sh, runs = namespace_node(tmp_path)
    assert run_role_playbook(sh, tmp_path, PLAYBOOK, pinned(tmp_path, VERSION), COLLECTIONS)["failed"] is None
    upgrade = {**pinned(tmp_path, UPGRADE), "nvidia_driver_reboot": "never"}
    failed = run_role_playbook(sh, tmp_path, PLAYBOOK, upgrade, COLLECTIONS)["failed"]
    assert failed == (
        f"localhost: driver {VERSION} is loaded, and upgrading it to {UPGRADE} needs a reboot wherever a process holds "
        "it, but nvidia_driver_reboot is never (--reboot never): nothing was stopped or installed; run with --reboot "
        "auto, or stop what uses the GPUs and unload it (modprobe -r nvidia) first"
    ), runs[-1][-3000:]
    assert changed_tasks(runs[-1]) == []
    assert section(runs[-1], "systemctl") == "" and section(runs[-1], "modprobe") == ""
    assert section(runs[-1], "dkms").startswith(f"nvidia/{VERSION}, ") and UPGRADE not in section(runs[-1], "dkms")
    assert f"x86_64  {VERSION}" in section(runs[-1], "version")


# the node's firmware says Secure Boot is on (efivarfs: 4 bytes of attributes, then 1), and mokutil --test-key
# answers as mokutil does ("<file> is already enrolled" / "<file> is not enrolled") from a list of enrolled files
SECURE_BOOT = (
    "mount -t tmpfs tmpfs /sys/firmware && mkdir -p /sys/firmware/efi/efivars && printf '\\006\\000\\000\\000\\001' > "
    "/sys/firmware/efi/efivars/SecureBoot-8be4df61-93ca-11d2-aa0d-00e098032b8c"
    ' && printf \'#!/bin/sh\\nif grep -qxF "$2" /run/mok-enrolled 2>/dev/null; then echo "$2 is already enrolled";'
    ' else echo "$2 is not enrolled"; fi\\n\' > /usr/local/sbin/mokutil && chmod 0755 /usr/local/sbin/mokutil'
)


@NAMESPACE
def test_under_secure_boot_an_unenrolled_signing_key_stops_the_phase_before_anything_changes(tmp_path):
    """Secure Boot on, and DKMS's certificate missing, then not enrolled: the phase stops before the installer is
    fetched or run, naming MOK enrolment and the variable that opts out; enrolled, it installs; opted out, it builds."""
    sh, runs = namespace_node(tmp_path)
    extra = pinned(tmp_path, VERSION)
    sh.before = SECURE_BOOT
    failed = run_role_playbook(sh, tmp_path, PLAYBOOK, extra, COLLECTIONS)["failed"]
    assert failed == (
        "localhost: Secure Boot is on, and /var/lib/dkms/mok.pub does not exist yet (DKMS makes it, and its key, at "
        "its first build): the kernel would refuse the NVIDIA module signed with it; make it and its key first "
        "(openssl, as dkms's README shows under Module signing), then enrol it (mokutil --import "
        "/var/lib/dkms/mok.pub, then confirm in MokManager at the node's console as it reboots), or set "
        "nvidia_driver_secure_boot_check: false to build anyway; nothing was changed"
    ), runs[-1][-3000:]
    assert changed_tasks(runs[-1]) == [] and section(runs[-1], "dkms") == ""
    # a site's own certificate, named where dkms reads its configuration last
    conf_d = "/etc/dkms/framework.conf.d"
    site = f" && mkdir -p {conf_d} && echo mok_certificate=/root/MOK.der > {conf_d}/a.conf"
    sh.before = SECURE_BOOT + site
    failed = run_role_playbook(sh, tmp_path, PLAYBOOK, extra, COLLECTIONS)["failed"]
    assert failed.startswith("localhost: Secure Boot is on, and /root/MOK.der does not exist yet"), failed
    sh.before = SECURE_BOOT + f" && rm {conf_d}/a.conf && mkdir -p /var/lib/dkms && echo cert > /var/lib/dkms/mok.pub"
    failed = run_role_playbook(sh, tmp_path, PLAYBOOK, extra, COLLECTIONS)["failed"]
    assert failed.startswith("localhost: Secure Boot is on, and /var/lib/dkms/mok.pub is not an enrolled MOK: "), failed
    assert changed_tasks(runs[-1]) == [] and section(runs[-1], "dkms") == ""
    sh.before += " && echo /var/lib/dkms/mok.pub > /run/mok-enrolled"
    assert run_role_playbook(sh, tmp_path, PLAYBOOK, extra, COLLECTIONS)["failed"] is None, runs[-1][-3000:]
    assert section(runs[-1], "dkms").startswith(f"nvidia/{VERSION}, ")


@NAMESPACE
def test_an_upgrade_runs_the_before_reboot_checks_before_anything_is_stopped(tmp_path):
    """With reboots on: the kernel phase's checks (guests, quorum, through the PVE API) come first, and a node where
    they cannot run (no proxmox_api_host here) or refuse stops with their line, nothing stopped or installed."""
    sh, runs = namespace_node(tmp_path)
    assert run_role_playbook(sh, tmp_path, PLAYBOOK, pinned(tmp_path, VERSION), COLLECTIONS)["failed"] is None
    failed = run_role_playbook(sh, tmp_path, PLAYBOOK, pinned(tmp_path, UPGRADE), COLLECTIONS)["failed"]
    assert "proxmox_api_host is not set: before a node reboots" in failed, runs[-1][-3000:]
    assert changed_tasks(runs[-1]) == []
    assert section(runs[-1], "systemctl") == "" and section(runs[-1], "modprobe") == ""
    assert section(runs[-1], "dkms").startswith(f"nvidia/{VERSION}, ") and UPGRADE not in section(runs[-1], "dkms")


@NAMESPACE
def test_a_reinstall_beside_the_loaded_module_stops_its_holders_and_unloads_the_modules_the_rule_names(tmp_path):
    """The pinned version loaded but no longer installed for the running kernel in DKMS: the services that hold it are
    stopped, the modules of module_utils/nvidia_driver.py MODULES_TO_UNLOAD unloaded (modprobe -r, in that order),
    the installer run again beside it (--allow-installation-with-running-driver), and no reboot is needed."""
    sh, runs = namespace_node(tmp_path)
    extra = pinned(tmp_path, VERSION)
    assert run_role_playbook(sh, tmp_path, PLAYBOOK, extra, COLLECTIONS)["failed"] is None
    # DKMS loses the build for this kernel; the boot loads the version the installer left (/etc/lab/driver_version)
    sh.before = "rm -f /var/lib/dkms/nvidia/kernel-*"
    assert run_role_playbook(sh, tmp_path, PLAYBOOK, extra, COLLECTIONS)["failed"] is None, runs[-1][-3000:]
    rules = module_util("nvidia_driver")
    assert section(runs[-1], "systemctl").split("\n")[:2] == [
        "stop nvidia-persistenced.service",
        "stop nvidia-fabricmanager.service",
    ]
    assert section(runs[-1], "modprobe").split("\n")[0] == " ".join(["-r", *rules.MODULES_TO_UNLOAD])
    assert "Run the NVIDIA installer with DKMS" in changed_tasks(runs[-1])
    assert section(runs[-1], "dkms").startswith(f"nvidia/{VERSION}, ") and ": installed" in section(runs[-1], "dkms")


@NAMESPACE
def test_check_mode_on_a_bare_node_reports_each_step_it_would_take_as_a_change(tmp_path):
    """plan on a bare node: the initramfs rebuild and the installer are changes (each a task that reports changed
    without acting), and nothing is installed or rebuilt."""
    sh, runs = namespace_node(tmp_path)
    sh.check = True
    assert run_role_playbook(sh, tmp_path, PLAYBOOK, pinned(tmp_path, VERSION), COLLECTIONS)["failed"] is None
    changed = changed_tasks(runs[-1])
    assert "Report the initramfs to be rebuilt without nouveau (check mode)" in changed, runs[-1][-3000:]
    assert "Report the NVIDIA installer to be run (check mode)" in changed
    assert f"pending: run NVIDIA-Linux-x86_64-{VERSION}.run --silent --dkms --no-questions --ui=none" in reports(
        runs[-1]
    )
    assert section(runs[-1], "initramfs") == "" and section(runs[-1], "dkms") == ""
    assert section(runs[-1], "version") == "" and section(runs[-1], "blacklist") == ""


@NAMESPACE
def test_check_mode_reports_an_interrupted_runs_initramfs_and_an_unloaded_module(tmp_path):
    """A node left by an interrupted run (the blacklist written, the initramfs not rebuilt since) whose installed
    driver is not loaded: check mode reports the rebuild and the module load, and does neither."""
    sh, runs = namespace_node(tmp_path)
    extra = pinned(tmp_path, VERSION)
    assert run_role_playbook(sh, tmp_path, PLAYBOOK, extra, COLLECTIONS)["failed"] is None
    # the same node, with the mark of the rebuild gone and no module loaded
    sh.before = f"rm -f {tmp_path}/state/nouveau-initramfs.conf; umount /proc/driver"
    sh.check = True
    assert run_role_playbook(sh, tmp_path, PLAYBOOK, extra, COLLECTIONS)["failed"] is None, runs[-1][-3000:]
    assert changed_tasks(runs[-1]) == [
        "Report the initramfs to be rebuilt without nouveau (check mode)",
        "Report the installed NVIDIA module to be loaded (check mode)",
    ], runs[-1][-3000:]
    assert section(runs[-1], "initramfs") == "" and section(runs[-1], "modprobe") == ""
    assert section(runs[-1], "version") == ""


@NAMESPACE
def test_an_installer_failure_is_one_line_naming_the_host_the_version_and_its_log(tmp_path):
    """An installer that fails as NVIDIA's does (its errors logged as `ERROR: ` lines in /var/log/nvidia-installer.log,
    ending with "Installation has failed.", several lines on stderr): the phase stops with one line that names the
    host, the version, the installer's last error and the log."""
    sh, runs = namespace_node(tmp_path)
    cause = (
        "Unable to find the kernel source tree for the currently running kernel.  Please make sure you have "
        "installed the kernel source files for your kernel"
    )
    installer = tmp_path / "mirror" / f"NVIDIA-Linux-x86_64-{VERSION}.run"
    installer.parent.mkdir()
    installer.write_text(
        "#!/bin/sh\nlog=/var/log/nvidia-installer.log\n"
        "printf \"nvidia-installer log file '$log'\\n\\n-> Installing NVIDIA driver version %s.\\n\" "
        f"{VERSION} > $log\n"
        f"for m in '{cause}' \"Installation has failed.  Please see the file '$log' for details.\"; do\n"
        '  echo "ERROR: $m" >> $log; printf \'ERROR: %s\\n\\n\' "$m" >&2\ndone\nexit 1\n'
    )
    extra = {
        **pinned(tmp_path, VERSION),
        "nvidia_driver_installer": str(installer),
        "nvidia_driver_installer_sha256": hashlib.sha256(installer.read_bytes()).hexdigest(),
    }
    failed = run_role_playbook(sh, tmp_path, PLAYBOOK, extra, COLLECTIONS)["failed"]
    assert failed == (
        f"localhost: the NVIDIA installer for driver {VERSION} failed (exit 1): {cause}; its log: "
        "localhost:/var/log/nvidia-installer.log"
    ), runs[-1][-3000:]
