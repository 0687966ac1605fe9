"""qemu VMs that stand in for Proxmox VE nodes: real kernel, GRUB or systemd-boot, reboots.

Each VM boots a copy-on-write overlay of the cached disk, answers ssh on a loopback port,
and gets its identity (ssh host key, the lab's client key, hostname, fake GPU count) through
qemu's fw_cfg, so host keys are known before the first boot and checking stays on.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from provision.errors import ProvisionError
from provision.lab.image import OVMF_CODE, OVMF_VARS, cache_root
from provision.lab.machine import LabMachine


@functools.cache
def _qemu_version() -> str:
    return subprocess.run(["qemu-system-x86_64", "--version"], capture_output=True, text=True).stdout.split("\n")[0]


def cpu_args(accel: str) -> list[str]:
    """The virtual CPUs: the guest boots with them, so a booted snapshot is only good for the same ones."""
    if accel == "kvm":
        return ["-smp", "2", "-accel", "kvm", "-cpu", "host,-arch-capabilities"]
    # One vCPU: the tests run two VM labs at once on this machine's 2 cores (.ci/run), and there a second vCPU per
    # guest only adds threads that wait for each other (docs/lab.md, "Test durations": update-initramfs and a
    # reboot on all four VMs of two labs at once took 147 s and 127 s with one vCPU, 174 s and 140 s with two). -cpu
    # qemu64 saved about 5% on a kernel-phase check, not worth a CPU further from the hosts'.
    return ["-smp", "1", "-accel", "tcg,thread=multi,tb-size=512", "-cpu", "max"]


def choose_accel() -> str:
    """KVM only where a stock kernel can run under it: /dev/kvm *and* hardware virtualisation
    flags. On PVM hosts (/dev/kvm from kvm_pvm, no vmx/svm) guests crawl or hang: use TCG."""
    wanted = os.environ.get("PROVISION_LAB_ACCEL", "auto")
    if wanted in ("kvm", "tcg"):
        return wanted
    cpuinfo = Path("/proc/cpuinfo").read_text()
    if os.access("/dev/kvm", os.W_OK) and re.search(r"\b(vmx|svm)\b", cpuinfo):
        return "kvm"
    return "tcg"


# $1 qemu's pid file, $2 the stop flag, $3 the VM's directory, then qemu's command line (with -daemonize): wait while
# that qemu runs; once it has exited (a reset under -no-reboot), start it again unless the lab stopped the VM. Where
# the directory holds efi-vars-kept (LabVm.drop_efi_writes), the firmware's variable store goes back to it first: every
# EFI variable written since is lost at the reset, as on firmware that drops such writes. `read` and `kill -0` are
# builtins: the wait costs a `sleep` every 0.2 s.
_WATCHER = r"""
pidfile=$1 stopped=$2 dir=$3; shift 3
while :; do
  pid=; read -r pid < "$pidfile" 2>/dev/null
  while [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null; do sleep 0.2; done
  [ -e "$stopped" ] && exit 0
  if [ -e "$dir/efi-vars-kept" ]; then
    cp "$dir/efi-vars-kept" "$dir/ovmf_vars.fd" && echo "$(date -u +%FT%TZ) EFI variables written since dropped"
  fi
  echo "$(date -u +%FT%TZ) qemu $pid exited: starting it again"
  "$@" || exit 1
done
"""


@dataclass
class VmSpec:
    name: str
    bootloader: str  # "grub" or "sdboot"
    port: int
    gpus: int = 2
    memory_mb: int = 2048
    driver_version: str = "580.95.05"


class LabVm(LabMachine):
    kind = "VM"
    api_address = "10.0.2.2"  # this machine's loopback, as qemu's user networking shows it to the guest
    multiplex = True

    def __init__(self, spec: VmSpec, workdir: Path, disk: Path, client_key: Path, known_hosts: Path):
        super().__init__(spec.name, workdir, client_key, known_hosts)
        self.spec = spec
        self.disk = disk
        self.pidfile = workdir / "qemu.pid"
        self.monitor = workdir / "monitor.sock"
        self.serial = workdir / "serial.log"
        self.watcher_pidfile = workdir / "watcher.pid"
        self.stopped = workdir / "stopped"  # lab stop: the watcher starts no qemu again

    # ---------------------------------------------------------------- lifecycle
    def prepare(self, snapshot: Path | None = None) -> None:
        """The VM's overlay disk (on the base image, or on a booted snapshot's disk), firmware vars, host key."""
        self.dir.mkdir(parents=True, exist_ok=True)
        overlay = self.dir / "disk.qcow2"
        if not overlay.exists():
            base = ["-F", "raw", "-b", str(self.disk)]
            if snapshot:
                base = ["-F", "qcow2", "-b", str(snapshot / "disk.qcow2")]
            subprocess.run(["qemu-img", "create", "-q", "-f", "qcow2", *base, str(overlay)], check=True)
        if self.spec.bootloader == "sdboot" and not (self.dir / "ovmf_vars.fd").exists():
            shutil.copy(snapshot / "ovmf_vars.fd" if snapshot else OVMF_VARS, self.dir / "ovmf_vars.fd")
        if snapshot and not self.host_key.exists():
            for suffix in ("", ".pub"):
                shutil.copy(snapshot / f"ssh_host_ed25519_key{suffix}", f"{self.host_key}{suffix}")
            self.host_key.chmod(0o600)
        self.make_host_key()

    def command(self, accel: str) -> list[str]:
        s = self.spec
        cmd = ["qemu-system-x86_64", "-name", s.name, "-machine", "q35", "-m", str(s.memory_mb), *cpu_args(accel)]
        if s.bootloader == "sdboot":
            cmd += [
                "-drive",
                f"if=pflash,format=raw,unit=0,readonly=on,file={OVMF_CODE}",
                "-drive",
                f"if=pflash,format=raw,unit=1,file={self.dir / 'ovmf_vars.fd'}",
            ]
        fw = {
            "ssh_host_ed25519_key": f"file={self.host_key}",
            "ssh_host_ed25519_key.pub": f"file={self.host_key}.pub",
            "authorized_keys": f"file={self.client_key}.pub",
            "hostname": f"string={s.name}",
            "gpus": f"string={s.gpus}",
            # none for `lab up --bare`: the node has no driver until the driver phase installs one
            **({"driver_version": f"string={s.driver_version}"} if s.driver_version else {}),
        }
        for name, source in fw.items():
            cmd += ["-fw_cfg", f"name=opt/lab/{name},{source}"]
        cmd += [
            "-drive",
            f"file={self.dir / 'disk.qcow2'},if=virtio,cache=unsafe",
            "-nic",
            f"user,model=virtio-net-pci,hostfwd=tcp:127.0.0.1:{s.port}-:22",
            "-display",
            "none",
            "-serial",
            f"file:{self.serial}",
            "-monitor",
            f"unix:{self.monitor},server,nowait",
            "-pidfile",
            str(self.pidfile),
            "-daemonize",
            # a reset (the guest's reboot, or the monitor's system_reset) ends this qemu and the watcher starts a new
            # one: under TCG a reset qemu took 12-21 s longer to the guest's kernel than a new one (docs/lab.md)
            "-no-reboot",
        ]
        return cmd

    def start(self, accel: str, resume: bool = False) -> bool:
        """Boot the VM, or with `resume` carry on from its booted snapshot where one is cached.
        Returns True when it resumed (then its clock is set by `after_resume`)."""
        snapshot = self.cached_snapshot(accel) if resume else None
        self.prepare(snapshot)
        if self.is_running():
            return False
        self.stopped.unlink(missing_ok=True)
        incoming = ["-incoming", f"exec:cat {snapshot / 'state.bin'}"] if snapshot else []
        proc = subprocess.run(self.command(accel) + incoming, stdin=subprocess.DEVNULL, capture_output=True, text=True)
        if proc.returncode != 0:
            raise ProvisionError(f"lab VM {self.spec.name}: qemu failed to start: {proc.stderr.strip()}")
        self._watch(accel)
        if snapshot is not None:
            self._continue_after_incoming()
        return snapshot is not None

    def _watch(self, accel: str) -> None:
        """A process that starts qemu again (a cold boot from the VM's disk, as a power cycle) each time it exits,
        until `stop`: with -no-reboot, a reset ends qemu, and the node must come back as a rebooted host does."""
        with open(self.dir / "watcher.log", "ab") as log:
            watcher = subprocess.Popen(
                [
                    "bash",
                    "-c",
                    _WATCHER,
                    "lab-vm-watcher",
                    str(self.pidfile),
                    str(self.stopped),
                    str(self.dir),
                    *self.command(accel),
                ],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=log,
                start_new_session=True,
            )
        self.watcher_pidfile.write_text(f"{watcher.pid}\n")

    def _watcher_alive(self) -> bool:
        try:
            pid = int(self.watcher_pidfile.read_text())
            return Path(f"/proc/{pid}/cmdline").read_bytes().startswith(b"bash\0-c")
        except (OSError, ValueError):
            return False

    def _continue_after_incoming(self, timeout: float = 120) -> None:
        """The snapshot was saved paused, so qemu keeps the loaded guest paused: let it run."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            status = self.hmp("info status")
            if "running" in status:
                return
            if "paused" in status and "inmigrate" not in status:
                self.hmp("cont")
            time.sleep(0.2)
        raise ProvisionError(f"lab VM {self.spec.name}: the snapshot did not load: {status.strip()[-200:]}")

    # ---------------------------------------------------------------- booted snapshots
    def snapshot_dir(self, accel: str) -> Path:
        """Where the cache keeps this VM's booted state: keyed by everything the guest saw at boot
        (disk image, name, bootloader, GPUs, driver, memory, its ssh keys), the accelerator and qemu."""
        spec = {k: v for k, v in vars(self.spec).items() if k != "port"}
        client = Path(f"{self.client_key}.pub").read_text()
        key = json.dumps([str(self.disk), spec, accel, cpu_args(accel), _qemu_version(), client], sort_keys=True)
        return cache_root() / "snapshots" / f"{self.spec.name}-{hashlib.sha256(key.encode()).hexdigest()[:16]}"

    def cached_snapshot(self, accel: str) -> Path | None:
        """This VM's booted snapshot, when a complete one is in the cache."""
        snapshot = self.snapshot_dir(accel)
        return snapshot if (snapshot / "complete").exists() else None

    def save_snapshot(self, accel: str) -> Path:
        """Save the running, booted VM into the cache (its RAM as a migration stream, its disk and firmware
        vars as they are at that instant), then stop it: the next start resumes from there."""
        target = self.snapshot_dir(accel)
        tmp = target.with_name(f"{target.name}.tmp-{os.getpid()}")  # two labs may save the same VM at once
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        # a paused guest's migration into a file. Migrating it live (multi-threaded TCG) saved, at times, RAM that
        # did not match the vCPUs' state: the resumed kernel died in its timer queue (hrtimer rb_erase oops).
        self.close_ssh()  # no session of the lab's in the saved guest
        self.hmp("stop")
        self.hmp(f"migrate exec:cat>{tmp / 'state.bin'}")
        deadline = time.monotonic() + 300
        while "Migration status: completed" not in (status := self.hmp("info migrate")):
            if "failed" in status or time.monotonic() > deadline:
                raise ProvisionError(f"lab VM {self.spec.name}: saving its snapshot failed: {status.strip()[-300:]}")
            time.sleep(0.5)
        self.stop()  # the migration flushed and released the disks: copy them as they are now
        shutil.copy(self.dir / "disk.qcow2", tmp / "disk.qcow2")  # an overlay on the cached base image
        if self.spec.bootloader == "sdboot":
            shutil.copy(self.dir / "ovmf_vars.fd", tmp / "ovmf_vars.fd")
        for suffix in ("", ".pub"):
            shutil.copy(f"{self.host_key}{suffix}", tmp / f"ssh_host_ed25519_key{suffix}")
        (tmp / "complete").touch()
        if (target / "complete").exists():  # another lab saved it first, and its VMs may run on that disk now
            shutil.rmtree(tmp)
        else:
            shutil.rmtree(target, ignore_errors=True)  # an incomplete leftover
            tmp.rename(target)
        for name in ("disk.qcow2", "ovmf_vars.fd"):
            (self.dir / name).unlink(missing_ok=True)
        return target

    def after_resume(self) -> None:
        """A resumed guest's clock is the snapshot's: set it to now, as a booted one would be."""
        self.ssh(f"date -u -s @{time.time():.3f} >/dev/null", timeout=30)

    def drop_efi_writes(self, drop: bool = True) -> None:
        """Firmware that drops EFI variable writes (`drop`), or keeps them again: from now on, every variable the
        guest writes (`bootctl set-oneshot` included) reads back while the node runs and is gone after its next
        reset, as on firmware whose variable store does not persist such writes. Only a UEFI VM (pve-sdboot) has
        variables. The store kept is the one of this moment, copied while the guest writes none."""
        kept = self.dir / "efi-vars-kept"
        if not drop:
            kept.unlink(missing_ok=True)
            return
        if self.spec.bootloader != "sdboot":
            raise ValueError(f"{self.spec.name} boots through GRUB with BIOS: it has no EFI variables")
        shutil.copy(self.dir / "ovmf_vars.fd", kept)

    def is_running(self) -> bool:
        """qemu runs, or its watcher is about to start it again after a reset."""
        return self._qemu_alive() or (self._watcher_alive() and not self.stopped.exists())

    def _qemu_alive(self) -> bool:
        # a recycled pid must not pass for the VM: check that it is still qemu
        if not super().is_running():
            return False
        try:
            return Path(f"/proc/{self.pid()}/cmdline").read_bytes().startswith(b"qemu-system")
        except OSError:
            return False

    def stop(self) -> None:
        """Power off at once (the overlay is thrown away or kept as is): the watcher first, then quit, then kill."""
        self.close_ssh()
        if self.dir.is_dir():
            self.stopped.touch()
        if self._watcher_alive():
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(self.watcher_pidfile.read_text()), signal.SIGKILL)
        self.watcher_pidfile.unlink(missing_ok=True)
        pid = self.pid()
        if pid is not None and self._qemu_alive():
            self._monitor("quit")
            for _ in range(50):
                if not self._qemu_alive():
                    break
                time.sleep(0.1)
            if self._qemu_alive():
                with contextlib.suppress(ProcessLookupError):  # it may exit between the check and the signal
                    os.kill(pid, signal.SIGKILL)
        self.pidfile.unlink(missing_ok=True)

    def pause(self) -> None:
        """Freeze the guest (qemu `stop`): to the network it is a host that does not come back."""
        self._monitor("stop")

    def resume(self) -> None:
        self._monitor("cont")

    def _monitor(self, command: str) -> None:
        with contextlib.suppress(OSError):
            self.hmp(command)

    def hmp(self, command: str, timeout: float = 30) -> str:
        """One command on qemu's human monitor; returns what it printed before the next prompt."""
        with socket.socket(socket.AF_UNIX) as s:
            s.settimeout(timeout)
            s.connect(str(self.monitor))
            out = b""
            while not out.endswith(b"(qemu) "):
                chunk = s.recv(65536)
                if not chunk:
                    return ""
                out += chunk
            s.sendall(command.encode() + b"\n")
            out = b""
            while b"(qemu) " not in out:
                chunk = s.recv(65536)
                if not chunk:  # quit closes the monitor
                    break
                out += chunk
        return out.decode(errors="replace").replace("\r", "")

    # ---------------------------------------------------------------- ssh
    def ssh_destination(self) -> list[str]:
        return ["-p", str(self.spec.port), "root@127.0.0.1"]

    def known_hosts_name(self) -> str:
        return f"[127.0.0.1]:{self.spec.port}"

    def exit_detail(self) -> str:
        return f"serial log: {self.serial}; watcher log: {self.dir / 'watcher.log'}"
