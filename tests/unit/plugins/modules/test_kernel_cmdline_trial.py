"""The kernel_cmdline module's trial boot, end to end on this machine, with nothing outside a mount namespace changed.

As in tests/unit/roles/kernel_cmdline/test_regenerate_faults.py, the node is this machine inside a private mount
namespace: /etc and /var/lib copy-on-write, /boot a tmpfs, for systemd-boot an ESP on a loop device named under
/dev/disk/by-uuid. There, a tmpfs over /sys/firmware stands for the EFI variables (efivarfs file format: 4 bytes of
attributes, then UTF-16) and a file bound over /proc/cmdline for the running kernel's command line, so that "the node
booted the trial" is the state a real boot leaves: the bootloader took the one-shot, the kernel runs the trial's line.
The bootloader's tools are stand-ins that do what the real ones do to the files the module reads: grub-editenv
keeps KEY=VALUE lines, grub-reboot sets next_entry with it (util/grub-reboot.in), grub-probe answers what the test
says; bootctl set-oneshot writes or deletes LoaderEntryOneShot (src/boot/bootctl.c verb_set_efivar()).

The module runs as Ansible runs it (tests/unit/plugins/modules/test_provision_state.py's call), the same actions the
role calls: configure (the trial, or the commit after it), running, trial_remove.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path

import pytest

from tests.faults import Row
from tests.playbooks import role_outcome_playbook, run_role_playbook
from tests.unit import FIXTURES, collection
from tests.unit.plugins.modules.test_provision_state import PLUGINS, RUNNER
from tests.unit.roles.kernel_cmdline.test_regenerate_faults import KVER, NEW_KVER, Node, pattern

NEW_ARG = "provision_trial=1"
GUID = "4a67b082-0a4c-41cf-b6c7-440b29bb8c4f"
ESP_UUID = "B1C2-D3E4"
DEBIAN12_GRUB_CFG = FIXTURES / "boot" / "debian12-grub.cfg"
OLD_LINE = "root=UUID=6b3d2f9e-1a2b-4c3d-8e4f-5a6b7c8d9e0f ro console=ttyS0,115200n8 quiet"
USER_CUSTOM = "menuentry 'memtest86+' {\n\tlinux16 /boot/memtest86+.bin\n}\n"

GRUB_EDITENV = r"""#!/bin/sh
# stand-in: grub-editenv FILE list | set KEY=VALUE | unset KEY, on KEY=VALUE lines
f=$1; cmd=$2; shift 2; touch "$f"
case $cmd in
  list) cat "$f" ;;
  set) for kv in "$@"; do
         grep -v "^${kv%%=*}=" "$f" > "$f.new" || true; echo "$kv" >> "$f.new"; mv "$f.new" "$f"
       done ;;
  unset) for k in "$@"; do grep -v "^$k=" "$f" > "$f.new" || true; mv "$f.new" "$f"; done ;;
esac
"""
GRUB_REBOOT = """#!/bin/sh
exec grub-editenv /boot/grub/grubenv set next_entry="$1"
"""
GRUB_PROBE = """#!/bin/sh
# stand-in: the answers the test gives for --target=abstraction and --target=fs
case "$1" in
  --target=abstraction) cat "$ROOT/probe-abstraction" ;;
  --target=fs) cat "$ROOT/probe-fs" ;;
  *) exit 1 ;;
esac
"""
BOOTCTL = f"""#!{sys.executable}
# stand-in: bootctl set-oneshot ID (an empty ID deletes the variable), as efivarfs stores it; firmware that refuses
# EFI variable writes (efivarfs then fails the write with EIO, and bootctl says so) or drops them (the write returns,
# and the variable is not there) where /sys/firmware/efi/firmware-writes says `refuse` or `drop`
import os, sys
assert sys.argv[1] == "set-oneshot", sys.argv
path = "/sys/firmware/efi/efivars/LoaderEntryOneShot-{GUID}"
said = "/sys/firmware/efi/firmware-writes"
firmware = open(said).read().strip() if os.path.exists(said) else ""
if firmware == "refuse":
    sys.exit("Failed to update EFI variable 'LoaderEntryOneShot': Input/output error")
if firmware == "drop":
    sys.exit(0)
if firmware == "bootctl-broken":  # a failure of bootctl's own, not of the variable's write
    sys.exit("Failed to parse arguments: unexpected error")
if sys.argv[2]:
    open(path, "wb").write((7).to_bytes(4, "little") + (sys.argv[2] + "\\0").encode("utf-16-le"))
elif os.path.exists(path):
    os.unlink(path)
"""


class TrialNode(Node):
    """A Node (test_regenerate_faults.py) with the trial's tools, EFI variables and a /proc/cmdline of its own."""

    def __init__(self, root: Path, bootloader: str):
        super().__init__(root, bootloader)
        for name, text in (
            ("grub-editenv", GRUB_EDITENV),
            ("grub-reboot", GRUB_REBOOT),
            ("grub-probe", GRUB_PROBE),
            ("bootctl", BOOTCTL),
        ):
            (self.bin / name).write_text(text)
            (self.bin / name).chmod(0o755)
        self.sh("mount -t tmpfs tmpfs /sys/firmware")
        self.sh(f"touch $ROOT/cmdline && mount --bind $ROOT/cmdline /proc/cmdline && rm -f {' '.join(PBT_FILES)}")

    def boots(self, line: str, selected: str | None = None) -> None:
        """The node now runs `line` (and, with `selected`, systemd-boot says it booted that entry)."""
        (self.root / "cmdline").write_text(f"BOOT_IMAGE=/boot/vmlinuz-{KVER} {line}\n")
        if selected:
            self.efi_var("LoaderEntrySelected", selected)

    def efi_var(self, name: str, value: str | None = None) -> str | None:
        """Set (or with None read) a systemd-boot EFI variable, in efivarfs's format."""
        path = f"/sys/firmware/efi/efivars/{name}-{GUID}"
        if value is None:
            script = f"import sys; d = open({path!r}, 'rb').read(); print(d[4:].decode('utf-16-le').rstrip(chr(0)))"
            proc = self.sh(f'{sys.executable} -c "{script}"', check=False)
            return proc.stdout.strip() if proc.returncode == 0 else None
        data = (6).to_bytes(4, "little") + (value + "\0").encode("utf-16-le")
        self.sh(
            f"mkdir -p /sys/firmware/efi/efivars && echo {data.hex()} | {sys.executable} -c "
            f"\"import sys; open({path!r}, 'wb').write(bytes.fromhex(sys.stdin.read().strip()))\""
        )
        return value

    def module(self, **args) -> dict:
        """The kernel_cmdline module, as Ansible runs it, inside the namespace."""
        args = {"add": [NEW_ARG], "remove": [], **args}
        return self.run_module("kernel_cmdline", args)

    def run_module(self, name: str, args: dict) -> dict:
        """A module of the collection, as Ansible runs it, inside the namespace (with this node's bootloader and the
        kernel phase's state directory)."""
        args = {"bootloader": self.bootloader, "backup_dir": str(self.state / "kernel-cmdline"), **args}
        args_file = self.root / "args.json"
        args_file.write_text(json.dumps({"ANSIBLE_MODULE_ARGS": args}))
        module = PLUGINS / "modules" / f"{name}.py"
        proc = self.sh(f'{sys.executable} -c "{RUNNER}" {collection.COLLECTIONS} {module} {args_file}', check=False)
        assert proc.stdout, proc.stderr
        return json.loads(proc.stdout)

    def read(self, path: str) -> str | None:
        proc = self.sh(f"cat {path}", check=False)
        return proc.stdout if proc.returncode == 0 else None


PBT_FILES = ("/etc/kernel/proxmox-boot-uuids", "/etc/kernel/cmdline", "/etc/default/grub.d/*.cfg")
GRUB_SETUP = rf"""
mount -t tmpfs -o mode=0755 tmpfs /boot
mkdir -p /etc/default/grub.d /boot/grub
cp {DEBIAN12_GRUB_CFG} /boot/grub/grub.cfg
printf 'GRUB_DEFAULT=0\nGRUB_TIMEOUT=5\nGRUB_CMDLINE_LINUX_DEFAULT="quiet"\n' > /etc/default/grub
printf 'GRUB_CMDLINE_LINUX="console=ttyS0,115200n8"\n' >> /etc/default/grub
printf %s "{USER_CUSTOM}" > /boot/grub/custom.cfg
echo ext2 > $ROOT/probe-fs; : > $ROOT/probe-abstraction
"""
SDBOOT_SETUP = rf"""
mount -t tmpfs -o mode=0755 tmpfs /boot
for k in {KVER} {NEW_KVER}; do
  head -c 1000 /dev/urandom > /boot/vmlinuz-$k; head -c 1000 /dev/urandom > /boot/initrd.img-$k
done
truncate -s 2M $ROOT/esp.img && mkfs.ext2 -q -F -m 0 -b 1024 $ROOT/esp.img
losetup --find --show $ROOT/esp.img > $ROOT/loop
mount -t overlay overlay -o lowerdir=/dev,upperdir=$ROOT/dev-up,workdir=$ROOT/dev-work /dev
mkdir -p /dev/disk/by-uuid $ROOT/esp && ln -s $(cat $ROOT/loop) /dev/disk/by-uuid/{ESP_UUID}
mount /dev/disk/by-uuid/{ESP_UUID} $ROOT/esp && mkdir -p $ROOT/esp/loader/entries $ROOT/esp/EFI/proxmox
printf 'timeout 3\ndefault proxmox-*\n' > $ROOT/esp/loader/loader.conf
mkdir -p /etc/kernel
echo '{OLD_LINE}' > /etc/kernel/cmdline
echo {ESP_UUID} > /etc/kernel/proxmox-boot-uuids
proxmox-boot-tool refresh >/dev/null
umount $ROOT/esp
mkdir -p /sys/firmware/efi/efivars
"""
ESP = f"mount /dev/disk/by-uuid/{ESP_UUID} $ROOT/esp && {{}}; umount $ROOT/esp"


@pytest.fixture
def node(tmp_path, request):
    tools = ("unshare", "nsenter", "losetup", "mkfs.ext2")
    if os.geteuid() != 0 or not all(shutil.which(t) for t in tools):
        pytest.skip(f"needs root and {', '.join(tools)}")
    node = TrialNode(tmp_path, request.param)
    node.sh(GRUB_SETUP if request.param == "grub" else SDBOOT_SETUP)
    node.boots(OLD_LINE)
    if request.param == "systemd-boot":
        node.efi_var("LoaderInfo", "systemd-boot 252.39-1~deb12u2")  # what systemd-boot sets when it boots a node
    yield node
    node.close()


def grub_files(node) -> dict:
    return {p: node.read(p) for p in ("/etc/default/grub", "/boot/grub/grub.cfg", "/boot/grub/custom.cfg")}


def next_entry(node) -> str | None:
    listing = node.read("/boot/grub/grubenv") or ""
    return next((ln.split("=", 1)[1] for ln in listing.split("\n") if ln.startswith("next_entry=")), None)


@pytest.mark.parametrize("node", ["grub"], indirect=True)
def test_grub_boots_the_new_line_once_from_custom_cfg_then_commits_it(node):
    before = grub_files(node)
    out = node.module(trial_boot="auto")
    assert out["changed"] and out["trial"]["mode"] == "trial", out
    after = grub_files(node)
    assert after["/etc/default/grub"] == before["/etc/default/grub"], "the default line was written before its trial"
    assert after["/boot/grub/grub.cfg"] == before["/boot/grub/grub.cfg"]
    custom = after["/boot/grub/custom.cfg"]
    assert custom.startswith(USER_CUSTOM) and "--id provision-trial" in custom, "the user's entry kept, ours added"
    assert f"/boot/vmlinuz-6.1.0-57-amd64 {OLD_LINE} {NEW_ARG}\n" in custom
    assert next_entry(node) == "provision-trial", "grub-reboot selected it once"
    assert not (node.state / "kernel-cmdline" / "backups").exists(), "nothing of the default was backed up: unchanged"

    # the node booted the trial: GRUB cleared next_entry (00_header's save_env), the kernel runs the trial's line
    node.sh("grub-editenv /boot/grub/grubenv unset next_entry")
    node.boots(out["trial"]["line"])
    assert node.module(action="running")["reboot_needed"] is False

    commit = node.module()  # the role's commit.yml: a configure call without a trial
    assert commit["changed"] and commit["trial"]["mode"] == "none" and commit["backup"]
    assert commit["trial_removed"] == ["/boot/grub/custom.cfg: the trial menu entry"]
    assert NEW_ARG in node.read("/etc/default/grub") and node.read("/boot/grub/custom.cfg") == USER_CUSTOM
    assert not (node.state / "kernel-cmdline" / "trial.json").exists()
    again = node.module(trial_boot="auto")
    assert not again["changed"] and again["trial"]["mode"] == "none" and again["trial_removed"] == []


@pytest.mark.parametrize("node", ["grub"], indirect=True)
def test_a_grub_node_back_on_its_old_line_keeps_its_default_and_loses_the_trial_entry(node):
    before = grub_files(node)
    assert node.module(trial_boot="auto")["trial"]["mode"] == "trial"
    # power-cycled after a hang: GRUB had taken the one-shot, the default entry booted
    node.sh("grub-editenv /boot/grub/grubenv unset next_entry")
    assert node.module(action="running")["reboot_needed"] is True
    out = node.module(action="trial_remove")
    assert out["changed"] and out["trial_removed"] == ["/boot/grub/custom.cfg: the trial menu entry"]
    assert grub_files(node) == before and next_entry(node) is None


@pytest.mark.parametrize("node", ["grub"], indirect=True)
def test_the_next_run_removes_a_trial_entry_an_interrupted_run_left_before_anything_else(node):
    node.sh("rm /boot/grub/custom.cfg")
    assert node.module(trial_boot="auto")["trial"]["mode"] == "trial"  # then interrupted: never rebooted
    assert node.module(action="configure", _ansible_check_mode=True)["trial_removed"] == [
        "/boot/grub/custom.cfg: the trial menu entry",
        "/boot/grub/grubenv: next_entry=provision-trial",
    ], "check mode says what it would remove"
    assert node.read("/boot/grub/custom.cfg") is not None, "and removes nothing"
    out = node.module(reboot="never", trial_boot="auto")
    assert len(out["trial_removed"]) == 2 and out["trial"]["mode"] == "none"
    assert node.read("/boot/grub/custom.cfg") is None and next_entry(node) is None, "ours alone: the file went"
    assert NEW_ARG in node.read("/etc/default/grub"), "reboot never: the default written, no trial"


@pytest.mark.parametrize("node", ["grub"], indirect=True)
@pytest.mark.parametrize(
    ("abstraction", "fs", "reason"), [("lvm", "ext2", "/boot/grub is on lvm"), ("", "btrfs", "/boot/grub is on btrfs")]
)
def test_where_grub_cannot_clear_the_one_shot_required_changes_nothing_and_auto_warns(node, abstraction, fs, reason):
    node.sh(f"echo '{abstraction}' > $ROOT/probe-abstraction; echo {fs} > $ROOT/probe-fs")
    before = grub_files(node)
    out = node.module(trial_boot="required")
    assert out["trial"]["mode"] == "refuse" and out["trial"]["reason"].startswith(reason) and not out["changed"]
    assert grub_files(node) == before and not (node.state / "kernel-cmdline").exists(), "something was written"
    out = node.module(trial_boot="auto")
    assert out["trial"]["mode"] == "warn" and out["trial"]["reason"].startswith(reason) and out["backup"]
    assert NEW_ARG in node.read("/etc/default/grub") and node.read("/boot/grub/custom.cfg") == USER_CUSTOM
    assert next_entry(node) is None


@pytest.mark.parametrize("node", ["grub"], indirect=True)
def test_a_grub_default_other_than_the_first_entry_rules_the_trial_out(node):
    node.sh("sed -i 's/^GRUB_DEFAULT=0/GRUB_DEFAULT=saved/' /etc/default/grub")
    out = node.module(trial_boot="auto")
    assert out["trial"] == {
        "mode": "warn",
        "reason": "GRUB_DEFAULT is 'saved', not 0: the entry the node boots by default is not the first",
    }


@pytest.mark.parametrize("node", ["systemd-boot"], indirect=True)
def test_systemd_boot_boots_a_copy_of_the_default_entry_once_then_commits(node):
    entries = node.sh(ESP.format("cat $ROOT/esp/loader/entries/*.conf")).stdout
    out = node.module(trial_boot="auto")
    assert out["trial"]["mode"] == "trial", out
    assert node.read("/etc/kernel/cmdline") == OLD_LINE + "\n", "the default line was written before its trial"
    listing = node.sh(ESP.format("ls $ROOT/esp/loader/entries")).stdout.split()
    assert sorted(listing) == ["provision-trial+1.conf", f"proxmox-{KVER}.conf", f"proxmox-{NEW_KVER}.conf"]
    trial = node.sh(ESP.format("cat $ROOT/esp/loader/entries/provision-trial+1.conf")).stdout
    assert f"options  {OLD_LINE} {NEW_ARG}\n" in trial, trial
    assert f"linux    /EFI/proxmox/{NEW_KVER}/vmlinuz-{NEW_KVER}" in trial, "a copy of the newest: the default"
    assert node.sh(ESP.format("cat $ROOT/esp/loader/entries/proxmox-*.conf")).stdout == entries
    assert node.efi_var("LoaderEntryOneShot") == "provision-trial+1.conf"

    # systemd-boot took the one-shot (deleting the variable), counted the entry's try (renaming its file) and booted it
    node.sh(f"rm /sys/firmware/efi/efivars/LoaderEntryOneShot-{GUID}")
    node.sh(
        ESP.format(
            "mv $ROOT/esp/loader/entries/provision-trial+1.conf $ROOT/esp/loader/entries/provision-trial+0-1.conf"
        )
    )
    node.boots(out["trial"]["line"], selected="provision-trial+1.conf")
    seen = node.module(action="running")
    assert seen["reboot_needed"] is False and seen["loader_entry_selected"] == "provision-trial+1.conf"

    commit = node.module()
    assert (
        commit["changed"]
        and commit["backup"]
        and commit["trial_removed"] == [f"{ESP_UUID}:loader/entries/provision-trial+0-1.conf"]
    )
    assert node.read("/etc/kernel/cmdline") == f"{OLD_LINE} {NEW_ARG}\n"
    assert "provision-trial" not in node.sh(ESP.format("ls $ROOT/esp/loader/entries")).stdout


@pytest.mark.parametrize("node", ["systemd-boot"], indirect=True)
def test_a_systemd_boot_node_back_on_its_old_line_loses_the_entry_and_an_untaken_one_shot(node):
    assert node.module(trial_boot="auto")["trial"]["mode"] == "trial"
    # the one-shot was not taken (the firmware booted another way): the variable is still set, the old line runs
    out = node.module(action="trial_remove")
    assert out["trial_removed"] == [
        f"{ESP_UUID}:loader/entries/provision-trial+1.conf",
        "EFI variable LoaderEntryOneShot",
    ]
    assert node.efi_var("LoaderEntryOneShot") is None
    assert node.read("/etc/kernel/cmdline") == OLD_LINE + "\n"
    assert "provision-trial" not in node.sh(ESP.format("ls $ROOT/esp/loader/entries")).stdout


ONESHOT_LOST = {
    "drop": "the firmware did not keep systemd-boot's one-shot (after bootctl set-oneshot provision-trial+1.conf, "
    "LoaderEntryOneShot reads nothing)",
    "refuse": "the firmware refused systemd-boot's one-shot (bootctl set-oneshot provision-trial+1.conf: Failed to "
    "update EFI variable 'LoaderEntryOneShot': Input/output error)",
}


@pytest.mark.parametrize("node", ["systemd-boot"], indirect=True)
@pytest.mark.parametrize("firmware", sorted(ONESHOT_LOST))
def test_a_one_shot_the_firmware_loses_is_no_trial_and_never_blames_the_line(node, firmware):
    """Firmware that refuses or drops the one-shot's EFI variable write: the one-shot is read back after bootctl.
    `required` then writes nothing (the trial entry is removed again); `auto` makes the line the default for a
    monitored reboot, saying why there is no trial. No trial boot is armed that could not run."""
    node.sh(f"echo {firmware} > /sys/firmware/efi/firmware-writes")
    entries = node.sh(ESP.format("ls $ROOT/esp/loader/entries")).stdout
    out = node.module(trial_boot="required")
    assert out["trial"] == {"mode": "refuse", "reason": ONESHOT_LOST[firmware]} and not out["changed"], out
    assert node.read("/etc/kernel/cmdline") == OLD_LINE + "\n"
    assert node.sh(ESP.format("ls $ROOT/esp/loader/entries")).stdout == entries, "the trial entry was left"
    assert not (node.state / "kernel-cmdline" / "trial.json").exists() and node.efi_var("LoaderEntryOneShot") is None
    assert not (node.state / "kernel-cmdline" / "wanted.json").exists()

    out = node.module(trial_boot="auto")
    assert out["trial"] == {"mode": "warn", "reason": ONESHOT_LOST[firmware]} and out["backup"], out
    assert node.read("/etc/kernel/cmdline") == f"{OLD_LINE} {NEW_ARG}\n"
    assert "provision-trial" not in node.sh(ESP.format("ls $ROOT/esp/loader/entries")).stdout


@pytest.mark.parametrize("node", ["systemd-boot"], indirect=True)
@pytest.mark.parametrize("booted", [False, True], ids=["never-booted", "booted-and-hung"])
def test_a_one_shot_lost_at_the_reset_is_told_from_a_trial_that_hung_by_the_entrys_boot_counter(node, booted):
    """The one-shot read back as armed, and the node came back on its old line from its default entry. Where the
    firmware lost the variable at the reset, systemd-boot never booted the trial entry: its file keeps its untouched
    boot counter. The removal after the trial says the trial never ran and records the firmware's loss, and the next
    run boots no trial there (`auto` warns and writes the default for a monitored reboot, `required` refuses). Where
    the loader booted the entry (renamed +0-1) and the boot hung, the new line is to blame, and nothing is recorded."""
    assert node.module(trial_boot="auto")["trial"]["mode"] == "trial"
    assert node.efi_var("LoaderEntryOneShot") == "provision-trial+1.conf", "read back as armed"
    node.sh(f"rm /sys/firmware/efi/efivars/LoaderEntryOneShot-{GUID}")  # consumed, or lost at the reset
    if booted:
        node.sh(
            ESP.format(
                "mv $ROOT/esp/loader/entries/provision-trial+1.conf $ROOT/esp/loader/entries/provision-trial+0-1.conf"
            )
        )
    node.boots(OLD_LINE, selected=f"proxmox-{NEW_KVER}.conf")
    out = node.module(action="trial_remove", after_trial=True)
    record = node.state / "kernel-cmdline" / "oneshot-lost.json"
    name = "provision-trial+0-1.conf" if booted else "provision-trial+1.conf"
    assert out["trial_removed"] == [f"{ESP_UUID}:loader/entries/{name}"], out
    if booted:
        assert out["trial_never_ran"] is None and not record.exists()
        assert node.module(trial_boot="auto")["trial"]["mode"] == "trial", "a hung trial does not rule out the next"
        return
    lost = (
        f"the firmware did not keep systemd-boot's one-shot through the reboot: LoaderEntryOneShot read back "
        f"provision-trial+1.conf after bootctl set-oneshot, yet the loader booted proxmox-{NEW_KVER}.conf and "
        "never provision-trial+1.conf (its boot counter is untouched)"
    )
    assert json.loads(record.read_text())["reason"] == lost
    assert out["trial_never_ran"] == (
        f"{lost}; recorded in {record}: until it is removed, runs boot no trial on this node (auto makes the line the "
        "default and reboots, monitored; required refuses)"
    )
    entries = node.sh(ESP.format("ls $ROOT/esp/loader/entries")).stdout
    refused = node.module(trial_boot="required")
    assert refused["trial"]["mode"] == "refuse" and refused["trial"]["reason"].startswith(lost + " (trial boot of 20")
    assert refused["trial"]["reason"].endswith(f"remove {record} once the firmware keeps EFI variables)")
    assert (
        node.sh(ESP.format("ls $ROOT/esp/loader/entries")).stdout == entries
        and node.efi_var("LoaderEntryOneShot") is None
    )
    out = node.module(trial_boot="auto")
    assert out["trial"]["mode"] == "warn" and out["backup"], out
    assert node.read("/etc/kernel/cmdline") == f"{OLD_LINE} {NEW_ARG}\n" and node.efi_var("LoaderEntryOneShot") is None


@pytest.mark.parametrize("node", ["systemd-boot"], indirect=True)
def test_a_bootctl_failure_of_its_own_stops_the_run_with_nothing_written(node):
    """bootctl failing for another reason than the variable's write is no firmware refusal: no fallback to a reboot
    without a trial; the run stops, its trial entry removed again."""
    node.sh("echo bootctl-broken > /sys/firmware/efi/firmware-writes")
    entries = node.sh(ESP.format("ls $ROOT/esp/loader/entries")).stdout
    out = node.module(trial_boot="auto")
    assert out.get("failed") and out["msg"].startswith("cannot prepare the trial boot (bootctl set-oneshot "), out
    assert out["msg"].endswith("its entry was removed again; nothing was changed")
    assert node.read("/etc/kernel/cmdline") == OLD_LINE + "\n"
    assert node.sh(ESP.format("ls $ROOT/esp/loader/entries")).stdout == entries


@pytest.mark.parametrize("node", ["systemd-boot"], indirect=True)
def test_a_node_not_booted_by_systemd_boot_cannot_take_a_one_shot(node):
    node.sh("rm -rf /sys/firmware/efi")
    assert node.module(trial_boot="auto")["trial"] == {"mode": "warn", "reason": "the node did not boot with UEFI"}
    node.sh("mkdir -p /sys/firmware/efi/efivars")
    out = node.module(trial_boot="required", add=["other=1"])
    assert out["trial"]["mode"] == "refuse" and "no LoaderInfo EFI variable" in out["trial"]["reason"]


# ----------------------------------------------------------------- the role's trial flow, through ansible-playbook
# The role runs as playbooks/kernel.yml runs it, from a copy of the collection in which two tasks of reboot.yml are
# replaced: the reboot becomes BOOT (below), which does to the node's files what a reboot through its bootloader
# does, and the wait for pve-guests.service goes (this machine may not run systemd). Everything after the boot (the
# check, the trial's verdict, the commit, the rescue) is the role's own.
BOOT = f"""#!{sys.executable}
# stand-in for a reboot: BOOT trial | hang | not-taken | trial-then-full-boot. The bootloader takes its one-shot
# (GRUB: next_entry, cleared as 00_header's save_env does; systemd-boot: LoaderEntryOneShot, deleted as
# config_load_defaults() does) unless not-taken; trial boots the trial entry, hang hangs in it and is power-cycled
# into the default entry.
import glob, os, re, subprocess, sys
mode, root = sys.argv[1], os.environ["ROOT"]
efivars = "/sys/firmware/efi/efivars/{{}}-{GUID}"

def args_of(text, after=""):
    text = text.split(after, 1)[1] if after else text
    return re.search(r"^\\s*linux\\s+\\S+ (.*)$", text, re.M).group(1)

if not os.path.exists("/etc/kernel/proxmox-boot-uuids"):
    env = open("/boot/grub/grubenv").read() if os.path.exists("/boot/grub/grubenv") else ""
    once = re.search(r"^next_entry=(.*)$", env, re.M)
    if once and mode != "not-taken":
        subprocess.run(["grub-editenv", "/boot/grub/grubenv", "unset", "next_entry"], check=True)
    if once and mode.startswith("trial"):
        line = args_of(open("/boot/grub/custom.cfg").read(), "--id " + once.group(1))
    else:
        line = args_of(open("/boot/grub/grub.cfg").read())
    selected = None
else:
    var = efivars.format("LoaderEntryOneShot")
    once = open(var, "rb").read()[4:].decode("utf-16-le").rstrip("\\0") if os.path.exists(var) else None
    if once and mode != "not-taken":
        os.unlink(var)
    esp = os.path.join(root, "esp")
    subprocess.run(["mount", "/dev/disk/by-uuid/{ESP_UUID}", esp], check=True)
    entries = sorted(glob.glob(esp + "/loader/entries/proxmox-*.conf"))
    if once and mode != "not-taken":  # the loader counts the try: config_entry_bump_counters renames the file
        os.rename(esp + "/loader/entries/" + once, esp + "/loader/entries/" + once.replace("+1.conf", "+0-1.conf"))
    selected = once if once and mode == "trial" else os.path.basename(entries[-1])
    name = selected.replace("+1.conf", "+0-1.conf") if selected == once else selected
    line = re.search(r"^options\\s+(.*)$", open(esp + "/loader/entries/" + name).read(), re.M).group(1)
    subprocess.run(["umount", esp], check=True)
    data = (6).to_bytes(4, "little") + (selected + "\\0").encode("utf-16-le")
    open(efivars.format("LoaderEntrySelected"), "wb").write(data)
open(os.path.join(root, "cmdline"), "w").write("BOOT_IMAGE=/vmlinuz " + line + "\\n")
if mode == "trial-then-full-boot":  # /boot fills up while the node is on its trial boot, leaving 8 KiB
    subprocess.run("dd if=/dev/zero of=/boot/filler bs=4096 2>/dev/null; truncate -s -8K /boot/filler", shell=True)
"""
PLAYBOOK = role_outcome_playbook("kernel_cmdline", "The kernel phase of one node, its reboot a stand-in")


@pytest.fixture(scope="module")
def stand_in_reboot(tmp_path_factory):
    """A copy of the collection whose reboot (and wait for pve-guests) is the BOOT stand-in."""
    import yaml

    collections = tmp_path_factory.mktemp("collections")
    copy = collections / "ansible_collections" / "provision" / "pve_sglang"
    copy.mkdir(parents=True)
    for part in ("galaxy.yml", "meta", "plugins", "roles"):
        source = PLUGINS.parent / part
        (shutil.copytree if source.is_dir() else shutil.copy)(source, copy / part)
    reboot = copy / "roles" / "kernel_cmdline" / "tasks" / "reboot.yml"
    tasks = yaml.safe_load(reboot.read_text())
    # the guest check before a reboot reads the PVE API (tests/unit/plugins/modules/test_pve_node_guests.py): none
    # here, neither before anything is written (configure.yml) nor before the reboot
    (reboot.parent / "before_reboot.yml").write_text("---\n[]\n")
    tasks = [t for t in tasks if t.get("ansible.builtin.include_tasks") != "before_reboot.yml"]
    assert [t["name"] for t in tasks[:2]] == [
        "Reboot into the new kernel command line",
        "Wait for the node's onboot guests",
    ]
    tasks[:2] = [
        {
            "name": "Boot through the bootloader stand-in",
            "ansible.builtin.command": "boot {{ boot_mode }}",
            "when": tasks[0]["when"],
            "register": tasks[0]["register"],
            "changed_when": True,
        }
    ]
    reboot.write_text(yaml.safe_dump(tasks, sort_keys=False))
    return collections


def apply(node: TrialNode, collections: Path, boot_mode: str) -> str | None:
    """The role on the node through ansible-playbook, its reboot the BOOT stand-in; the failure message or None."""
    (node.bin / "boot").write_text(BOOT)
    (node.bin / "boot").chmod(0o755)
    extra = {
        "kernel_cmdline_bootloader": node.bootloader,
        "kernel_cmdline_snp_profile": False,
        "kernel_cmdline_extra_args": [NEW_ARG],
        "provision_state_dir": str(node.state),
        "boot_mode": boot_mode,
    }
    return run_role_playbook(node.sh, node.root, PLAYBOOK, extra, collections)["failed"]


def boot_config(node) -> dict:
    """The node's default boot configuration: what boots after a power cycle."""
    if node.bootloader == "grub":
        return {p: node.read(p) for p in ("/etc/default/grub", "/boot/grub/grub.cfg")}
    return {
        "/etc/kernel/cmdline": node.read("/etc/kernel/cmdline"),
        "ESP": node.sh(ESP.format("cat $ROOT/esp/loader/entries/proxmox-*.conf")).stdout,
    }


def trial_left(node) -> list[str]:
    """What of a trial entry is on the node."""
    left = [f"next_entry={e}" for e in [next_entry(node)] if e]
    left += ["custom.cfg block" for c in [node.read("/boot/grub/custom.cfg")] if c and "provision-trial" in c]
    if node.bootloader == "systemd-boot":
        left += [n for n in node.sh(ESP.format("ls $ROOT/esp/loader/entries")).stdout.split() if "trial" in n]
        left += ["LoaderEntryOneShot" for v in [node.efi_var("LoaderEntryOneShot")] if v]
    return left


def running(node) -> str:
    return (node.root / "cmdline").read_text()


@pytest.mark.parametrize(("node", "boot_mode"), [("grub", "hang"), ("systemd-boot", "not-taken")], indirect=["node"])
def test_a_node_back_on_its_old_line_keeps_its_default_and_the_next_run_converges(node, stand_in_reboot, boot_mode):
    """hang: the trial entry booted and hung, and a power cycle booted the default; not-taken: the bootloader did not
    take the one-shot (still set). Either way the role stops with one line; a run that boots the trial commits it."""
    before = boot_config(node)
    failed = apply(node, stand_in_reboot, boot_mode)
    files = (
        "/etc/default/grub, /boot/grub/grub.cfg"
        if node.bootloader == "grub"
        else "/etc/kernel/cmdline, loader/entries/proxmox-*.conf on the ESPs"
    )
    said = (
        "the trial boot did not come up on the new line (running: BOOT_IMAGE=/vmlinuz " + OLD_LINE + ")"
        if node.bootloader == "grub"
        else "the trial boot never ran, so the new line was not tried: systemd-boot did not take the one-shot: "
        "LoaderEntryOneShot still named provision-trial+1.conf after the reboot, which booted proxmox-6.8.12-5-pve.conf"
    )
    unchanged = f"the default boot entry is unchanged ({files}), trial entry removed; nothing else was changed"
    assert failed == f"localhost: {said}; {unchanged}"
    assert boot_config(node) == before and trial_left(node) == [] and NEW_ARG not in running(node)
    assert not (node.state / "cmdline-changed").exists()

    assert apply(node, stand_in_reboot, "trial") is None
    assert NEW_ARG in running(node).split(), "the trial booted the new line"
    config = boot_config(node)
    assert all(NEW_ARG in text for text in config.values()), f"then made the default: {config}"
    assert trial_left(node) == [] and (node.state / "cmdline-changed").exists()


COMMIT_FAULT_SEES = (
    "the new boot configuration was refused (non-zero return code cat: write error: No space left on device); the "
    "previous files were restored from …/kernel-cmdline/backups/… but regenerating failed too, so the boot "
    "configuration on disk is the one from before this run; the node runs the new line from its trial boot until it "
    "reboots, and its default boot entry stays the old line"
)
FAULT_ROWS = [
    Row(
        "/boot full when a trial boot's line is made the default (`update-grub` after the trial)",
        "kernel",
        f"`{COMMIT_FAULT_SEES}`",
        "/etc/default/grub and /boot/grub/grub.cfg as before, the trial entry removed, no marker; the node runs the "
        "new line until its next boot",
        "yes: with room made, the next run writes the default without another reboot",
        "tests/unit/plugins/modules/test_kernel_cmdline_trial.py::test_a_full_boot_when_the_trial_is_committed[grub]",
        True,
        True,
    ),
    Row(
        "firmware drops the trial's one-shot at the reset (`LoaderEntryOneShot` read back as armed, gone after the "
        "reboot)",
        "kernel",
        "`<host>: the trial boot never ran, so the new line was not tried: the firmware did not keep systemd-boot's "
        "one-shot through the reboot: …`",
        "the default boot configuration and the running line as before, the trial entry removed, the loss recorded "
        "in `kernel-cmdline/oneshot-lost.json`",
        "yes: the next run boots no trial there (`auto` warns, makes the line the default and reboots, monitored)",
        "tests/unit/plugins/modules/test_kernel_cmdline_trial.py::"
        "test_a_one_shot_lost_at_the_reset_is_told_from_a_trial_that_hung_by_the_entrys_boot_counter"
        "[never-booted-systemd-boot]",
        True,
        True,
    ),
]


@pytest.mark.parametrize("node", ["grub"], indirect=True)
def test_a_full_boot_when_the_trial_is_committed(node, stand_in_reboot):
    node.sh("umount /boot && mount -t tmpfs -o size=256k,mode=0755 tmpfs /boot && " + GRUB_SETUP.split("\n", 2)[2])
    before = boot_config(node)
    failed = apply(node, stand_in_reboot, "trial-then-full-boot")
    assert failed and pattern(COMMIT_FAULT_SEES).fullmatch(failed), failed
    assert boot_config(node) == before and trial_left(node) == [] and NEW_ARG in running(node).split()
    assert not (node.state / "cmdline-changed").exists()
    node.sh("rm /boot/filler")
    assert apply(node, stand_in_reboot, "hang") is None, "no reboot is due: the node runs the line"
    assert NEW_ARG in boot_config(node)["/boot/grub/grub.cfg"] and (node.state / "cmdline-changed").exists()
