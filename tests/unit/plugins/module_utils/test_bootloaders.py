"""plugins/module_utils/bootloaders.py: each bootloader class plans, writes, reads its one-shot and names its
regeneration, against files in a temporary directory (the paths the classes read, pointed there)."""

from __future__ import annotations

import json
import subprocess

import pytest

from tests.unit import collection

bootloaders = collection.module_util("bootloaders")
GUID = "4a67b082-0a4c-41cf-b6c7-440b29bb8c4f"


class _Module:
    """What the classes ask of AnsibleModule: run a command, find a tool, fail; its parameters."""

    def __init__(self, params=None, tools=()):
        self.params = params or {}
        self.tools = tools

    def run_command(self, argv):
        proc = subprocess.run(argv, capture_output=True, text=True)
        return proc.returncode, proc.stdout, proc.stderr

    def get_bin_path(self, name):
        return f"/usr/bin/{name}" if name in self.tools else None

    def fail_json(self, **kwargs):
        raise AssertionError(kwargs["msg"])


@pytest.fixture
def grub(tmp_path, monkeypatch):
    main = tmp_path / "grub"
    monkeypatch.setattr(bootloaders, "GRUB_MAIN", str(main))
    monkeypatch.setattr(bootloaders, "GRUB_SNIPPETS", str(tmp_path / "grub.d"))
    monkeypatch.setattr(bootloaders, "GRUB_OVERRIDE", str(tmp_path / "grub.d" / "zz-provision.cfg"))
    return main


def test_the_grub_plan_edits_the_value_word_of_both_variables_on_one_line(grub):
    grub.write_text('GRUB_TIMEOUT=5\nGRUB_CMDLINE_LINUX_DEFAULT="quiet iommu=pt" GRUB_CMDLINE_LINUX="iommu=pt" # ok\n')
    changes, before, _, _ = bootloaders.for_node(_Module(), "grub").plan(["iommu=nopt"], ["iommu=pt"])
    assert before == "quiet iommu=pt" and list(changes) == [str(grub)]
    assert changes[str(grub)] == (
        'GRUB_TIMEOUT=5\nGRUB_CMDLINE_LINUX_DEFAULT="quiet iommu=nopt" GRUB_CMDLINE_LINUX="" # ok\n'
    )


def test_a_grub_value_that_is_no_plain_literal_goes_to_provisions_own_snippet_and_write_makes_it(grub, tmp_path):
    (tmp_path / "grub.d").mkdir()
    grub.write_text('GRUB_CMDLINE_LINUX_DEFAULT="quiet $EXTRA"\n')
    loader = bootloaders.for_node(_Module(), "grub")
    changes, _, result, notes = loader.plan(["iommu=nopt"], [])
    override = str(tmp_path / "grub.d" / "zz-provision.cfg")
    assert list(changes) == [override] and "is not a plain literal" in notes[0]
    loader.write(changes)
    assert loader.configured_line() == result["line"] == "quiet iommu=nopt"
    assert loader.plan(["iommu=nopt"], [])[0] == {}, "a second plan changes nothing"


def test_systemd_boot_plans_the_first_line_of_etc_kernel_cmdline_and_refuses_one_without_root(tmp_path, monkeypatch):
    cmdline = tmp_path / "cmdline"
    monkeypatch.setattr(bootloaders, "KERNEL_CMDLINE", str(cmdline))
    cmdline.write_text("root=ZFS=rpool/ROOT/pve-1 boot=zfs iommu=pt\n# a comment line stays\n")
    loader = bootloaders.for_node(_Module(), "systemd-boot")
    changes, before, _, _ = loader.plan(["iommu=nopt"], ["iommu=pt"])
    assert before == "root=ZFS=rpool/ROOT/pve-1 boot=zfs iommu=pt"
    assert changes == {str(cmdline): "root=ZFS=rpool/ROOT/pve-1 boot=zfs iommu=nopt\n# a comment line stays\n"}
    cmdline.write_text("boot=zfs\n")
    with pytest.raises(AssertionError, match="the first line has no root= argument"):
        loader.plan([], [])


def test_each_bootloader_names_its_regeneration_and_what_it_writes():
    grub, sdboot = (bootloaders.for_node(_Module(), name) for name in bootloaders.NAMES)
    assert (grub.regenerate, grub.generated_from) == (("update-grub",), "/boot/grub/grub.cfg")
    assert sdboot.regenerate == ("proxmox-boot-tool", "refresh")
    assert sdboot.generated_from == "loader/entries/proxmox-*.conf on the ESPs"


def test_the_armed_one_shot_is_read_from_grubenv_or_the_efi_variable(tmp_path, monkeypatch):
    grubenv = tmp_path / "grubenv"
    monkeypatch.setattr(bootloaders, "GRUBENV", str(grubenv))
    editenv = tmp_path / "grub-editenv"
    editenv.write_text('#!/bin/sh\ncat "$1"\n')
    editenv.chmod(0o755)

    class Grub(_Module):
        def run_command(self, argv):
            return super().run_command([str(editenv), *argv[1:]])

    grub = bootloaders.for_node(Grub(tools=("grub-editenv",)), "grub")
    grubenv.write_text("# GRUB Environment Block\nsaved_entry=0\n")
    assert grub.armed() is None
    grubenv.write_text("# GRUB Environment Block\nnext_entry=provision-trial\n")
    assert grub.armed() == f"{grubenv}: next_entry=provision-trial"

    efivars = tmp_path / "efivars"
    efivars.mkdir()
    monkeypatch.setattr(bootloaders, "LOADER_VARS", str(efivars / ("{}-" + GUID)))
    sdboot = bootloaders.for_node(_Module(), "systemd-boot")
    assert sdboot.armed() is None
    value = (7).to_bytes(4, "little") + "provision-trial+1.conf\0".encode("utf-16-le")
    (efivars / f"LoaderEntryOneShot-{GUID}").write_bytes(value)
    assert sdboot.armed() == "EFI variable LoaderEntryOneShot=provision-trial+1.conf"


def test_a_record_of_a_lost_one_shot_rules_the_systemd_boot_trial_out(tmp_path, monkeypatch):
    efivars = tmp_path / "efi" / "efivars"
    efivars.mkdir(parents=True)
    monkeypatch.setattr(bootloaders, "EFI_DIR", str(tmp_path / "efi"))
    monkeypatch.setattr(bootloaders, "LOADER_VARS", str(efivars / ("{}-" + GUID)))
    monkeypatch.setattr(bootloaders, "PBT_UUIDS", str(tmp_path / "uuids"))
    (efivars / f"LoaderInfo-{GUID}").write_bytes(b"\0" * 4)
    (tmp_path / "uuids").write_text("B1C2-D3E4\n")
    loader = bootloaders.for_node(_Module({"backup_dir": str(tmp_path)}, tools=("bootctl",)), "systemd-boot")
    assert loader.trial_problem([], []) is None
    lost = {"reason": "the firmware lost LoaderEntryOneShot", "at": "2026-12-01T10:00:00Z"}
    (tmp_path / "oneshot-lost.json").write_text(json.dumps(lost))
    assert loader.trial_problem([], []) == (
        "the firmware lost LoaderEntryOneShot (trial boot of 2026-12-01T10:00:00Z; remove "
        f"{tmp_path}/oneshot-lost.json once the firmware keeps EFI variables)"
    )


def test_the_next_kernel_is_grubs_default_entry(tmp_path, monkeypatch):
    cfg = tmp_path / "grub.cfg"
    cfg.write_text(
        "menuentry 'Debian GNU/Linux' {\n\tlinux\t/boot/vmlinuz-6.14.8-2-pve root=UUID=6b3d ro quiet\n}\n"
        "menuentry 'older' {\n\tlinux\t/boot/vmlinuz-6.8.12-4-pve root=UUID=6b3d ro quiet\n}\n"
    )
    monkeypatch.setattr(bootloaders, "GRUB_CFG", str(cfg))
    assert bootloaders.for_node(_Module(), "grub").next_release() == "6.14.8-2-pve"


def test_the_next_kernel_on_systemd_boot_is_the_pinned_one(tmp_path, monkeypatch):
    pin = tmp_path / "proxmox-boot-pin"
    pin.write_text("6.8.12-4-pve\n")
    monkeypatch.setattr(bootloaders, "PBT_PIN", str(pin))
    assert bootloaders.for_node(_Module(), "systemd-boot").next_release() == "6.8.12-4-pve"


def extlinux(conf):
    """A toy extlinux bootloader class (one APPEND line in `conf`, read by the loader itself: nothing to regenerate,
    no one-shot), for the tests that drive kernel_cmdline through a third bootloader."""

    class Extlinux(bootloaders.Bootloader):
        name, regenerate, generated_from = "extlinux", (), str(conf)

        def plan(self, add, remove):
            text = conf.read_text()
            line = next(ln.split("APPEND", 1)[1].strip() for ln in text.splitlines() if "APPEND" in ln)
            result = bootloaders.merge(line, add, remove)
            changes = {str(conf): text.replace(line, result["line"])} if result["changed"] else {}
            return changes, line, result, []

        def generated_lines(self):
            return [(self.generated_from, self.plan([], [])[1])]

        def armed(self):
            return None

        def trial_problem(self, add, remove):
            return "extlinux has no one-shot entry"

        def remove_trial(self, dry_run, recorded):
            self.booted = None
            return []

    return Extlinux


def driven(tmp_path, monkeypatch, line="root=/dev/sda1 ro quiet"):
    """kernel_cmdline, and a module and loader on a toy extlinux whose APPEND line is `line`."""
    conf = tmp_path / "extlinux.conf"
    conf.write_text(f"DEFAULT pve\nLABEL pve\n  KERNEL /vmlinuz\n  APPEND {line}\n")
    monkeypatch.setitem(bootloaders.CLASSES, "extlinux", extlinux(conf))
    module = _Module(
        dict(add=[], remove=[], backup_dir=str(tmp_path / "state"), trial_boot="auto", reboot="auto")
        | dict(snp_required=False, findings_file=str(tmp_path / "findings.json"))
    )
    module.check_mode, module._diff = False, False
    return collection.module("kernel_cmdline"), module, bootloaders.for_node(module, "extlinux"), conf


def test_a_third_bootloader_is_one_class_that_kernel_cmdline_drives_without_a_change(tmp_path, monkeypatch):
    """A toy extlinux registered beside the two: kernel_cmdline's configure writes it with a backup, a second
    configure changes nothing, verify_generated finds the new argument in what it boots, and restore puts the file
    back."""
    kernel_cmdline, module, loader, conf = driven(tmp_path, monkeypatch)
    first = kernel_cmdline.configure(module, loader, ["iommu=nopt"], [])
    assert first["changed"] and first["files"] == [str(conf)] and first["trial"]["mode"] in ("warn", "none")
    assert "APPEND root=/dev/sda1 ro quiet iommu=nopt" in conf.read_text()
    assert not kernel_cmdline.configure(module, loader, ["iommu=nopt"], [])["changed"], "a second run changes nothing"
    assert kernel_cmdline.verify_generated(module, loader, ["iommu=nopt"], [])["generated"] == [
        (str(conf), "root=/dev/sda1 ro quiet iommu=nopt")
    ]
    assert kernel_cmdline.restore(module, loader)["restored"] == [str(conf)]
    assert "APPEND root=/dev/sda1 ro quiet\n" in conf.read_text()


def test_wanted_json_keeps_every_argument_a_configure_put_and_none_the_node_had(tmp_path, monkeypatch):
    """`put` in wanted.json, which `provision retire` takes off: what each configure added or set in place of another
    value, over the runs; an argument already on the line is never in it, so a configure that removes `put` leaves
    the node's own arguments."""
    kernel_cmdline, module, loader, conf = driven(
        tmp_path, monkeypatch, "root=/dev/sda1 ro kvm_amd.sev=1 mitigations=off"
    )
    wanted = tmp_path / "state" / "wanted.json"
    kernel_cmdline.configure(module, loader, ["kvm_amd.sev=1", "iommu=nopt", "mitigations=auto"], [])
    assert json.loads(wanted.read_text())["put"] == ["iommu=nopt", "mitigations=auto"]
    kernel_cmdline.configure(module, loader, ["kvm_amd.sev_snp=1"], [])
    assert json.loads(wanted.read_text())["put"] == ["iommu=nopt", "kvm_amd.sev_snp=1", "mitigations=auto"]
    retired = kernel_cmdline.configure(module, loader, [], json.loads(wanted.read_text())["put"])
    assert retired["changed"] and "APPEND root=/dev/sda1 ro kvm_amd.sev=1\n" in conf.read_text()
    assert not kernel_cmdline.configure(module, loader, [], json.loads(wanted.read_text())["put"])["changed"]
