"""The pure kernel command line merge used by the kernel_cmdline module."""

from __future__ import annotations

import shlex
import subprocess

import pytest
import yaml

from provision.paths import module_util
from tests.loaders import REPO

ROLE = REPO / "roles" / "kernel_cmdline"
kc = module_util("kernel_cmdline")


def role_lists(**inventory) -> tuple[list[str], list[str]]:
    """The add and remove lists the role works with (vars/main.yml over defaults/main.yml and the inventory)."""
    from ansible.parsing.dataloader import DataLoader
    from ansible.template import Templar, trust_as_template

    def trusted(value):
        if isinstance(value, str):
            return trust_as_template(value)
        if isinstance(value, list):
            return [trusted(v) for v in value]
        return value

    layers = [yaml.safe_load((ROLE / f).read_text()) for f in ("defaults/main.yml", "vars/main.yml")]
    variables = {k: trusted(v) for layer in [*layers, inventory] for k, v in layer.items()}
    templar = Templar(loader=DataLoader(), variables=variables)
    return tuple(
        templar.template(trust_as_template("{{ " + name + " }}"))
        for name in ("_kernel_cmdline_add", "_kernel_cmdline_remove")
    )


SNP_ADD, SNP_REMOVE = role_lists()


def merged(line, add=SNP_ADD, remove=SNP_REMOVE):
    return kc.merge(line, add, remove)


def test_appends_wanted_arguments_keeping_existing_ones_in_order():
    r = merged("quiet splash")
    assert r["line"] == "quiet splash kvm_amd.sev=1 kvm_amd.sev_es=1 kvm_amd.sev_snp=1 iommu=nopt"
    assert r["changed"] and r["added"] == SNP_ADD


def test_the_default_profile_leaves_host_sme_off_and_removes_the_mem_encrypt_an_earlier_profile_added():
    assert "mem_encrypt=on" not in SNP_ADD
    r = merged("quiet mem_encrypt=on kvm_amd.sev=1 kvm_amd.sev_es=1 kvm_amd.sev_snp=1 iommu=nopt")
    assert r["line"] == "quiet kvm_amd.sev=1 kvm_amd.sev_es=1 kvm_amd.sev_snp=1 iommu=nopt"
    assert r["removed"] == ["mem_encrypt=on"]
    assert kc.missing("quiet mem_encrypt=on " + " ".join(SNP_ADD), SNP_ADD, SNP_REMOVE)["still_present"] == [
        "mem_encrypt=on"
    ], "the running kernel still has it: the node reboots"


def test_mem_encrypt_is_opt_in():
    add, remove = role_lists(kernel_cmdline_snp_mem_encrypt=True)
    assert add[-1] == "mem_encrypt=on" and "mem_encrypt=on" not in remove
    assert kc.merge("quiet mem_encrypt=on", add, remove)["line"].split().count("mem_encrypt=on") == 1


def test_without_the_profile_nothing_about_mem_encrypt_is_touched():
    add, remove = role_lists(kernel_cmdline_snp_profile=False)
    assert add == [] and remove == []
    assert not kc.merge("quiet mem_encrypt=on", add, remove)["changed"]


def test_conflicting_value_is_replaced_in_place():
    r = merged("quiet kvm_amd.sev=0 splash")
    assert r["line"].split()[:3] == ["quiet", "kvm_amd.sev=1", "splash"]
    assert r["replaced"] == ["kvm_amd.sev=0 -> kvm_amd.sev=1"]


def test_duplicate_keys_collapse_to_the_wanted_value():
    r = merged("kvm_amd.sev=0 quiet kvm_amd.sev=0")
    assert r["line"].split().count("kvm_amd.sev=1") == 1
    assert "kvm_amd.sev=0" not in r["line"]


def test_passthrough_iommu_is_removed_in_snp_profile():
    r = merged("quiet iommu=pt iommu.passthrough=1 amd_iommu=off")
    assert "iommu=pt" not in r["line"].split() and "iommu.passthrough=1" not in r["line"]
    assert set(r["removed"]) == {"iommu=pt", "iommu.passthrough=1", "amd_iommu=off"}
    assert "iommu=nopt" in r["line"].split()


def test_quoted_values_stay_intact():
    line = 'quiet dyndbg="file drivers/iommu/* +p" acpi_osi="Windows 2020"'
    r = merged(line)
    assert r["line"].startswith(line + " ")
    assert kc.split(r["line"])[1] == 'dyndbg="file drivers/iommu/* +p"'


def test_remove_by_key_removes_every_value():
    r = kc.merge("a=1 b a=2 c", [], ["a"])
    assert r["line"] == "b c" and r["removed"] == ["a=1", "a=2"]


def test_remove_exact_value_keeps_other_values():
    assert kc.merge("iommu=pt iommu=soft", [], ["iommu=pt"])["line"] == "iommu=soft"


def test_repeatable_keys_are_appended_not_replaced():
    r = kc.merge("console=tty0", ["console=ttyS0,115200n8"], [])
    assert r["line"] == "console=tty0 console=ttyS0,115200n8"


def test_amd_iommu_on_is_kept_with_a_warning():
    r = kc.merge("quiet", ["amd_iommu=on"], [])
    assert r["line"] == "quiet amd_iommu=on"
    assert len(r["warnings"]) == 1 and "Unknown option" in r["warnings"][0]


@pytest.mark.parametrize(
    "line",
    [
        "",
        "quiet",
        "root=UUID=1 ro quiet iommu=pt kvm_amd.sev=0",
        'x="a b" kvm_amd.sev_snp=0 iommu.passthrough=1 console=ttyS0',
        "BOOT_IMAGE=/vmlinuz root=/dev/sda1 amd_iommu=on iommu=nopt mem_encrypt=on",
    ],
)
def test_merge_is_idempotent(line):
    once = merged(line)
    twice = merged(once["line"])
    assert twice["line"] == once["line"] and not twice["changed"]


def test_unchanged_line_reports_no_change():
    line = "quiet " + " ".join(SNP_ADD)
    assert not merged(line)["changed"]


def test_missing_reports_what_the_running_kernel_lacks():
    gap = kc.missing("BOOT_IMAGE=x quiet iommu=pt kvm_amd.sev=1", SNP_ADD, SNP_REMOVE)
    assert gap["absent"] == ["kvm_amd.sev_es=1", "kvm_amd.sev_snp=1", "iommu=nopt"]
    assert gap["still_present"] == ["iommu=pt"] and not gap["ok"]
    assert kc.missing(" ".join(SNP_ADD), SNP_ADD, SNP_REMOVE)["ok"]


def test_running_kernel_comparison_ignores_grubs_requoting():
    # GRUB writes dyndbg="a b" into grub.cfg; the kernel then shows "dyndbg=a b" in /proc/cmdline
    assert kc.missing('ro "dyndbg=module iommu +p" quiet', ['dyndbg="module iommu +p"'], [])["ok"]
    assert kc.canonical('"dyndbg=a b"') == kc.canonical('dyndbg="a b"') == "dyndbg=a b"


# ----------------------------------------------------------------- arguments with quoted whitespace
DYNDBG = ["dyndbg=module iommu +p", 'dyndbg="module iommu +p"', '"dyndbg=module iommu +p"']


def grub_passes(configured: str) -> str:
    """/proc/cmdline after a boot through GRUB 2.06: grub.cfg carries the configured line as written, GRUB's
    parser takes the quotes off each word, and its loader puts double quotes around a whole argument that has a
    space (grub-core/lib/cmdline.c)."""
    words = shlex.split(configured)
    return "BOOT_IMAGE=/vmlinuz root=UUID=1 ro " + " ".join(f'"{w}"' if " " in w else w for w in words)


@pytest.mark.parametrize("wanted", DYNDBG, ids=["unquoted", "value-quoted", "whole-quoted"])
def test_an_argument_with_whitespace_converges_in_one_reboot(wanted):
    """However the inventory writes it, the argument is written as one (its value quoted), the next merge changes
    nothing, and the running kernel has it after one boot, whichever way GRUB quoted it: no second reboot."""
    first = kc.merge("quiet", [wanted], [])
    assert first["changed"] and kc.split(first["line"]) == ["quiet", 'dyndbg="module iommu +p"']
    again = kc.merge(first["line"], [wanted], [])
    assert not again["changed"] and again["line"] == first["line"]
    assert not kc.missing("ro quiet", [wanted], [])["ok"], "before the reboot it is due"
    for running in (grub_passes(first["line"]), "ro " + first["line"]):  # GRUB 2.06; the line as written
        assert kc.missing(running, [wanted], [])["ok"], running


def test_a_quoted_argument_replaces_its_key_in_place_and_is_removed_by_key():
    r = kc.merge('quiet "dyndbg=file x.c +p" splash', ["dyndbg=module iommu +p"], [])
    assert r["line"] == 'quiet dyndbg="module iommu +p" splash' and r["replaced"]
    r = kc.merge('quiet "dyndbg=file x.c +p" acpi_osi="Windows 2020"', [], ["dyndbg", "acpi_osi=Windows 2020"])
    assert r["line"] == "quiet" and len(r["removed"]) == 2
    assert kc.missing('quiet "dyndbg=a b"', [], ["dyndbg"])["still_present"] == ["dyndbg=a b"]


# ----------------------------------------------------------------- editing a GRUB default file
def sourced(text: str, *names: str) -> list[str]:
    """What update-grub sees: the file sourced by /bin/sh, each variable printed."""
    script = text + "\n" + "".join(f'printf "%s\\n" "${name}"\n' for name in names)
    return subprocess.run(["/bin/sh", "-c", script], capture_output=True, text=True, check=True).stdout.splitlines()


def edited(text: str, value: str, var: str = "GRUB_CMDLINE_LINUX_DEFAULT") -> str:
    where = kc.assignments(text, var)[-1]
    assert kc.literal_value(kc.assigned_word(text, where)) is not None
    return kc.set_assignment(text, where, value)


@pytest.mark.parametrize(
    "line",
    [
        'GRUB_TIMEOUT=5; GRUB_CMDLINE_LINUX_DEFAULT="quiet"',
        "GRUB_CMDLINE_LINUX_DEFAULT=quiet;GRUB_TIMEOUT=5",
        "GRUB_CMDLINE_LINUX_DEFAULT='quiet' GRUB_TIMEOUT=5  # set by the installer",
        'export GRUB_CMDLINE_LINUX_DEFAULT="quiet" && GRUB_TIMEOUT=5',
        'GRUB_TIMEOUT=5 GRUB_CMDLINE_LINUX_DEFAULT=qu"i"et # "GRUB_CMDLINE_LINUX_DEFAULT=commented"',
        'GRUB_TIMEOUT=5; if true; then GRUB_CMDLINE_LINUX_DEFAULT="quiet"; fi',
        "GRUB_TIMEOUT=5; { GRUB_CMDLINE_LINUX_DEFAULT=quiet; }",
    ],
)
def test_the_grub_edit_keeps_everything_else_on_the_line(line):
    text = f'# comment GRUB_CMDLINE_LINUX_DEFAULT="not this"\nGRUB_DEFAULT=0\n{line}\nGRUB_CMDLINE_LINUX=""\n'
    assert sourced(text, "GRUB_TIMEOUT", "GRUB_CMDLINE_LINUX_DEFAULT") == ["5", "quiet"]
    new = edited(text, 'quiet iommu=nopt dyndbg="module iommu +p"')
    assert sourced(new, "GRUB_TIMEOUT", "GRUB_CMDLINE_LINUX_DEFAULT", "GRUB_DEFAULT") == [
        "5",
        'quiet iommu=nopt dyndbg="module iommu +p"',
        "0",
    ]
    assert new.split("\n")[0] == text.split("\n")[0] and ("#" in line) == ("#" in new.split("\n")[2])


def test_assignments_are_only_statements_not_comments_strings_or_continued_values():
    text = "\n".join(
        [
            '# GRUB_CMDLINE_LINUX_DEFAULT="commented"',
            'echo "GRUB_CMDLINE_LINUX_DEFAULT=in a string"',
            'X=1 GRUB_CMDLINE_LINUX_DEFAULT="$GRUB_CMDLINE_LINUX_DEFAULT more"',
            'GRUB_CMDLINE_LINUX_DEFAULT="goes on',
            'to the next line"',
        ]
    )
    found = kc.assignments(text, "GRUB_CMDLINE_LINUX_DEFAULT")
    assert [w[0] for w in found] == [2, 3]
    assert kc.literal_value(kc.assigned_word(text, found[0])) is None, "expands a variable: not a plain literal"
    assert kc.assigned_word(text, found[1]) is None, "continues on the next line: not edited in place"


def test_the_module_refuses_a_control_character_before_reading_anything(tmp_path):
    """A newline in an argument would be a new statement in /etc/default/grub: refused, whatever calls the module."""
    from tests.unit.plugins.modules.test_provision_state import PLUGINS, call

    out = call(
        tmp_path,
        PLUGINS / "modules" / "kernel_cmdline.py",
        action="configure",
        bootloader="grub",
        add=["iommu=nopt", "quiet\nGRUB_TIMEOUT=0"],
        remove=[],
        backup_dir=str(tmp_path),
    )
    assert out["failed"] and out["msg"] == "add[1] holds a control character (newline, tab, ...): nothing was changed"
