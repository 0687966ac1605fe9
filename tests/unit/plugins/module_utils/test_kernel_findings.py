"""This boot's IOMMU and SEV-SNP findings, one rule (plugins/module_utils/kernel_findings.py with sev_snp.py) for the
kernel_cmdline module, the gpu_p2p_node module and the GPU diagnostic script, which the gpu_diag role ships with
both files beside it."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

from provision.paths import module_util, plugins_dir
from tests.loaders import REPO

SCRIPT = REPO / "roles" / "gpu_diag" / "files" / "gpu_p2p_diag.py"
kernel_findings = module_util("kernel_findings")
sev_snp = module_util("sev_snp")

# rendered from drivers/iommu/iommu.c iommu_subsys_init(): pr_fmt "iommu: " + "Default domain type: %s%s\n", the
# second %s " (set via kernel command line)" when iommu.passthrough= or iommu=pt/nopt chose it
TRANSLATED = "[    0.472139] iommu: Default domain type: Translated (set via kernel command line)"
PASSTHROUGH = "[    0.480127] iommu: Default domain type: Passthrough"
# drivers/iommu/amd/iommu.c amd_iommu_report_page_fault()
FAULT = "[ 1412.5] vfio-pci 0000:41:00.0: AMD-Vi: Event logged [IO_PAGE_FAULT domain=0x0011 address=0x0 flags=0x0020]"


def test_the_default_domain_is_its_first_word():
    assert kernel_findings.default_domain(TRANSLATED) == "Translated"
    assert kernel_findings.default_domain("x\n" + PASSTHROUGH + "\n") == "Passthrough"
    assert kernel_findings.default_domain("no such line") is None and kernel_findings.default_domain(None) is None


def test_findings_from_a_readable_and_an_unreadable_kernel_log():
    proof = sev_snp.proof(None, "6.14.8-2-pve", True, "Y\n")
    found = kernel_findings.findings("\n".join([TRANSLATED, FAULT, FAULT]), proof)
    assert found["iommu_default_domain"] == "Translated" and found["io_page_faults"] == 2
    assert (found["sev_snp"], found["sev_snp_missing"]) == ("not proven", proof["missing"])
    assert found["sev_snp_evidence"] == proof["evidence"]
    unread = kernel_findings.findings(None, {"proven": True, "missing": [], "evidence": {}})
    assert unread["iommu_default_domain"] == "unknown (dmesg not readable)" and unread["io_page_faults"] is None
    assert unread["sev_snp"] == "proven"
    assert kernel_findings.findings("", proof)["iommu_default_domain"] == "not supported"


def test_this_boots_journal_is_read_before_a_ring_buffer_that_may_have_dropped_the_boot_lines():
    def run(answers):
        return lambda argv: answers[argv[0]]

    logs = kernel_findings.read_logs
    assert logs(run({"dmesg": (0, "ring"), "journalctl": (0, "journal")})) == ("ring", "journal")
    assert logs(run({"dmesg": (0, "ring"), "journalctl": (0, " \n")})) == ("ring", "ring")
    assert logs(run({"dmesg": (1, "denied"), "journalctl": (127, "")})) == (None, None)


def test_no_other_file_reads_these_findings_by_its_own_rule():
    rule_lines = ("Default domain type: (", 'count("IO_PAGE_FAULT")', "kvm_amd/parameters/sev_snp")
    owners = {"kernel_findings.py", "sev_snp.py"}
    for path in [
        *REPO.joinpath("plugins").rglob("*.py"),
        *REPO.joinpath("roles").rglob("*.py"),
        *REPO.joinpath("provision").rglob("*.py"),
    ]:
        if path.name not in owners:
            text = path.read_text()
            assert not [line for line in rule_lines if line in text], f"{path} has its own copy of a findings rule"


def test_the_diagnostic_as_its_role_ships_it_reads_the_node_by_the_same_rule(tmp_path):
    """The gpu_diag role copies the script and the two module_utils side by side (roles/gpu_diag/vars/main.yml)."""
    for source in (
        SCRIPT,
        plugins_dir() / "module_utils" / "kernel_findings.py",
        plugins_dir() / "module_utils" / "sev_snp.py",
    ):
        shutil.copy(source, tmp_path)
    shipped = (REPO / "roles" / "gpu_diag" / "vars" / "main.yml").read_text()
    assert "module_utils/kernel_findings.py" in shipped and "module_utils/sev_snp.py" in shipped
    proc = subprocess.run(
        [sys.executable, str(tmp_path / "gpu_p2p_diag.py"), "--skip-nccl"], capture_output=True, text=True, timeout=300
    )
    host = json.loads(proc.stdout)["host_findings"]

    def run(argv):
        done = subprocess.run(argv, capture_output=True, text=True, timeout=30) if shutil.which(argv[0]) else None
        return (done.returncode, done.stdout) if done else (127, "")

    dmesg, kernel_log = kernel_findings.read_logs(run)
    here = kernel_findings.findings(dmesg, sev_snp.node_proof(kernel_log))
    for key in ("iommu_default_domain", "sev_snp", "sev_snp_missing"):
        assert host[key] == here[key], key
    assert "acs_ctl" in host and "sev_snp_dmesg" not in host
