"""The kernel_cmdline_info module on this machine as a node, inside a private mount namespace (the harness of
test_kernel_cmdline_trial.py): what it reads before a change, with a trial boot armed by kernel_cmdline, and after the
trial's commit and regeneration; and that reading changes nothing."""

from __future__ import annotations

import pytest

from tests.unit.plugins.modules.test_kernel_cmdline_trial import ESP, ESP_UUID, KVER, NEW_ARG, NEW_KVER, OLD_LINE
from tests.unit.plugins.modules.test_kernel_cmdline_trial import node as node  # the fixture

ARMED = {
    "grub": "/boot/grub/grubenv: next_entry=provision-trial",
    "systemd-boot": "EFI variable LoaderEntryOneShot=provision-trial+1.conf",
}
STATE = "/etc/default /boot /etc/kernel"


def checksums(node) -> str:
    """Every file of the boot configuration, the ESP's and the EFI variables' by checksum."""
    files = node.sh(f"find {STATE} /sys/firmware -type f 2>/dev/null | sort | xargs -r sha256sum").stdout
    if node.bootloader == "systemd-boot":
        files += node.sh(ESP.format("find $ROOT/esp -type f | sort | xargs sha256sum")).stdout
    return files


@pytest.mark.parametrize("node", ["grub", "systemd-boot"], indirect=True)
def test_info_reads_this_boot_and_the_next_and_changes_nothing(node):
    before = checksums(node)
    info = node.run_module("kernel_cmdline_info", {})
    assert checksums(node) == before, "kernel_cmdline_info changed the node"
    assert not info["changed"] and info["bootloader"] == node.bootloader, info
    assert info["armed"] is None and info["trial_recorded"] is False
    assert info["running_line"] == f"BOOT_IMAGE=/boot/vmlinuz-{KVER} {OLD_LINE}"
    assert NEW_ARG not in info["configured_line"]
    if node.bootloader == "systemd-boot":
        assert info["configured_line"] == OLD_LINE and info["next_release"] == NEW_KVER
        assert info["regenerate"] == ["proxmox-boot-tool", "refresh"]
        assert {line for _, line in info["generated"]} == {OLD_LINE} and info["not_running"] == []
        # the entry systemd-boot boots by default comes first: loader.conf's `default proxmox-*`, the newest kernel
        assert [source for source, _ in info["generated"]] == [
            f"{ESP_UUID}:proxmox-{NEW_KVER}.conf",
            f"{ESP_UUID}:proxmox-{KVER}.conf",
        ]
    else:
        assert info["configured_line"] == "quiet" and info["regenerate"] == ["update-grub"]
        assert [source for source, _ in info["generated"]] == ["/boot/grub/grub.cfg"]

    trial = node.module(trial_boot="auto")
    assert trial["trial"]["mode"] == "trial", trial
    armed = checksums(node)
    info = node.run_module("kernel_cmdline_info", {})
    assert checksums(node) == armed, "kernel_cmdline_info changed the node"
    assert info["armed"] == ARMED[node.bootloader] and info["trial_recorded"] is True, info
    assert NEW_ARG not in info["configured_line"], "the default line is not written before its trial"


@pytest.mark.parametrize("node", ["systemd-boot"], indirect=True)
def test_a_committed_line_not_yet_booted_is_what_the_next_boot_runs(node):
    """No trial (trial_boot off): the line becomes the default and proxmox-boot-tool refresh writes it to the ESP; the
    running kernel lacks the new argument, and info names it as the next boot's."""
    assert node.module(trial_boot="off")["files"] == ["/etc/kernel/cmdline"]
    node.sh("proxmox-boot-tool refresh >/dev/null")
    info = node.run_module("kernel_cmdline_info", {})
    assert info["configured_line"] == f"{OLD_LINE} {NEW_ARG}" and info["armed"] is None
    assert info["not_running"] == [NEW_ARG], info


@pytest.mark.parametrize("node", ["grub"], indirect=True)
def test_a_grub_node_without_a_generated_menu_reads_as_one_with_nothing_generated(node):
    node.sh("rm /boot/grub/grub.cfg")
    info = node.run_module("kernel_cmdline_info", {})
    assert not info.get("failed") and (info["generated"], info["not_running"]) == ([], []), info
