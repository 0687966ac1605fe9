"""SEV-SNP proven from real kernel lines (plugins/module_utils/sev_snp.py) and the module's helpers
around it: the kernel the node boots next, and the marker of a changed boot configuration.

Every dmesg and sysfs line below is copied from AMD's or the kernel's published material, named beside it.
Where a line is rendered from the kernel's printk format rather than copied from a log, that is said too.
"""

from __future__ import annotations

import datetime
import json

import pytest

from provision.paths import module_util
from tests.unit import collection

snp = module_util("sev_snp")

# LKML, Ashish Kalra (AMD), "[PATCH v3 2/2] x86/sev: Add callback to apply RMP table fixups for kexec", 2024-04-26;
# printed by arch/x86/virt/svm/sev.c snp_probe_rmptable_info()
RMP = "[    0.000000] SEV-SNP: RMP table physical range [0x0000007ffe800000 - 0x000000807f0fffff]"
# AMDESE/AMDSEV README.md, FAQ "SEV Firmware Updates" (`dmesg | grep ccp`); drivers/crypto/ccp/sev-dev.c
CCP_SEV = "[   14.560461] ccp 0000:01:00.5: SEV API:1.55 build:24"
CCP_SNP = "[   14.644793] ccp 0000:01:00.5: SEV-SNP API:1.55 build:24"
# LKML, Ashish Kalra (AMD), "[PATCH v2 3/4] x86/sev: Fix broken SNP support with KVM module built-in", 2025-01-31;
# printed by arch/x86/kvm/svm/sev.c sev_hardware_setup()
KVM_SEV = "[   10.151557] kvm_amd: SEV enabled (ASIDs 100 - 509)"
KVM_SEV_ES = "[   10.156905] kvm_amd: SEV-ES enabled (ASIDs 1 - 99)"
KVM_SNP = "[   10.162256] kvm_amd: SEV-SNP enabled (ASIDs 1 - 99)"
# rendered from drivers/iommu/amd/init.c iommu_snp_enable(): pr_fmt "AMD-Vi: " + pr_info("IOMMU SNP support enabled.\n")
# (torvalds/linux 00a7dd6)
AMD_VI = "AMD-Vi: IOMMU SNP support enabled."
# kernel/params.c param_get_bool() prints a bool parameter as "%c\n", 'Y' or 'N'
SYSFS_Y, SYSFS_N = "Y\n", "N\n"
# a PVE 6.14 kernel (SNP host support is upstream since 6.11); the lab's Debian 12 kernel, from its own run records
NEW_KERNEL, LAB_KERNEL, PVE_68 = "6.14.8-2-pve", "6.1.0-57-amd64", "6.8.12-4-pve"

ACTIVE = "\n".join([RMP, KVM_SEV, KVM_SEV_ES, KVM_SNP, CCP_SEV, CCP_SNP, AMD_VI]) + "\n"


def prove(dmesg=ACTIVE, release=NEW_KERNEL, loaded=True, param=SYSFS_Y):
    return snp.proof(dmesg, release, loaded, param)


def without(*lines: str) -> str:
    return "\n".join(line for line in ACTIVE.splitlines() if line not in lines)


def test_snp_active_on_real_lines_is_proven():
    result = prove()
    assert result == {"proven": True, "missing": [], "evidence": result["evidence"]}
    ev = result["evidence"]
    assert ev["firmware"] == "1.55" and ev["kvm_snp_line"] == "SEV-SNP enabled (ASIDs 1 - 99)"
    assert ev["rmp_range"].endswith("[0x0000007ffe800000 - 0x000000807f0fffff]")


def test_a_kernel_older_than_6_11_is_named_as_that_not_as_kvm_amd_not_loaded():
    # kvm_amd is loaded on 6.8 but has no sev_snp parameter before 6.11
    result = prove(release=PVE_68, param=None)
    assert not result["proven"]
    assert result["missing"][0] == "kernel 6.8.12-4-pve is older than 6.11, the first with SEV-SNP host support"
    assert not [r for r in result["missing"] if "kvm_amd" in r]


def test_the_lab_kernel_without_any_snp_line_names_every_gap():
    result = prove(dmesg="[    0.000000] Linux version 6.1.0-57-amd64\n", release=LAB_KERNEL, param=None)
    assert result["missing"] == [
        "kernel 6.1.0-57-amd64 is older than 6.11, the first with SEV-SNP host support",
        "dmesg has no 'kvm_amd: SEV-SNP enabled' line",
        "dmesg has no SEV firmware version ('SEV-SNP API:' line from ccp)",
        "dmesg has no 'SEV-SNP: RMP table physical range' (or 'RMP segment table physical address') line",
        "dmesg has no 'AMD-Vi: IOMMU SNP support enabled'",
    ]


def test_sysfs_parameter_reading_n():
    result = prove(param=SYSFS_N)
    assert result["missing"] == ["/sys/module/kvm_amd/parameters/sev_snp reads N, not Y"]


def test_kvm_amd_not_loaded_on_a_new_kernel():
    result = prove(loaded=False, param=None)
    assert result["missing"] == ["kvm_amd is not loaded (no /sys/module/kvm_amd)"]


@pytest.mark.parametrize(
    ("gone", "reason"),
    [
        ((KVM_SNP,), "dmesg has no 'kvm_amd: SEV-SNP enabled' line"),
        ((CCP_SEV, CCP_SNP), "dmesg has no SEV firmware version ('SEV-SNP API:' line from ccp)"),
        ((RMP,), "dmesg has no 'SEV-SNP: RMP table physical range' (or 'RMP segment table physical address') line"),
        ((AMD_VI,), "dmesg has no 'AMD-Vi: IOMMU SNP support enabled'"),
    ],
    ids=["kvm-snp-line", "firmware-line", "rmp-range", "amd-vi"],
)
def test_each_missing_dmesg_line_is_named(gone, reason):
    assert prove(dmesg=without(*gone))["missing"] == [reason]


def test_firmware_older_than_1_51():
    # AMDESE/AMDSEV README.md (sev-snp-devel branch), "verify that SNP is enabled in the host"
    old = without(CCP_SEV, CCP_SNP) + "\nSEV-SNP API:1.22 build:22\n"
    assert prove(dmesg=old)["missing"] == ["SEV firmware 1.22 is older than 1.51"]


def test_without_snp_the_sev_line_still_gives_the_firmware_version():
    # SNP_INIT failed: ccp prints only "SEV API" (AMDESE/AMDSEV README.md, FAQ "SEV Firmware Updates")
    ev = prove(dmesg=without(CCP_SNP))["evidence"]
    assert ev["firmware"] == "1.55"


def test_snp_disabled_by_a_passthrough_iommu_quotes_the_kernel():
    # rendered from drivers/iommu/amd/init.c iommu_snp_enable() (AMDESE/linux-kvm 11ecc47; LKML SNP host patches):
    # pr_fmt "AMD-Vi: " + "SNP: IOMMU disabled or configured in passthrough mode, SNP cannot be supported.\n";
    # kvm_amd then prints "SEV-SNP %s (ASIDs %u - %u)" with "disabled" (arch/x86/kvm/svm/sev.c)
    refused = "AMD-Vi: SNP: IOMMU disabled or configured in passthrough mode, SNP cannot be supported."
    log = without(AMD_VI, KVM_SNP) + "\n" + refused + "\nkvm_amd: SEV-SNP disabled (ASIDs 1 - 99)\n"
    result = prove(dmesg=log, param=SYSFS_N)
    assert result["missing"] == [
        "/sys/module/kvm_amd/parameters/sev_snp reads N, not Y",
        "dmesg says 'SEV-SNP disabled (ASIDs 1 - 99)'",
        "AMD-Vi refused SNP: 'SNP: IOMMU disabled or configured in passthrough mode, SNP cannot be supported.'",
    ]


def test_rmp_table_not_reserved_by_the_bios():
    # arch/x86/virt/svm/sev.c snp_probe_rmptable_info(): pr_fmt "SEV-SNP: " + the pr_err text
    log = without(RMP) + "\nSEV-SNP: Memory for the RMP table has not been reserved by BIOS\n"
    assert prove(dmesg=log)["missing"] == ["the BIOS did not reserve the RMP table (enable SNP memory coverage)"]


# rendered from arch/x86/virt/svm/sev.c (Linux 6.14) printk formats on a segmented RMP (EPYC 9005):
# probe_segmented_rmptable_info() "RMP segment table physical address [0x%016llx - 0x%016llx]" and
# segmented_rmptable_setup() "RMP segment %u physical address [%#llx - %#llx] covering [%#llx - %#llx]", with
# pr_fmt "SEV-SNP: "
RMP_SEGMENTED = [
    "[    0.000000] SEV-SNP: RMP segment table physical address [0x0000000088c00000 - 0x0000000088d04000]",
    "[    1.262187] SEV-SNP: RMP segment 0 physical address [0x88d04000 - 0x98d03fff] covering [0x0 - 0xfffffffff]",
    "[    1.262190] SEV-SNP: RMP segment 1 physical address [0x99000000 - 0xa8ffffff] covering "
    "[0x1000000000 - 0x1fffffffff]",
]


def test_a_segmented_rmp_proves_snp():
    result = prove(dmesg=without(RMP) + "\n" + "\n".join(RMP_SEGMENTED) + "\n")
    assert result["proven"], result["missing"]
    assert result["evidence"]["rmp_range"].endswith("[0x0000000088c00000 - 0x0000000088d04000]")


def test_a_segmented_rmp_that_does_not_cover_ram_is_named():
    # segmented_rmptable_setup(): pr_err "Segmented RMP does not cover full system RAM (expected 0x%llx got 0x%llx)"
    log = without(RMP) + "\n" + RMP_SEGMENTED[0] + "\n"
    log += "SEV-SNP: Segmented RMP does not cover full system RAM (expected 0x2000000000 got 0x1000000000)\n"
    assert prove(dmesg=log)["missing"] == [
        "dmesg says 'SEV-SNP: Segmented RMP does not cover full system RAM (expected 0x2000000000 got 0x1000000000)' "
        "(the BIOS's SNP memory coverage)"
    ]


@pytest.mark.parametrize("arg", ["sev=nosnp", "sev=debug,nosnp", 'sev="nosnp"'])
def test_sev_nosnp_on_the_line_is_named_not_the_cpu_or_bios(arg):
    # arch/x86/virt/svm/cmdline.c: sev= takes comma-separated options; nosnp clears X86_FEATURE_SEV_SNP on the host
    line = f"BOOT_IMAGE=/boot/vmlinuz-{NEW_KERNEL} root=/dev/mapper/pve-root ro {arg} iommu=nopt"
    result = snp.proof(without(KVM_SNP, AMD_VI), NEW_KERNEL, True, SYSFS_N, line)
    assert result["missing"][0] == (
        "this boot's kernel line has sev=nosnp, which turns SEV-SNP off on the host (the SNP profile removes it; take "
        "it out of kernel_cmdline_extra_args)"
    )
    # before a reboot: this boot's flag is gone because of the argument, not the BIOS; the next line decides
    assert snp.before_reboot(CPUINFO_NO_SNP, NEW_KERNEL, line, line.replace(arg, "")) == []
    assert snp.before_reboot(CPUINFO_SNP, NEW_KERNEL, "", line) == [
        "the line the node boots next has sev=nosnp, which turns SEV-SNP off on the host (the SNP profile removes "
        "it; take it out of kernel_cmdline_extra_args)"
    ]
    assert not snp.nosnp("sev=debug kvm_amd.sev_snp=1")


def test_unreadable_dmesg_is_not_proof():
    result = prove(dmesg=None)
    assert not result["proven"] and result["missing"][0].startswith("dmesg could not be read")


# flag names as arch/x86/include/asm/cpufeatures.h prints them ("sme", "sev", "sev_es", "sev_snp")
CPUINFO_SNP = "processor\t: 0\nvendor_id\t: AuthenticAMD\nflags\t\t: fpu vme de pse tsc msr sme sev sev_es sev_snp\n"
CPUINFO_NO_SNP = "processor\t: 0\nvendor_id\t: AuthenticAMD\nflags\t\t: fpu vme de pse tsc msr sme sev sev_es\n"


def test_before_reboot_a_capable_node_passes():
    assert snp.before_reboot(CPUINFO_SNP, NEW_KERNEL) == []


def test_before_reboot_names_the_cpu_flag_and_the_kernel_to_boot():
    reasons = snp.before_reboot(CPUINFO_NO_SNP, PVE_68)
    assert reasons[0].startswith("the CPU flag sev_snp is missing from /proc/cpuinfo")
    assert reasons[1] == (
        "kernel 6.8.12-4-pve is older than 6.11, the first with SEV-SNP host support (the kernel the node boots next)"
    )


def test_newest_release_orders_by_numbers_not_text():
    assert (
        module_util("boot_kernel").newest_release(["6.8.12-11-pve", "6.14.8-2-pve", "6.8.12-4-pve"]) == "6.14.8-2-pve"
    )


# ----------------------------------------------------------------- the module's helpers around the proof
def _module():
    return collection.module("kernel_cmdline")


def test_the_changed_marker_holds_the_line_and_the_utc_time():
    module = _module()
    when = datetime.datetime(2026, 12, 1, 17, 30, 26, tzinfo=datetime.UTC)
    marker = json.loads(module.changed_marker("quiet kvm_amd.sev=1 iommu=nopt", when))
    assert marker == {"changed_at": "2026-12-01T17:30:26Z", "cmdline": "quiet kvm_amd.sev=1 iommu=nopt"}
