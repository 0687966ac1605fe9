"""Checks for a Proxmox node (group proxmox_hosts): kernel arguments, findings, GPU nodes.
Each decides from the node's probe (conftest.py), read once per run."""

from __future__ import annotations

import json

from provision.checks import next_boot
from provision.checks.support import FINDINGS, WANTED
from provision.paths import module_util

# the rule the kernel_cmdline module decides a reboot by: arguments as the kernel reads them
kernel_cmdline = module_util("kernel_cmdline")
# the driver phase's rules: the loaded module's version as the nvidia_driver_info module reads it
nvidia_driver = module_util("nvidia_driver")


def test_kernel_arguments_in_running_kernel(target):
    """/proc/cmdline carries every wanted argument and none of those to remove."""
    wanted = target.json(WANTED)
    assert wanted is not None, "no record of the wanted kernel arguments: the kernel phase has not run here"
    gap = kernel_cmdline.missing(target.data["proc_cmdline"] or "", wanted["add"], wanted["remove"])
    assert gap["ok"], (
        f"/proc/cmdline lacks {' '.join(gap['absent']) or '-'} and still has {' '.join(gap['still_present']) or '-'} "
        f"(reboot pending, or a bootloader change that did not take)"
    )


def assert_findings_of_this_boot(findings: dict, target) -> None:
    """The findings were recorded under the running command line (argument by argument, as the kernel reads it)."""
    recorded = kernel_cmdline.arguments(findings.get("proc_cmdline", ""))
    assert recorded == kernel_cmdline.arguments(target.data["proc_cmdline"] or ""), (
        "the findings are from an earlier boot: run provision apply --tags kernel"
    )


def test_iommu_and_snp_findings(target):
    """The IOMMU and SEV-SNP findings of this boot are recorded and do not contradict the profile."""
    findings = target.json(FINDINGS)
    assert findings is not None, f"{target.path(FINDINGS)} is missing: the kernel phase has not run here"
    assert_findings_of_this_boot(findings, target)
    wanted = target.json(WANTED) or {"add": []}
    if {"iommu=nopt", "iommu.passthrough=0"} & {kernel_cmdline.canonical(a) for a in wanted["add"]}:
        assert findings.get("iommu_default_domain") != "Passthrough", (
            "the IOMMU default domain is Passthrough although the profile asks for translation (SEV-SNP needs it)"
        )
    print(json.dumps({k: findings.get(k) for k in ("iommu_default_domain", "sev_snp", "io_page_faults")}))


def snp_verdict(wanted: dict, findings: dict) -> tuple[bool, str]:
    """(passes, what to say) for SEV-SNP: the node's findings prove it (the kernel_cmdline role's
    module_utils/sev_snp.py decides from the node's own lines), or the inventory says it is not required."""
    missing = "; ".join(findings.get("sev_snp_missing") or [])
    if "sev_snp_missing" not in findings or "snp_required" not in wanted:
        return False, "the findings predate the SEV-SNP proof: run provision apply --tags kernel"
    if findings.get("sev_snp") == "proven":
        return True, "SEV-SNP proven"
    if not wanted["snp_required"]:
        return True, f"SNP not proven (not required: kernel_cmdline_snp_required is false): {missing}"
    return False, f"SEV-SNP is required but not proven: {missing}"


def test_sev_snp_proven(target, record_property):
    """Where the inventory asks for SNP, this boot's findings prove it; elsewhere the check says "SNP not proven"."""
    findings, wanted = target.json(FINDINGS), target.json(WANTED)
    assert findings is not None and wanted is not None, "no kernel findings: the kernel phase has not run here"
    assert_findings_of_this_boot(findings, target)
    passes, note = snp_verdict(wanted, findings)
    record_property("note", note)
    assert passes, note


def test_gpu_device_nodes(target):
    """The NVIDIA module is loaded, and every devN path of the node's CTs is a device node here (PVE's prestart
    hook refuses to start a CT whose path is missing: the module creates none, provision's boot unit does)."""
    assert target.data.get("nvidia_module"), "the NVIDIA kernel module is not loaded (no /proc/driver/nvidia/version)"
    for vmid, paths in sorted(target.data.get("pve_devices", {}).items()):
        missing = sorted(path for path, present in paths.items() if not present)
        assert not missing, f"{', '.join(missing)} missing on the node: CT {vmid} cannot start (devN)"
    nodes = target.data["nvidia_nodes"]
    if "nvidia-uvm" in nodes:
        assert nodes["nvidia-uvm"]["major"] != 195, "/dev/nvidia-uvm has the GPU major 195: it should have its own"


def test_nvidia_driver_is_the_pinned_one(target):
    """The loaded NVIDIA module is the version the inventory pins (nvidia_driver_version), where it pins one (the
    driver phase's rule: unset or empty is not managed): the driver phase installs it, and a node that still runs
    another (an upgrade whose reboot was left pending) fails."""
    wanted = target.vars.get("nvidia_driver_version")
    loaded = nvidia_driver.module_version(target.data.get("nvidia_module"))
    assert not nvidia_driver.pinned(wanted) or loaded == wanted, (
        f"the loaded NVIDIA module is {loaded or 'none'}, not nvidia_driver_version {wanted}: run provision apply "
        "(the driver phase), and reboot the node if it says so"
    )


def test_the_kernel_booted_next_has_the_nvidia_module(target):
    """The kernel the node boots next has the NVIDIA module, where the inventory pins a driver: DKMS builds it only
    for kernels whose headers are installed, so a kernel update without them boots a node with no GPU driver."""
    if not nvidia_driver.pinned(target.vars.get("nvidia_driver_version")):
        return
    release = next_boot.kernel(target.data)
    built, seen = next_boot.nvidia_module(target.data, release)
    assert built, (
        f"the kernel the node boots next, {release}, has no NVIDIA module (dkms status: {seen}): run provision apply "
        f"before the node reboots (the driver phase installs proxmox-headers-{release} and builds the module with "
        "DKMS; proxmox-default-headers brings every future kernel's headers)"
    )


def test_the_next_boot_keeps_the_profile(target, record_property):
    """Every line the node may boot next (its default entry, the line the next bootloader update writes, an armed
    one-shot) carries the kernel phase's arguments: a line edited or armed since apply takes the node off the
    profile at its next reboot, whoever reboots it."""
    assert target.json(WANTED) is not None, "no record of the wanted kernel arguments: the kernel phase has not run"
    found = next_boot.lines(target.data)
    off = [f"{b['source']} lacks {' '.join(b['lacks'])}" for b in found if b["lacks"]]
    assert not off, "the node's next boot leaves the profile: " + "; ".join(off) + ": run provision apply --tags kernel"
    pending = [f"{b['source']}: {b['iommu']['source']}" for b in found if b["pending"]]
    if pending:
        record_property("note", "pending: " + "; ".join(pending))
