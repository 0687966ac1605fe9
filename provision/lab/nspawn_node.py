"""A PVE node as a systemd-nspawn container (`provision lab up --nodes nspawn`), for the tests that need no bootloader.

The same rootfs and node overlay as the VMs, booted with systemd as PID 1 by nspawn, as fast as the CT's body. It shares
this machine's network namespace, as qemu's user networking puts a VM's ssh on a loopback port: its sshd listens on
127.0.0.1:<port> only, and the lab's API is on this machine's loopback. Every nspawn start is a boot: a fresh boot id
(nspawn mounts one over /proc/sys/kernel/random/boot_id), pve-guests.service's startall, the role's device node unit;
`systemctl reboot` inside restarts it (the supervisor restarts nspawn on exit 133).

What stands in for the kernel and firmware, each a unit of the node's own at every boot:
- /proc/cmdline is the line the node's boot configuration names (`/usr/local/lib/lab/node-kernel`): GRUB's from
  /etc/default/grub and its snippets, systemd-boot's from its entry on the ESP, which proxmox-boot-tool writes from
  /etc/kernel/cmdline. The node starts with the profile's arguments there, as a node the kernel phase has converged.
  There is no bootloader to change it: the kernel phase may only find nothing to do (a `grub-probe` on the node fails
  on its overlay root).
- the fake NVIDIA module (`lab-fake-nvidia.service`, as on the VMs) and the kernel log lines the VMs' kernels print
  that the product reads (the same script: `iommu: Default domain type`), shown by a `dmesg` and a `journalctl -k` that
  read the node's own ring (a container may not read the kernel's).
"""

from __future__ import annotations

import shutil
from pathlib import Path

import yaml

from provision.lab.container import ContainerSpec, LabContainer, _mounted, _sh
from provision.lab.image import ESP_VOLID, ROOT_UUID
from provision.lab.vm import VmSpec
from provision.paths import roles_dir

HERE = Path(__file__).resolve().parent
# the node's own ring buffer, which its `dmesg` prints (nspawn-node/usr/local/bin/dmesg)
NSPAWN_KMSG = "/run/lab/kmsg"
# units the node must not run in this machine's network namespace, or that only a VM needs
MASKED = (
    "systemd-networkd.service",
    "systemd-networkd.socket",
    "systemd-networkd-wait-online.service",
    "lab-identity.service",
)
# what build-disks.sh enables on the VMs' disks, less lab-identity (written here instead), and the node's kernel
ENABLED = {
    "multi-user.target.wants": ("lab-ops-user.service", "lab-fake-nvidia.service", "pve-guests.service"),
    "sysinit.target.wants": ("lab-node-kernel.service",),
}


class LabNspawnNode(LabContainer):
    kind = "node"
    boot_id_command = "cat /proc/sys/kernel/random/boot_id"  # its own: nspawn mounts a fresh one at every start
    api_address = "127.0.0.1"  # it shares this machine's network namespace

    def __init__(self, spec: VmSpec, workdir: Path, rootfs: Path, client_key: Path, known_hosts: Path):
        super().__init__(
            ContainerSpec(name=spec.name, index=0, gpus=spec.gpus), workdir, rootfs, client_key, known_hosts
        )
        self.node = spec
        self.host_key = workdir / "ssh_host_ed25519_key"

    # ---------------------------------------------------------------- set-up
    def prepare(self) -> None:
        upper, work = self.dir / "upper", self.dir / "work"
        for d in (upper / "etc", work, self.root):
            d.mkdir(parents=True, exist_ok=True)
        self._identity(upper)
        self._boot_config(upper)
        self._units(upper)
        if not _mounted(self.root):
            _sh(
                "mount",
                "-t",
                "overlay",
                "overlay",
                "-o",
                f"lowerdir={self.rootfs},upperdir={upper},workdir={work}",
                str(self.root),
            )

    def _identity(self, upper: Path) -> None:
        """What lab-identity.service takes from qemu's fw_cfg on a VM: host key, root's key, hostname, GPUs, driver."""
        self.install_keys(upper)
        ssh = upper / "etc" / "ssh"
        (ssh / "sshd_config.d").mkdir(exist_ok=True)
        (ssh / "sshd_config.d" / "lab-node.conf").write_text(
            f"# lab: this node shares the machine's network; its ssh is on a loopback port of its own\n"
            f"Port {self.node.port}\nListenAddress 127.0.0.1\n"
        )
        (upper / "etc" / "hostname").write_text(self.node.name + "\n")
        (upper / "etc" / "hosts").write_text(f"127.0.0.1 localhost\n127.0.1.1 {self.node.name}\n")
        lab = upper / "etc" / "lab"
        lab.mkdir(exist_ok=True)
        (lab / "gpus").write_text(f"{self.node.gpus}\n")
        if self.node.driver_version and not (lab / "driver_version").exists():
            (lab / "driver_version").write_text(self.node.driver_version + "\n")

    @staticmethod
    def converged_args() -> str:
        """What the kernel phase leaves on a node's line with the lab's inventory: the SNP profile's arguments, appended
        to the line's (the role's defaults; the lab's line has none of the arguments the profile removes)."""
        defaults = yaml.safe_load((roles_dir() / "kernel_cmdline" / "defaults" / "main.yml").read_text())
        return " ".join(defaults["kernel_cmdline_snp_args"])

    def _boot_config(self, upper: Path) -> None:
        """The boot configuration of the VM's disk (build-disks.sh), with the profile's arguments as the kernel phase
        leaves them; written once, so that what a test changes there stays."""
        lab = upper / "etc" / "lab"
        if (lab / "boot-config").exists():
            return
        (lab / "root-uuid").write_text(ROOT_UUID + "\n")  # the VMs' root filesystem, on their line
        if self.node.bootloader == "sdboot":
            kernel = upper / "etc" / "kernel"
            kernel.mkdir(parents=True, exist_ok=True)
            (kernel / "cmdline").write_text(
                f"root=UUID={ROOT_UUID} ro console=ttyS0,115200n8 quiet {self.converged_args()}\n"
            )
            (kernel / "proxmox-boot-uuids").write_text(f"{ESP_VOLID[:4]}-{ESP_VOLID[4:]}\n")
        else:
            text = (self.rootfs / "etc" / "default" / "grub").read_text()
            lines = []
            for line in text.splitlines():
                if line.startswith("GRUB_CMDLINE_LINUX="):
                    line = 'GRUB_CMDLINE_LINUX="console=ttyS0,115200n8"'
                elif line.startswith("GRUB_CMDLINE_LINUX_DEFAULT="):
                    line = f'GRUB_CMDLINE_LINUX_DEFAULT="quiet {self.converged_args()}"'
                lines.append(line)
            (upper / "etc" / "default").mkdir(parents=True, exist_ok=True)
            (upper / "etc" / "default" / "grub").write_text("\n".join(lines) + "\n")
        (lab / "boot-config").write_text(self.node.bootloader + "\n")

    def _units(self, upper: Path) -> None:
        """The VMs' overlay (build-disks.sh puts it on their disks), this kind's own files, its units enabled."""
        for overlay in (HERE / "overlay" / "common", HERE / "nspawn-node"):
            for source in overlay.rglob("*"):
                if source.is_file():
                    target = upper / source.relative_to(overlay)
                    target.parent.mkdir(parents=True, exist_ok=True)
                    shutil.copy2(source, target)
                    if "bin" in target.parent.name or target.parent.name == "lab":
                        target.chmod(0o755)
        units = upper / "etc" / "systemd" / "system"
        for unit in MASKED:
            if not (units / unit).is_symlink():
                (units / unit).unlink(missing_ok=True)  # the overlay's copy
                (units / unit).symlink_to("/dev/null")
        for target, enabled in ENABLED.items():
            (units / target).mkdir(exist_ok=True)
            for unit in enabled:
                if not (units / target / unit).is_symlink():
                    (units / target / unit).symlink_to(f"../{unit}")

    # ---------------------------------------------------------------- lifecycle
    def nspawn_command(self) -> list[str]:
        return [
            "systemd-nspawn",
            "--quiet",
            "--boot",
            f"--directory={self.root}",
            f"--machine={self.node.name}",
            "--register=no",
            "--keep-unit",
            "--console=passive",
        ]

    def stop(self, timeout: float = 2) -> None:
        """Stop the node and unmount its root (a node has no link or namespace of its own to remove)."""
        super().stop(timeout=timeout)
        if _mounted(self.root):
            _sh("umount", str(self.root), check=False)

    def teardown(self) -> None:
        self.stop()

    def ssh_destination(self) -> list[str]:
        return ["-p", str(self.node.port), "root@127.0.0.1"]

    def known_hosts_name(self) -> str:
        return f"[127.0.0.1]:{self.node.port}"

    @property
    def spec(self) -> VmSpec:  # the lab reads a node's VmSpec (name, bootloader, port); LabContainer's is set aside
        return self.node

    @spec.setter
    def spec(self, value: ContainerSpec) -> None:
        self._container_spec = value
