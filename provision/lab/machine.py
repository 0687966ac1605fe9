"""What the lab's VMs and containers share: a per-machine ssh host key known before first boot,
ssh with host key checking on and a hard timeout, and waiting for a (re)boot by its boot id."""

from __future__ import annotations

import contextlib
import os
import subprocess
import time
from pathlib import Path

from provision.errors import ProvisionError

SSH_OPTS = [
    "-o",
    "BatchMode=yes",
    "-o",
    "ConnectTimeout=5",
    "-o",
    "ServerAliveInterval=2",
    "-o",
    "ServerAliveCountMax=3",
]


class LabMachine:
    kind = "machine"
    # prints something that changes with every boot of this machine
    boot_id_command = "cat /proc/sys/kernel/random/boot_id"
    # the lab's own ssh (tests, the lab, fakepve's node files) shares one connection per machine (ControlMaster):
    # a VM under TCG took 1.4-2.3 s for each new connection's key exchange, 0.1 s for a command over an open one
    multiplex = False

    def __init__(self, name: str, workdir: Path, client_key: Path, known_hosts: Path):
        self.name = name
        self.dir = workdir
        self.client_key = client_key
        self.known_hosts = known_hosts
        self.host_key = workdir / "ssh_host_ed25519_key"
        self.pidfile = workdir / "machine.pid"  # subclasses name their own

    # subclasses say where ssh goes and how it shows in known_hosts
    def ssh_destination(self) -> list[str]:
        raise NotImplementedError

    def known_hosts_name(self) -> str:
        raise NotImplementedError

    def is_running(self) -> bool:
        """True while the process in the pid file is alive."""
        pid = self.pid()
        if pid is None:
            return False
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        return True

    def pid(self) -> int | None:
        """The process that runs this machine (qemu, or the nspawn supervisor), from its pid file."""
        try:
            return int(self.pidfile.read_text().strip())
        except (OSError, ValueError):
            return None

    def exit_detail(self) -> str:
        return ""

    def make_host_key(self) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        if not self.host_key.exists():
            subprocess.run(
                ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", self.name, "-f", str(self.host_key)], check=True
            )

    def known_hosts_line(self) -> str:
        kind, key = self.host_key.with_suffix(".pub").read_text().split()[:2]
        return f"{self.known_hosts_name()} {kind} {key}"

    def ssh_argv(self) -> list[str]:
        """ssh to this machine as root, with host key checking on, up to the remote command."""
        return [
            "ssh",
            "-i",
            str(self.client_key),
            "-o",
            "IdentitiesOnly=yes",
            "-o",
            f"UserKnownHostsFile={self.known_hosts}",
            "-o",
            "StrictHostKeyChecking=yes",
            *SSH_OPTS,
            *self._multiplex_options(),
            *self.ssh_destination(),
        ]

    def _control_path(self) -> Path | None:
        path = self.dir / "ssh-mux"
        # a unix socket's path holds at most 108 bytes; ssh adds a random suffix while it sets one up
        return path if self.multiplex and len(str(path)) <= 80 else None

    def _multiplex_options(self) -> list[str]:
        """The first ssh opens a master that later ones share; it ends with the machine's connection (a reboot, a
        reset, ServerAliveInterval's 6 s without an answer) or 60 s after its last command."""
        path = self._control_path()
        return ["-o", "ControlMaster=auto", "-o", f"ControlPath={path}", "-o", "ControlPersist=60"] if path else []

    def close_ssh(self) -> None:
        """End the shared connection, if one is open (before a snapshot, or when the machine stops)."""
        path = self._control_path()
        if path and path.exists():
            with contextlib.suppress(subprocess.TimeoutExpired):
                subprocess.run(
                    [*self.ssh_argv(), "-O", "exit"], stdin=subprocess.DEVNULL, capture_output=True, timeout=10
                )

    def ssh(self, command: str, timeout: float = 60) -> subprocess.CompletedProcess:
        """Run a command over ssh with host key checking on; never hangs past `timeout` (ssh to a
        rebooting guest can hang for ever otherwise)."""
        cmd = [*self.ssh_argv(), command]
        try:
            # ssh and qemu set the stdin they inherit non-blocking, which later breaks ansible: give them none
            return subprocess.run(cmd, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=timeout)
        except subprocess.TimeoutExpired:
            return subprocess.CompletedProcess(cmd, 255, "", f"ssh timed out after {timeout}s")

    def boot_id(self) -> str | None:
        proc = self.ssh(self.boot_id_command, timeout=15)
        return proc.stdout.strip() if proc.returncode == 0 and proc.stdout.strip() else None

    def wait_for_ssh(self, timeout: float, not_boot_id: str | None = None) -> str:
        """Wait until ssh answers (with a boot id other than `not_boot_id`); return the boot id."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if not self.is_running():
                raise ProvisionError(f"lab {self.kind} {self.name}: it stopped running. {self.exit_detail()}".strip())
            boot = self.boot_id()
            if boot and boot != not_boot_id:
                return boot
            time.sleep(1)
        raise ProvisionError(
            f"lab {self.kind} {self.name}: no ssh at {' '.join(self.ssh_destination())} after {timeout:.0f}s"
        )
