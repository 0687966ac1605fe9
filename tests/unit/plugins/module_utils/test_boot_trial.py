"""The trial boot's pure rules (plugins/module_utils/boot_trial.py): the GRUB and systemd-boot entries it writes, where
a trial is possible, and what a run does with kernel_cmdline_trial_boot auto, required or off.

The GRUB fixture is the lab image's own /boot/grub/grub.cfg, written by Debian 12's update-grub (grub2 2.06-13).
"""

from __future__ import annotations

import shlex

import pytest

from provision.paths import module_util
from tests.unit import FIXTURES, collection

kc = module_util("kernel_cmdline")
DEBIAN12_GRUB_CFG = (FIXTURES / "boot" / "debian12-grub.cfg").read_text()
ROOT_ARGS = "root=UUID=6b3d2f9e-1a2b-4c3d-8e4f-5a6b7c8d9e0f ro console=ttyS0,115200n8 quiet"


@pytest.fixture(scope="module")
def trial():
    import importlib

    return importlib.import_module(f"{collection.PACKAGE}.module_utils.boot_trial")


def linux_line(entry: str) -> str:
    return next(ln for ln in entry.split("\n") if ln.strip().startswith("linux"))


def grub_words(line: str) -> list[str]:
    """The words GRUB's script parser makes of a linux line's arguments (quotes taken off, as sh does)."""
    return shlex.split(line)


# ----------------------------------------------------------------- GRUB
def test_the_trial_entry_copies_the_first_debian_12_menu_entry_with_our_id_and_the_merged_line(trial):
    entry, line = trial.grub_trial_entry(DEBIAN12_GRUB_CFG, ["kvm_amd.sev=1", "iommu=nopt"], ["quiet"])
    lines = entry.rstrip("\n").split("\n")
    assert lines[0] == f"menuentry '{trial.TRIAL_TITLE}' --id provision-trial {{" and lines[-1] == "}"
    assert line == "root=UUID=6b3d2f9e-1a2b-4c3d-8e4f-5a6b7c8d9e0f ro console=ttyS0,115200n8 kvm_amd.sev=1 iommu=nopt"
    assert linux_line(entry) == f"\tlinux\t/boot/vmlinuz-6.1.0-57-amd64 {line}"
    # every other line of the default entry as grub.cfg has it; nothing of the submenu (recovery: `single`)
    first = DEBIAN12_GRUB_CFG.split("menuentry 'Debian GNU/Linux' ", 1)[1].split("\n}\n", 1)[0].split("\n")[1:]
    assert [ln for ln in lines[1:-1] if "linux\t" not in ln] == [ln for ln in first if "linux\t" not in ln]
    assert "single" not in entry and "submenu" not in entry and entry.count("menuentry") == 1


def test_the_trial_entry_keeps_grubs_quoting_and_writes_an_added_argument_with_whitespace_once(trial):
    cfg = DEBIAN12_GRUB_CFG.replace(ROOT_ARGS, ROOT_ARGS + " dyndbg=\"file x.c +p\" acpi_osi='Windows 2020'")
    _, line = trial.grub_trial_entry(cfg, ["pcie_aspm=off", "dyndbg=module iommu +p"], [])
    assert line.endswith(" acpi_osi='Windows 2020' pcie_aspm=off"), line
    assert 'dyndbg="module iommu +p"' in line and "file x.c" not in line, "the key replaced in place"
    words = grub_words(line)
    assert "acpi_osi=Windows 2020" in words and "dyndbg=module iommu +p" in words, words
    # the kernel then has every wanted argument: the node is not rebooted again
    assert kc.missing(" ".join(f'"{w}"' if " " in w else w for w in words), ["pcie_aspm=off"], [])["ok"]


def test_the_grub_cfg_must_source_custom_cfg_and_take_a_one_shot_next_entry(trial):
    assert trial.grub_cfg_problem(DEBIAN12_GRUB_CFG) is None
    no_custom = DEBIAN12_GRUB_CFG.split("### BEGIN /etc/grub.d/41_custom ###")[0]
    assert "does not source custom.cfg" in trial.grub_cfg_problem(no_custom)
    no_once = DEBIAN12_GRUB_CFG.replace("save_env next_entry", "")
    assert "next_entry" in trial.grub_cfg_problem(no_once)


@pytest.mark.parametrize("value", ["", "0", " 0 "])
def test_grub_default_0_or_unset_boots_the_first_entry(trial, value):
    assert trial.grub_default_problem(value) is None


@pytest.mark.parametrize("value", ["saved", "1", "gnulinux-advanced-x>gnulinux-6.8.12-4-pve-advanced-x"])
def test_any_other_grub_default_rules_the_trial_out(trial, value):
    assert trial.grub_default_problem(value).startswith(f"GRUB_DEFAULT is {value!r}")


@pytest.mark.parametrize(
    ("abstraction", "fs", "names"),
    [
        ("lvm", "ext2", "lvm"),
        ("diskfilter lvm", "ext2", "diskfilter lvm"),
        ("diskfilter mdraid1x", "ext2", "diskfilter mdraid1x"),
        ("cryptodisk luks2", "ext2", "cryptodisk luks2"),
        ("", "btrfs", "btrfs"),
        ("", "zfs\n", "zfs"),
    ],
)
def test_grub_probe_answers_where_grub_cannot_clear_next_entry(trial, abstraction, fs, names):
    problem = trial.grub_env_problem(abstraction, fs)
    assert problem and f"/boot/grub is on {names}" in problem and "grubenv" in problem


@pytest.mark.parametrize("fs", ["ext2\n", "xfs", "vfat"])
def test_a_plain_file_system_can_take_a_one_shot(trial, fs):
    assert trial.grub_env_problem("\n", fs) is None


def test_custom_cfg_keeps_the_users_entries_around_our_block(trial):
    user = "menuentry 'memtest' {\n\tlinux16 /boot/memtest86+.bin\n}\n"
    entry, _ = trial.grub_trial_entry(DEBIAN12_GRUB_CFG, ["a=1"], [])
    with_ours = trial.custom_cfg_with(user, entry)
    assert with_ours.startswith(user) and with_ours.count(trial.BLOCK_BEGIN) == 1 and entry in with_ours
    again = trial.custom_cfg_with(with_ours, entry.replace("a=1", "a=2"))
    assert again.count(trial.BLOCK_BEGIN) == 1 and "a=2" in again and "a=1" not in again, "one block, replaced"
    assert trial.custom_cfg_without(again) == user
    assert trial.custom_cfg_with(None, entry).startswith(trial.BLOCK_BEGIN)
    assert trial.custom_cfg_without(trial.custom_cfg_with(None, entry)) is None, "ours alone: the file goes"
    assert trial.custom_cfg_without("no newline at the end") == "no newline at the end"


def test_grubenv_next_entry(trial):
    listing = "saved_entry=0\nnext_entry=provision-trial\n"
    assert trial.grubenv_next_entry(listing) == "provision-trial"
    assert trial.grubenv_next_entry("saved_entry=0\n") is None
    assert trial.grubenv_next_entry("next_entry=\n") == "", "what GRUB's save_env leaves once it took the one-shot"


# ----------------------------------------------------------------- systemd-boot
ENTRIES = [
    "proxmox-6.8.12-4-pve.conf",
    "proxmox-6.8.12-10-pve.conf",
    "proxmox-6.5.13-6-pve.conf",
    "provision-trial.conf",
    "other-1.conf",
]


@pytest.mark.parametrize(
    ("default", "chosen"),
    [
        ("proxmox-*", "proxmox-6.8.12-10-pve.conf"),  # proxmox-boot-tool's loader.conf: the newest by version
        (None, "proxmox-6.8.12-10-pve.conf"),
        ("proxmox-6.5.13-6-pve.conf", "proxmox-6.5.13-6-pve.conf"),  # `proxmox-boot-tool kernel pin`
        ("Proxmox-6.5.13-6-PVE.conf", "proxmox-6.5.13-6-pve.conf"),
        ("proxmox-6.8.12-4-pve", "proxmox-6.8.12-4-pve.conf"),
        ("nothing-*", None),
    ],
)
def test_the_systemd_boot_entry_copied_is_the_one_booted_by_default(trial, default, chosen):
    assert trial.sdboot_default_entry(ENTRIES, default) == chosen


def test_loader_conf_default(trial):
    assert trial.loader_default("timeout 3\ndefault proxmox-*\n") == "proxmox-*"
    assert trial.loader_default("timeout 3\n") is None and trial.loader_default(None) is None


def test_the_systemd_boot_trial_entry_has_our_title_and_the_new_options_and_keeps_the_rest(trial):
    entry = (
        "title    Proxmox Virtual Environment\nversion  6.8.12-4-pve\n"
        "options  root=ZFS=rpool/ROOT/pve-1 boot=zfs\noptions  quiet\n"
        "linux    /EFI/proxmox/6.8.12-4-pve/vmlinuz-6.8.12-4-pve\n"
        "initrd   /EFI/proxmox/6.8.12-4-pve/initrd.img-6.8.12-4-pve\n"
    )
    out = trial.sdboot_trial_entry(entry, 'root=ZFS=rpool/ROOT/pve-1 boot=zfs quiet iommu=nopt acpi_osi="Windows 2020"')
    assert out.split("\n") == [
        f"title    {trial.TRIAL_TITLE}",
        "version  6.8.12-4-pve",
        'options  root=ZFS=rpool/ROOT/pve-1 boot=zfs quiet iommu=nopt acpi_osi="Windows 2020"',
        "linux    /EFI/proxmox/6.8.12-4-pve/vmlinuz-6.8.12-4-pve",
        "initrd   /EFI/proxmox/6.8.12-4-pve/initrd.img-6.8.12-4-pve",
        "",
    ]


def test_an_efi_string_variable_as_efivarfs_gives_it(trial):
    raw = (6).to_bytes(4, "little") + "provision-trial.conf".encode("utf-16-le") + b"\0\0"
    assert trial.efi_string(raw) == "provision-trial.conf"


# ----------------------------------------------------------------- the decision
@pytest.mark.parametrize(
    ("trial_boot", "wanted", "problem", "mode"),
    [
        ("auto", True, None, "trial"),
        ("required", True, None, "trial"),
        ("auto", True, "/boot/grub is on lvm", "warn"),
        ("required", True, "/boot/grub is on lvm", "refuse"),
        ("off", True, None, "none"),
        ("off", True, "/boot/grub is on lvm", "none"),
        ("auto", False, None, "none"),
        ("required", False, "/boot/grub is on lvm", "none"),  # nothing to change, or no reboot: nothing to refuse
    ],
)
def test_auto_required_and_off(trial, trial_boot, wanted, problem, mode):
    assert trial.decision(trial_boot, wanted, problem) == mode


def test_an_unknown_mode_is_an_error(trial):
    with pytest.raises(ValueError, match="trial_boot must be one of auto, required, off"):
        trial.decision("yes", True, None)
