"""This boot's IOMMU and SEV-SNP findings on a node, from its kernel log.

One rule for the kernel_cmdline module (kernel-findings.json, which `provision verify` checks), the gpu_p2p_node
module (the IOMMU mode a P2P decision holds in) and the GPU diagnostic script (its host findings), which the gpu_diag
role ships with this file and sev_snp.py beside it: standard library only, importing no other module_utils.
Commands run through the caller's `run(argv) -> (rc, stdout)` (AnsibleModule.run_command, or subprocess).
"""

from __future__ import annotations

import re

# drivers/iommu/iommu.c iommu_subsys_init: "Default domain type: %s%s" (Translated, Passthrough, ...)
DEFAULT_DOMAIN = re.compile(r"iommu: Default domain type: (\S+)")
JOURNAL_THIS_BOOT = ["journalctl", "-k", "-b", "0", "-q", "--no-pager", "-o", "cat"]


def default_domain(log: str | None) -> str | None:
    """The word of this boot's `iommu: Default domain type` line (None without one)."""
    m = DEFAULT_DOMAIN.search(log or "")
    return m.group(1) if m else None


def read_logs(run) -> tuple[str | None, str | None]:
    """(dmesg, this boot's kernel log). The second is the journal's (`journalctl -k -b 0`) when it has lines: the
    SEV-SNP lines are printed at boot, and a long-running node's ring buffer may have dropped them; else dmesg.
    None where nothing could be read."""
    rc, out = run(["dmesg"])
    dmesg = out if rc == 0 else None
    rc, out = run(JOURNAL_THIS_BOOT)
    return dmesg, out if rc == 0 and (out or "").strip() else dmesg


def findings(dmesg: str | None, snp: dict) -> dict:
    """The findings: the IOMMU default domain and the IO_PAGE_FAULT count from dmesg (None: not readable), and
    SEV-SNP proven or not, with what is missing and the evidence (`snp`: sev_snp.proof's answer)."""
    if dmesg is None:
        out = {"iommu_default_domain": "unknown (dmesg not readable)", "io_page_faults": None}
    else:
        out = {
            "iommu_default_domain": default_domain(dmesg) or "not supported",
            "io_page_faults": dmesg.count("IO_PAGE_FAULT"),
        }
    out.update(
        sev_snp="proven" if snp["proven"] else "not proven",
        sev_snp_missing=snp["missing"],
        sev_snp_evidence=snp["evidence"],
    )
    return out
