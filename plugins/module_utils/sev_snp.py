"""SEV-SNP proven from a node's own evidence, not assumed from its kernel arguments.

Pure functions, plus `node_proof`, which reads the running node; shared by the kernel_cmdline module and the GPU
diagnostic script (plugins/module_utils/kernel_findings.py) and provision's tests. Standard library only.
A node proves SEV-SNP when all of these hold (pve-docs qm.adoc, "AMD SEV"; AMDESE/AMDSEV; virtee/snphost):

- the running kernel is 6.11 or later (the first with SEV-SNP host support upstream);
- `/sys/module/kvm_amd/parameters/sev_snp` reads `Y` (arch/x86/kvm/svm/sev.c overwrites the parameter
  with the real support at the end of sev_hardware_setup(); kernel/params.c prints a bool as Y or N);
- dmesg has each line the kernel prints when SNP comes up, in the kernel's own format:
  - `kvm_amd: SEV-SNP enabled (ASIDs 1 - 99)`: arch/x86/kvm/svm/sev.c, "SEV-SNP %s (ASIDs %u - %u)";
  - `ccp 0000:01:00.5: SEV-SNP API:1.55 build:24` with firmware 1.51 or later:
    drivers/crypto/ccp/sev-dev.c, "SEV-SNP API:%d.%d build:%d" (or "SEV API:..." when only SEV came up);
  - the RMP table, arch/x86/virt/svm/sev.c snp_probe_rmptable_info(): `SEV-SNP: RMP table physical range
    [0x... - 0x...]` for a contiguous RMP, or on a segmented RMP (EPYC 9005, Linux 6.14 and later)
    `SEV-SNP: RMP segment table physical address [0x... - 0x...]`, then one `RMP segment N physical address
    [...] covering [...]` line per segment (segmented_rmptable_setup);
  - `AMD-Vi: IOMMU SNP support enabled.`: drivers/iommu/amd/init.c iommu_snp_enable().

Every reason given for a missing prerequisite is one line and true: a kernel older than 6.11 is named as
that, not as "kvm_amd not loaded" (such a kernel has no sev_snp parameter at all), and `sev=nosnp` on the kernel
line (arch/x86/virt/svm/cmdline.c: it clears the SNP feature on the host) is named, not the CPU or BIOS.
"""

from __future__ import annotations

import os
import re

MIN_KERNEL = (6, 11)
NOSNP_FIX = "the SNP profile removes it; take it out of kernel_cmdline_extra_args"
MIN_FIRMWARE = (1, 51)
SEV_SNP_PARAM = "/sys/module/kvm_amd/parameters/sev_snp"

KVM_SNP = re.compile(r"SEV-SNP (enabled|disabled|unusable) \(ASIDs (\d+) - (\d+)\)")
FIRMWARE = re.compile(r"SEV(-SNP)? API:(\d+)\.(\d+) build:(\d+)")
RMP_RANGE = re.compile(
    r"SEV-SNP: RMP (?:table physical range|segment table physical address) \[(0x[0-9a-fA-F]+) - (0x[0-9a-fA-F]+)\]"
)
RMP_NOT_COVERED = re.compile(r"SEV-SNP: Segmented RMP does not cover full system RAM[^\n]*")
RMP_NOT_RESERVED = re.compile(r"SEV-SNP: Memory for the RMP table has not been reserved by BIOS")
IOMMU_SNP = re.compile(r"AMD-Vi: IOMMU SNP support enabled")
IOMMU_REFUSED = re.compile(r"SNP: [^\n]*SNP cannot be supported\.?")


def nosnp(line: str | None) -> bool:
    """Whether a kernel line turns SNP off on the host: `sev=` takes comma-separated options, `nosnp` among them
    (arch/x86/virt/svm/cmdline.c, init_sev_config)."""
    return any(
        arg.startswith("sev=") and "nosnp" in arg[len("sev=") :].strip('"').split(",") for arg in (line or "").split()
    )


def kernel_version(release: str) -> tuple[int, int] | None:
    """(major, minor) of a kernel release such as `6.8.12-4-pve` or `6.1.0-57-amd64`."""
    m = re.match(r"(\d+)\.(\d+)", release or "")
    return (int(m.group(1)), int(m.group(2))) if m else None


def kernel_too_old(release: str) -> str | None:
    version = kernel_version(release)
    if version is None:
        return f"kernel release {release!r} cannot be read as a version"
    if version < MIN_KERNEL:
        return f"kernel {release} is older than 6.11, the first with SEV-SNP host support"
    return None


def firmware_version(dmesg: str) -> tuple[int, int] | None:
    """The SEV firmware's API version: the SEV-SNP line when SNP came up, else the SEV line."""
    found = {bool(m.group(1)): (int(m.group(2)), int(m.group(3))) for m in FIRMWARE.finditer(dmesg)}
    return found.get(True) or found.get(False)


def evidence(
    dmesg: str | None, release: str, kvm_amd_loaded: bool, sev_snp_param: str | None, cmdline: str | None = None
) -> dict:
    """What the node shows, as found (None where absent); dmesg None means it could not be read."""
    text = dmesg or ""
    not_covered = RMP_NOT_COVERED.search(text)
    snp = KVM_SNP.search(text)
    rmp = RMP_RANGE.search(text)
    iommu = IOMMU_SNP.search(text)
    firmware = firmware_version(text)
    return {
        "kernel": release,
        "kvm_amd_loaded": kvm_amd_loaded,
        "sev_snp_param": sev_snp_param.strip() if sev_snp_param is not None else None,
        "dmesg_readable": dmesg is not None,
        "kvm_snp_line": snp.group(0) if snp else None,
        "firmware": "{}.{}".format(*firmware) if firmware else None,
        "rmp_range": rmp.group(0) if rmp else None,
        "rmp_not_reserved": bool(RMP_NOT_RESERVED.search(text)),
        "rmp_not_covered": not_covered.group(0) if not_covered else None,
        "nosnp": nosnp(cmdline),
        "iommu_snp_line": iommu.group(0) if iommu else None,
        "iommu_refused": (IOMMU_REFUSED.search(text).group(0) if IOMMU_REFUSED.search(text) else None),
    }


def _param_reason(ev: dict) -> str | None:
    if ev["sev_snp_param"] == "Y":
        return None
    if not ev["kvm_amd_loaded"]:
        return "kvm_amd is not loaded (no /sys/module/kvm_amd)"
    if ev["sev_snp_param"] is None:
        return "kvm_amd has no sev_snp parameter (a kernel built without CONFIG_KVM_AMD_SEV)"
    return f"{SEV_SNP_PARAM} reads {ev['sev_snp_param']}, not Y"


def _dmesg_reasons(ev: dict) -> list[str]:
    if not ev["dmesg_readable"]:
        return ["dmesg could not be read, so SEV-SNP enabled, the SEV firmware, the RMP table and AMD-Vi are unproven"]
    reasons = []
    line = ev["kvm_snp_line"]
    if line is None:
        reasons.append("dmesg has no 'kvm_amd: SEV-SNP enabled' line")
    elif not line.startswith("SEV-SNP enabled"):
        reasons.append(f"dmesg says '{line}'")
    firmware = ev["firmware"]
    if firmware is None:
        reasons.append("dmesg has no SEV firmware version ('SEV-SNP API:' line from ccp)")
    elif tuple(int(p) for p in firmware.split(".")) < MIN_FIRMWARE:
        reasons.append(f"SEV firmware {firmware} is older than 1.51")
    if ev["rmp_range"] is None:
        reasons.append(
            "the BIOS did not reserve the RMP table (enable SNP memory coverage)"
            if ev["rmp_not_reserved"]
            else "dmesg has no 'SEV-SNP: RMP table physical range' (or 'RMP segment table physical address') line"
        )
    elif ev.get("rmp_not_covered"):
        reasons.append(f"dmesg says '{ev['rmp_not_covered']}' (the BIOS's SNP memory coverage)")
    if ev["iommu_snp_line"] is None:
        refused = ev["iommu_refused"]
        reasons.append(
            f"AMD-Vi refused SNP: '{refused}'" if refused else "dmesg has no 'AMD-Vi: IOMMU SNP support enabled'"
        )
    return reasons


def missing(ev: dict) -> list[str]:
    """Each missing prerequisite, one true line each; an empty list proves SEV-SNP."""
    too_old = kernel_too_old(ev["kernel"])
    reasons = [too_old] if too_old else []
    if ev.get("nosnp"):
        reasons.append(f"this boot's kernel line has sev=nosnp, which turns SEV-SNP off on the host ({NOSNP_FIX})")
    if not too_old:  # an older kernel has no sev_snp parameter: that is the kernel's age, already named
        param = _param_reason(ev)
        reasons += [param] if param else []
    return reasons + _dmesg_reasons(ev)


def proof(
    dmesg: str | None, release: str, kvm_amd_loaded: bool, sev_snp_param: str | None, cmdline: str | None = None
) -> dict:
    """{'proven', 'missing', 'evidence'} for one boot of a node."""
    ev = evidence(dmesg, release, kvm_amd_loaded, sev_snp_param, cmdline)
    gaps = missing(ev)
    return {"proven": not gaps, "missing": gaps, "evidence": ev}


def node_proof(kernel_log: str | None) -> dict:
    """`proof` for the node this runs on: its kernel log of this boot (None: not readable), the running kernel's
    release, kvm_amd's parameter and this boot's kernel line."""
    param, cmdline = _read(SEV_SNP_PARAM), _read("/proc/cmdline")
    return proof(kernel_log, os.uname().release, os.path.isdir("/sys/module/kvm_amd"), param, cmdline)


def _read(path: str) -> str | None:
    try:
        with open(path) as f:
            return f.read()
    except OSError:
        return None


def cpu_flags(cpuinfo: str) -> set[str]:
    """The flags of the first CPU in /proc/cpuinfo (`flags\t\t: fpu vme ... sev sev_es sev_snp`)."""
    for line in cpuinfo.splitlines():
        key, sep, value = line.partition(":")
        if sep and key.strip() == "flags":
            return set(value.split())
    return set()


def before_reboot(cpuinfo: str, boot_release: str, running_line: str = "", next_line: str | None = None) -> list[str]:
    """What can be checked before rebooting into the SNP profile: the CPU flag, the kernel that will boot, and the
    line it boots with. The flag (arch/x86/include/asm/cpufeatures.h X86_FEATURE_SEV_SNP, "sev_snp") is cleared by
    the kernel when the BIOS has not enabled SNP or reserved the RMP table (arch/x86/kernel/cpu/amd.c), and by
    sev=nosnp on this boot's line: then the BIOS cannot be judged from this boot, and the boot after decides."""
    reasons = []
    if nosnp(next_line):
        reasons.append(f"the line the node boots next has sev=nosnp, which turns SEV-SNP off on the host ({NOSNP_FIX})")
    if "sev_snp" not in cpu_flags(cpuinfo) and not nosnp(running_line):
        reasons.append(
            "the CPU flag sev_snp is missing from /proc/cpuinfo "
            "(a CPU or BIOS without SEV-SNP: check SMEE, SEV-SNP and SNP memory coverage)"
        )
    too_old = kernel_too_old(boot_release)
    if too_old:
        reasons.append(too_old + " (the kernel the node boots next)")
    return reasons
