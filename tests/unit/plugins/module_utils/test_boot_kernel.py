"""Which bootloader a node's kernel line goes through, read from `proxmox-boot-tool status` as PVE prints it
(plugins/module_utils/boot_kernel.py detect_bootloader)."""

from __future__ import annotations

import pytest

from provision.paths import module_util

boot_kernel = module_util("boot_kernel")

HEAD = "Re-executing '/usr/sbin/proxmox-boot-tool' in new private mount namespace..\n"
UEFI = HEAD + "System currently booted with uefi\n6D31-87F4 is configured with: uefi (versions: 6.8.12-4-pve)\n"
GRUB = HEAD + "System currently booted with legacy bios\n865E-6ADE is configured with: grub (versions: 6.8.12-4-pve)\n"
MIXED = UEFI + "865E-6ADE is configured with: grub (versions: 6.8.12-4-pve, 6.8.12-8-pve)\n"
BOTH_ON_ONE = UEFI.replace("(versions: 6.8.12-4-pve)", "(versions: 6.8.12-4-pve), grub (versions: 6.8.12-4-pve)")
NONE = HEAD + "System currently booted with uefi\nE: /etc/kernel/proxmox-boot-uuids does not exist.\n"


class Failed(Exception):
    pass


class Node:
    """The module side of a node whose proxmox-boot-tool prints `status` and exits `rc`."""

    def __init__(self, status: str | None, rc: int = 0):
        self.status, self.rc = status, rc

    def get_bin_path(self, name):
        return f"/usr/sbin/{name}" if self.status is not None else None

    def run_command(self, argv):
        assert argv == ["/usr/sbin/proxmox-boot-tool", "status"]
        return self.rc, self.status, ""

    def fail_json(self, msg):
        raise Failed(msg)


@pytest.mark.parametrize(
    ("status", "rc", "bootloader"),
    [
        (UEFI, 0, "systemd-boot"),
        (GRUB, 0, "grub"),
        (BOTH_ON_ONE, 0, "systemd-boot"),
        (NONE, 2, "grub"),
        (None, 0, "grub"),
    ],
    ids=["uefi", "grub", "uefi-and-grub-on-one-esp", "no-esps", "no-tool"],
)
def test_the_esps_kind_names_the_bootloader(status, rc, bootloader):
    assert boot_kernel.detect_bootloader(Node(status, rc))[0] == bootloader


def test_an_esp_that_holds_both_kinds_is_uefi_and_another_that_is_grubs_alone_is_named():
    kinds = boot_kernel.esp_kinds(BOTH_ON_ONE + "865E-6ADE is configured with: grub (versions: 6.8.12-4-pve)\n")
    assert kinds == {"uefi": ["6D31-87F4"], "grub": ["865E-6ADE"]}


def test_esps_of_both_kinds_fail_naming_each_and_the_files_each_reads():
    with pytest.raises(Failed) as failed:
        boot_kernel.detect_bootloader(Node(MIXED))
    message = str(failed.value)
    assert "with uefi (6D31-87F4) and with grub (865E-6ADE)" in message and "\n" not in message
    assert "/etc/kernel/cmdline" in message and "/etc/default/grub" in message
