"""The pure kernel command line merge used by the kernel_cmdline module."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from provision.paths import module_util

ROLE = Path(__file__).resolve().parents[2] / "roles" / "kernel_cmdline"
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
