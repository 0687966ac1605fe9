"""qemu VMs that stand in for Proxmox VE nodes: real kernel, GRUB or systemd-boot, reboots.

Each VM boots a copy-on-write overlay of the cached disk, answers ssh on a loopback port,
and gets its identity (ssh host key, the lab's client key, hostname, fake GPU count) through
qemu's fw_cfg, so host keys are known before the first boot and checking stays on.
"""

from __future__ import annotations

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
from provision.lab.image import OVMF_CODE, OVMF_VARS
from provision.lab.machine import LabMachine


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

    def __init__(self, spec: VmSpec, workdir: Path, disk: Path, client_key: Path, known_hosts: Path):
        super().__init__(spec.name, workdir, client_key, known_hosts)
        self.spec = spec
        self.disk = disk
        self.pidfile = workdir / "qemu.pid"
        self.monitor = workdir / "monitor.sock"
        self.serial = workdir / "serial.log"

    # ---------------------------------------------------------------- lifecycle
    def prepare(self) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        overlay = self.dir / "disk.qcow2"
        if not overlay.exists():
            subprocess.run(
                ["qemu-img", "create", "-q", "-f", "qcow2", "-F", "raw", "-b", str(self.disk), str(overlay)], check=True
            )
        if self.spec.bootloader == "sdboot" and not (self.dir / "ovmf_vars.fd").exists():
            shutil.copy(OVMF_VARS, self.dir / "ovmf_vars.fd")
        self.make_host_key()

    def command(self, accel: str) -> list[str]:
        s = self.spec
        cmd = ["qemu-system-x86_64", "-name", s.name, "-machine", "q35", "-smp", "2", "-m", str(s.memory_mb)]
        if accel == "kvm":
            cmd += ["-accel", "kvm", "-cpu", "host,-arch-capabilities"]
        else:
            cmd += ["-accel", "tcg,thread=multi,tb-size=512", "-cpu", "max"]
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
            "driver_version": f"string={s.driver_version}",
        }
        for name, source in fw.items():
            cmd += ["-fw_cfg", f"name=opt/lab/{name},{source}"]
        cmd += [
            "-drive", f"file={self.dir / 'disk.qcow2'},if=virtio,cache=unsafe",
            "-nic", f"user,model=virtio-net-pci,hostfwd=tcp:127.0.0.1:{s.port}-:22",
            "-display", "none", "-serial", f"file:{self.serial}",
            "-monitor", f"unix:{self.monitor},server,nowait",
            "-pidfile", str(self.pidfile), "-daemonize",
        ]  # fmt: skip
        return cmd

    def start(self, accel: str) -> None:
        self.prepare()
        if self.is_running():
            return
        proc = subprocess.run(self.command(accel), stdin=subprocess.DEVNULL, capture_output=True, text=True)
        if proc.returncode != 0:
            raise ProvisionError(f"lab VM {self.spec.name}: qemu failed to start: {proc.stderr.strip()}")

    def is_running(self) -> bool:
        # a recycled pid must not pass for the VM: check that it is still qemu
        if not super().is_running():
            return False
        try:
            return Path(f"/proc/{self.pid()}/cmdline").read_bytes().startswith(b"qemu-system")
        except OSError:
            return False

    def stop(self) -> None:
        """Power off at once (the overlay is thrown away or kept as is): quit, then kill."""
        pid = self.pid()
        if pid is not None and self.is_running():
            self._monitor("quit")
            for _ in range(50):
                if not self.is_running():
                    break
                time.sleep(0.1)
            if self.is_running():
                os.kill(pid, signal.SIGKILL)
        self.pidfile.unlink(missing_ok=True)

    def pause(self) -> None:
        """Freeze the guest (qemu `stop`): to the network it is a host that does not come back."""
        self._monitor("stop")

    def resume(self) -> None:
        self._monitor("cont")

    def _monitor(self, command: str) -> None:
        try:
            with socket.socket(socket.AF_UNIX) as s:
                s.settimeout(5)
                s.connect(str(self.monitor))
                s.sendall(command.encode() + b"\n")
                time.sleep(0.3)
        except OSError:
            pass

    # ---------------------------------------------------------------- ssh
    def ssh_destination(self) -> list[str]:
        return ["-p", str(self.spec.port), "root@127.0.0.1"]

    def known_hosts_name(self) -> str:
        return f"[127.0.0.1]:{self.spec.port}"

    def exit_detail(self) -> str:
        return f"serial log: {self.serial}"
