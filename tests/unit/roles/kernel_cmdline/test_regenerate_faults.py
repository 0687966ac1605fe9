"""The fault matrix of the kernel phase's regeneration: a /boot or an ESP with no space left.

The role's own tasks (roles/kernel_cmdline with kernel_cmdline_reboot: never, so that it merges the arguments,
regenerates, checks the generated configuration, or restores the backup when anything of that fails, and never
reboots this machine; with never there is no trial boot either) run through ansible-playbook on this machine,
inside a private mount namespace: /etc and /var/lib are copy-on-write overlays there (the GRUB files,
/etc/kernel/cmdline), /boot a small tmpfs, and for systemd-boot the ESP a small file system on a loop device,
named under /dev/disk/by-uuid as proxmox-boot-tool expects (ext2, not FAT: this machine's kernel may lack vfat,
and what matters here is only that a write finds no free block). Nothing outside the namespace changes. The
regenerators are stand-ins that write as the real tools do: update-grub writes grub.cfg.new and moves it over
grub.cfg only when complete (grub-mkconfig); proxmox-boot-tool refresh copies each kernel and initrd, oldest
first, then writes its loader entry in place (proxmox-kernel-helper's zz-proxmox-boot), stopping at the first
write that fails. The disks are filled to the last block, so a write that needs room fails with ENOSPC as it
would on the node.

Each test checks the user's message, that the configuration on disk is the one from before the run (the edited
file restored from its backup, the boot menu untouched, no marker of a changed line), and that with space freed
the next run converges and the one after changes nothing.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.faults import Row
from tests.playbooks import role_outcome_playbook, run_role_playbook
from tests.unit import collection

KVER = "6.8.12-4-pve"
NEW_ARG = "provision_fault=1"
ESP_UUID = "A1B2-C3D4"
MARKER = "cmdline-changed"

UPDATE_GRUB = r"""#!/bin/sh
# Test stand-in for update-grub (grub-mkconfig -o /boot/grub/grub.cfg): the menu goes to grub.cfg.new, moved
# over grub.cfg only once complete; a write that fails stops it (set -e), as grub-mkconfig's does.
set -e
. /etc/default/grub
for f in /etc/default/grub.d/*.cfg; do [ -e "$f" ] && . "$f"; done
cfg=/boot/grub/grub.cfg
{
  printf 'menuentry "Proxmox VE GNU/Linux" {\n\tlinux\t/boot/vmlinuz-%s root=/dev/sda1 ro %s %s\n}\n' \
    "$KVER" "$GRUB_CMDLINE_LINUX" "$GRUB_CMDLINE_LINUX_DEFAULT"
  yes '### a menu entry per kernel and its recovery mode, as a real grub.cfg has' | head -n 400
} | cat > "$cfg.new"
mv -f "$cfg.new" "$cfg"
"""

PROXMOX_BOOT_TOOL = r"""#!/bin/sh
# Test stand-in for proxmox-boot-tool refresh (proxmox-kernel-helper's zz-proxmox-boot, systemd-boot): each ESP in
# /etc/kernel/proxmox-boot-uuids is mounted by its UUID; per kernel in /boot, oldest first, the kernel and its
# initrd are copied to EFI/proxmox/<kver>/ and loader/entries/proxmox-<kver>.conf is written with the first line
# of /etc/kernel/cmdline. set -e: the first write that fails stops it, as the real hook's does.
# `status` is left out on purpose: with kernel_cmdline_bootloader set the role must never detect the bootloader
# (a restore that detected GRUB on this node failed before it restored anything).
set -e
[ "$1" = refresh ] || { echo "stand-in: only refresh" >&2; exit 1; }
CMDLINE=$(head -n1 /etc/kernel/cmdline)
echo "$CMDLINE" | grep -q 'root=' || { echo "No root= parameter in /etc/kernel/cmdline found!" >&2; exit 1; }
while read -r uuid; do
  mnt=/var/tmp/espmounts/$uuid
  mkdir -p "$mnt"
  mount "/dev/disk/by-uuid/$uuid" "$mnt"
  trap 'umount "$mnt"; rmdir "$mnt"' EXIT
  echo "Copying and configuring kernels on /dev/disk/by-uuid/$uuid"
  for kernel in $(ls /boot/vmlinuz-* | sort -V); do
    kver=${kernel#/boot/vmlinuz-}
    echo "	Copying kernel and creating boot-entry for $kver"
    mkdir -p "$mnt/EFI/proxmox/$kver"
    cp --preserve=timestamps "/boot/vmlinuz-$kver" "/boot/initrd.img-$kver" "$mnt/EFI/proxmox/$kver/"
    dir=/EFI/proxmox/$kver
    printf 'title    Proxmox Virtual Environment\nversion  %s\noptions  %s\nlinux    %s\ninitrd   %s\n' \
      "$kver" "$CMDLINE" "$dir/vmlinuz-$kver" "$dir/initrd.img-$kver" > "$mnt/loader/entries/proxmox-$kver.conf"
  done
  umount "$mnt"; rmdir "$mnt"; trap - EXIT
done < /etc/kernel/proxmox-boot-uuids
"""


PLAYBOOK = role_outcome_playbook(
    "kernel_cmdline",
    "The kernel phase up to its reboot, which kernel_cmdline_reboot never leaves out",
    extra_outcome=", 'changed': _kernel_cmdline_config.changed",
    pre_tasks="""
        - name: This machine is the node, which the role must never reboot
          ansible.builtin.assert:
            that: kernel_cmdline_reboot == 'never'
    """,
)


class Namespace:
    """A private mount namespace on this machine, held open by a sleeping process; `sh` runs a script in it."""

    def __init__(self):
        self.proc = subprocess.Popen(["unshare", "--mount", "--propagation", "private", "sleep", "600"])
        ours = os.readlink("/proc/self/ns/mnt")
        deadline = time.monotonic() + 10
        while os.readlink(f"/proc/{self.proc.pid}/ns/mnt") == ours:
            assert time.monotonic() < deadline, "unshare did not make its namespace"
            time.sleep(0.02)

    def sh(self, script: str, env: dict | None = None, check: bool = True) -> subprocess.CompletedProcess:
        argv = ["nsenter", "-t", str(self.proc.pid), "-m", "bash", "-euc", script]
        proc = subprocess.run(argv, capture_output=True, text=True, env={**os.environ, **(env or {})}, timeout=300)
        assert not check or proc.returncode == 0, proc.stderr
        return proc

    def close(self) -> None:
        self.proc.kill()
        self.proc.wait()


class Node:
    """This machine as a PVE node inside a Namespace: its /etc, /boot (and ESP) private to the test."""

    def __init__(self, root: Path, bootloader: str):
        self.root, self.bootloader = root, bootloader
        self.bin, self.state = root / "bin", root / "state"
        for d in ("bin", "state", "etc-up", "etc-work", "lib-up", "lib-work", "dev-up", "dev-work"):
            (root / d).mkdir()
        (self.bin / "update-grub").write_text(UPDATE_GRUB)
        (self.bin / "proxmox-boot-tool").write_text(PROXMOX_BOOT_TOOL)
        for tool in self.bin.iterdir():
            tool.chmod(0o755)
        self.ns = Namespace()
        # copy-on-write /etc and /var/lib (where the role's state would go were its directory not the test's own)
        for path, name in (("/etc", "etc"), ("/var/lib", "lib")):
            upper = f"upperdir={root}/{name}-up,workdir={root}/{name}-work"
            self.sh(f"mount -t overlay overlay -o lowerdir={path},{upper} {path}")
        self.sh("mount -t tmpfs tmpfs /var/tmp")  # where proxmox-boot-tool mounts the ESPs

    def sh(self, script: str, check: bool = True) -> subprocess.CompletedProcess:
        env = {"PATH": f"{self.bin}:{os.environ['PATH']}", "KVER": KVER, "ROOT": str(self.root)}
        return self.ns.sh(script, env=env, check=check)

    def apply(self) -> dict:
        """The role through ansible-playbook, never rebooting: the message it failed with (None: it succeeded), and
        whether its merge changed the configuration."""
        # never: this machine is the node; the role must not reboot it
        extra = {
            "kernel_cmdline_bootloader": self.bootloader,
            "kernel_cmdline_snp_profile": False,
            "kernel_cmdline_reboot": "never",
            "kernel_cmdline_extra_args": [NEW_ARG],
            "provision_state_dir": str(self.state),
        }
        return run_role_playbook(self.sh, self.root, PLAYBOOK, extra, collection.COLLECTIONS)

    def close(self) -> None:
        self.ns.close()  # its mounts go with it
        loop = self.root / "loop"
        if loop.exists():
            subprocess.run(["losetup", "-d", loop.read_text().strip()], check=False)


def fill(path: str) -> str:
    """A script that fills the file system under `path` to its last block."""
    return f"dd if=/dev/zero of={path}/filler bs=4096 2>/dev/null || true; sync"


GRUB_NODE = rf"""
mount -t tmpfs -o size=256k,mode=0755 tmpfs /boot
mkdir -p /etc/default/grub.d /boot/grub
printf 'GRUB_DEFAULT=0\nGRUB_TIMEOUT=5 # kept\n' > /etc/default/grub
printf 'GRUB_CMDLINE_LINUX_DEFAULT="quiet"\nGRUB_CMDLINE_LINUX=""\n' >> /etc/default/grub
head -c 100000 /dev/urandom > /boot/vmlinuz-$KVER
update-grub
{fill("/boot")}
"""
NEW_KVER = "6.8.12-5-pve"
SDBOOT_NODE = rf"""
mount -t tmpfs -o size=4m,mode=0755 tmpfs /boot
head -c 200000 /dev/urandom > /boot/vmlinuz-$KVER; head -c 200000 /dev/urandom > /boot/initrd.img-$KVER
truncate -s 1M $ROOT/esp.img && mkfs.ext2 -q -F -m 0 -b 1024 $ROOT/esp.img
losetup --find --show $ROOT/esp.img > $ROOT/loop
mount -t overlay overlay -o lowerdir=/dev,upperdir=$ROOT/dev-up,workdir=$ROOT/dev-work /dev
mount -t tmpfs tmpfs /dev/shm
mkdir -p /dev/disk/by-uuid $ROOT/esp && ln -s $(cat $ROOT/loop) /dev/disk/by-uuid/{ESP_UUID}
mount /dev/disk/by-uuid/{ESP_UUID} $ROOT/esp && mkdir -p $ROOT/esp/loader/entries $ROOT/esp/EFI/proxmox
mkdir -p /etc/kernel
echo 'root=ZFS=rpool/ROOT/pve-1 boot=zfs quiet' > /etc/kernel/cmdline
echo {ESP_UUID} > /etc/kernel/proxmox-boot-uuids
proxmox-boot-tool refresh >/dev/null
# an upgrade installed a newer kernel, which the ESP has no room for
head -c 200000 /dev/urandom > /boot/vmlinuz-{NEW_KVER}; head -c 200000 /dev/urandom > /boot/initrd.img-{NEW_KVER}
{fill("$ROOT/esp")}
umount $ROOT/esp  # ESPs are mounted only while proxmox-boot-tool or the check reads them
"""


@dataclass(frozen=True)
class Case:
    id: str
    label: str
    bootloader: str
    setup: str
    free: str  # the script that makes room again
    show: str  # the script that prints the configuration that must be as before the faulty run
    after: str  # that configuration, as the doc says it
    sees: str  # the whole message, `…` for what varies


REFUSED = "the new boot configuration was refused (non-zero return code {tool_error}); the previous files were "
RESTORED = (
    "restored from …/kernel-cmdline/backups/… but regenerating failed too, so the boot configuration on disk is the "
    "one from before this run; the host was not rebooted"
)
ESP_MOUNTED = "mount $(cat $ROOT/loop) $ROOT/esp && {} && umount $ROOT/esp"
CASES = [
    Case(
        "grub-full-boot",
        "/boot full during `update-grub`",
        "grub",
        GRUB_NODE,
        "rm /boot/filler",
        "cat /etc/default/grub /boot/grub/grub.cfg",
        "/etc/default/grub and /boot/grub/grub.cfg as before",
        REFUSED.format(tool_error="cat: write error: No space left on device") + RESTORED,
    ),
    Case(
        "sdboot-full-esp",
        "ESP full during `proxmox-boot-tool refresh` (a newer kernel to copy)",
        "systemd-boot",
        SDBOOT_NODE,
        ESP_MOUNTED.format("rm $ROOT/esp/filler"),
        "cat /etc/kernel/cmdline && " + ESP_MOUNTED.format("cat $ROOT/esp/loader/entries/*.conf"),
        "/etc/kernel/cmdline and the ESP's loader entries as before (the older kernel's entry, rewritten with the "
        "new line, is written back by the restore's regeneration before that too runs out of room)",
        REFUSED.format(tool_error="cp: error writing …: No space left on device") + RESTORED,
    ),
]
FAULT_ROWS = [
    Row(
        c.label,
        "kernel",
        f"`{c.sees}`",
        c.after + "; no marker of a changed line; no reboot",
        "yes: with room made, the next run merges, regenerates and checks; the one after changes nothing",
        f"tests/unit/roles/kernel_cmdline/test_regenerate_faults.py::test_regeneration_fault[{c.id}]",
        True,
        True,
    )
    for c in CASES
]


def pattern(sees: str) -> re.Pattern:
    return re.compile(".+?".join(re.escape(part) for part in sees.split("…")))


@pytest.fixture
def node(tmp_path, request):
    if os.geteuid() != 0 or not all(shutil.which(t) for t in ("unshare", "nsenter", "losetup", "mkfs.ext2")):
        pytest.skip("needs root, unshare, nsenter, losetup and mkfs.ext2")
    node = Node(tmp_path, request.param.bootloader)
    yield node
    node.close()


@pytest.mark.parametrize("node", CASES, indirect=True, ids=[c.id for c in CASES])
def test_regeneration_fault(node, request):
    case = request.node.callspec.params["node"]
    node.sh(case.setup)
    before = node.sh(case.show).stdout
    outcome = node.apply()
    assert outcome["changed"], "the merge did not run: nothing was tried"
    assert outcome["failed"] and pattern(case.sees).fullmatch(outcome["failed"]), outcome["failed"]
    assert node.sh(case.show).stdout == before, "the configuration on disk changed"
    assert not (node.state / MARKER).exists(), "the boot configuration was marked as changed"
    node.sh(case.free)
    assert node.apply() == {"failed": None, "changed": True}, "the next run converges"
    assert NEW_ARG in node.sh(case.show).stdout and (node.state / MARKER).exists()
    assert node.apply() == {"failed": None, "changed": False}, "and the one after changes nothing"
