"""systemd-nspawn containers that stand in for the LXC container running SGLang.

Each boots the lab's bookworm rootfs (read-only lower layer; its own writable upper layer)
with systemd as PID 1, in a network namespace of its own joined to the host by a veth pair,
with the GPU device nodes already present as PVE's devN passthrough would leave them. A
small supervisor restarts nspawn when the container reboots (exit 133), as
systemd-nspawn@.service does, so `systemctl reboot` inside works.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from provision.errors import ProvisionError
from provision.lab.machine import LabMachine
from provision.lab.tokenizer import write_tokenizer

NVIDIA_MAJOR = 195
UVM_MAJOR = 511  # stands in for the dynamic major the nvidia-uvm module would get
CAPS_MAJOR = 510
# where the lab's "model" lives in the container (sglang_model_path); it holds only a tokenizer
MODEL_DIR = "/srv/models/lab-standin"
STANDIN_CONTEXT = 262144  # the stand-in's default context length (the scenario's)


@dataclass
class ContainerSpec:
    name: str
    index: int  # picks the 10.213.<index>.0/30 link
    gpus: int = 2

    @property
    def netns(self) -> str:
        return f"provision-lab-{self.index}"

    @property
    def host_if(self) -> str:
        return f"plab{self.index}"

    @property
    def host_addr(self) -> str:
        return f"10.213.{self.index}.1"

    @property
    def address(self) -> str:
        return f"10.213.{self.index}.2"


def _sh(*cmd: str, check: bool = True) -> subprocess.CompletedProcess:
    proc = subprocess.run(list(cmd), stdin=subprocess.DEVNULL, capture_output=True, text=True)
    if check and proc.returncode != 0:
        raise ProvisionError(f"lab: {' '.join(cmd)} failed: {proc.stderr.strip()}")
    return proc


def _mounted(path: Path) -> bool:
    return any(line.split()[1] == str(path) for line in Path("/proc/mounts").read_text().splitlines())


class LabContainer(LabMachine):
    kind = "container"
    # a container shares the kernel's boot_id; its own boots are told apart by when its PID 1 started
    boot_id_command = "echo $(cat /proc/sys/kernel/random/boot_id)-$(cut -d' ' -f22 /proc/1/stat)"

    def __init__(
        self,
        spec: ContainerSpec,
        workdir: Path,
        rootfs: Path,
        client_key: Path,
        known_hosts: Path,
        read_only_binds: dict[str, Path] | None = None,
    ):
        super().__init__(spec.name, workdir, client_key, known_hosts)
        self.spec = spec
        self.read_only_binds = read_only_binds or {}
        self.rootfs = rootfs
        self.root = workdir / "root"
        self.pidfile = workdir / "supervisor.pid"
        self.log = workdir / "nspawn.log"

    def device_nodes(self) -> list[tuple[str, int, int, int]]:
        """(name under /dev, major, minor, mode) of every node passthrough would add."""
        nodes = [(f"nvidia{i}", NVIDIA_MAJOR, i, 0o666) for i in range(self.spec.gpus)]
        nodes += [
            ("nvidiactl", NVIDIA_MAJOR, 255, 0o666),
            ("nvidia-modeset", NVIDIA_MAJOR, 254, 0o666),
            ("nvidia-uvm", UVM_MAJOR, 0, 0o666),
            ("nvidia-uvm-tools", UVM_MAJOR, 1, 0o666),
            ("nvidia-caps/nvidia-cap1", CAPS_MAJOR, 1, 0o400),
            ("nvidia-caps/nvidia-cap2", CAPS_MAJOR, 2, 0o444),
        ]
        return nodes

    # ---------------------------------------------------------------- set-up
    def prepare(self) -> None:
        upper, work = self.dir / "upper", self.dir / "work"
        for d in (upper, work, self.root, self.dir / "dev"):
            d.mkdir(parents=True, exist_ok=True)
        self.make_host_key()
        (upper / "etc" / "ssh").mkdir(parents=True, exist_ok=True)
        for suffix, mode in (("", 0o600), (".pub", 0o644)):
            target = upper / "etc" / "ssh" / f"ssh_host_ed25519_key{suffix}"
            target.write_bytes(Path(f"{self.host_key}{suffix}").read_bytes())
            target.chmod(mode)
        ssh_dir = upper / "root" / ".ssh"
        ssh_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        (ssh_dir / "authorized_keys").write_bytes(Path(f"{self.client_key}.pub").read_bytes())
        (ssh_dir / "authorized_keys").chmod(0o600)
        # the site's model directory: the stand-in needs no weights, SGLang's benchmark client a tokenizer
        write_tokenizer(upper / MODEL_DIR.lstrip("/"), context_length=STANDIN_CONTEXT)
        (upper / "etc" / "hostname").write_text(self.spec.name + "\n")
        (upper / "etc" / "hosts").write_text(f"127.0.0.1 localhost\n127.0.1.1 {self.spec.name}\n")
        for name, major, minor, mode in self.device_nodes():
            node = self.dir / "dev" / name
            node.parent.mkdir(parents=True, exist_ok=True)
            if not node.exists():
                os.mknod(node, mode | 0o020000, os.makedev(major, minor))
                node.chmod(mode)
        if not _mounted(self.root):
            _sh("mount", "-t", "overlay", "overlay", "-o",
                f"lowerdir={self.rootfs},upperdir={upper},workdir={work}", str(self.root))  # fmt: skip
        self._network_up()

    def _network_up(self) -> None:
        s = self.spec
        if s.netns not in _sh("ip", "netns", "list").stdout.split():
            _sh("ip", "netns", "add", s.netns)
        if _sh("ip", "link", "show", s.host_if, check=False).returncode != 0:
            _sh("ip", "link", "add", s.host_if, "type", "veth", "peer", "name", "host0", "netns", s.netns)
            _sh("ip", "addr", "add", f"{s.host_addr}/30", "dev", s.host_if)
            _sh("ip", "link", "set", s.host_if, "up")
            _sh("ip", "netns", "exec", s.netns, "ip", "addr", "add", f"{s.address}/30", "dev", "host0")
            _sh("ip", "netns", "exec", s.netns, "ip", "link", "set", "host0", "up")
            _sh("ip", "netns", "exec", s.netns, "ip", "link", "set", "lo", "up")
            _sh("ip", "netns", "exec", s.netns, "ip", "route", "add", "default", "via", s.host_addr)

    # ---------------------------------------------------------------- lifecycle
    def nspawn_command(self) -> list[str]:
        cmd = [
            "systemd-nspawn", "--quiet", "--boot", f"--directory={self.root}", f"--machine={self.spec.name}",
            "--register=no", "--keep-unit", "--console=passive",
            f"--network-namespace-path=/run/netns/{self.spec.netns}",
        ]  # fmt: skip
        for name, *_ in self.device_nodes():
            cmd.append(f"--bind={self.dir / 'dev' / name}:/dev/{name}")
        for inside, outside in self.read_only_binds.items():
            cmd.append(f"--bind-ro={outside}:{inside}")
        return cmd

    def start(self) -> None:
        self.prepare()
        if self.is_running():
            return
        # restart on 133 (the container asked for a reboot), stop on anything else
        loop = 'while :; do "$@"; rc=$?; [ "$rc" -eq 133 ] || exit "$rc"; done'
        with self.log.open("a") as log:
            proc = subprocess.Popen(
                ["bash", "-c", loop, "supervisor", *self.nspawn_command()],
                stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                env={**os.environ, "SYSTEMD_NSPAWN_LOCK": "0"},
            )  # fmt: skip
        self.pidfile.write_text(str(proc.pid))

    def stop(self, timeout: float = 30) -> None:
        pid = self.pid()
        if pid is not None and self.is_running():
            os.killpg(pid, signal.SIGTERM)  # nspawn shuts the container down in order
            deadline = time.monotonic() + timeout
            while time.monotonic() < deadline and _sh("pgrep", "-g", str(pid), check=False).returncode == 0:
                time.sleep(0.2)
            if _sh("pgrep", "-g", str(pid), check=False).returncode == 0:
                os.killpg(pid, signal.SIGKILL)
                time.sleep(0.5)
        self.pidfile.unlink(missing_ok=True)

    def teardown(self) -> None:
        self.stop()
        if _mounted(self.root):
            _sh("umount", str(self.root), check=False)
        _sh("ip", "link", "del", self.spec.host_if, check=False)
        _sh("ip", "netns", "del", self.spec.netns, check=False)

    def ssh_destination(self) -> list[str]:
        return [f"root@{self.spec.address}"]

    def known_hosts_name(self) -> str:
        return self.spec.address

    def exit_detail(self) -> str:
        tail = self.log.read_text(errors="replace").strip().splitlines()[-3:] if self.log.exists() else []
        return "nspawn: " + " | ".join(tail)
