"""Kernel log lines that say a GPU's DMA went wrong while it served (pure; the kernel_faults module and
`provision verify` read them through this one rule).

- AMD-Vi `IO_PAGE_FAULT`: the IOMMU refused a device's DMA (drivers/iommu/amd/iommu.c,
  amd_iommu_report_page_fault: "Event logged [IO_PAGE_FAULT domain=... address=... flags=...]");
- AMD-Vi `RMP_PAGE_FAULT`: a DMA hit a page the SEV-SNP reverse map protects (same file,
  amd_iommu_report_rmp_fault: "Event logged [RMP_PAGE_FAULT vmg_tag=..., gpa=..., ...]");
- `NVRM: Xid`: the NVIDIA driver's error report ("NVRM: Xid (PCI:0000:41:00): 79, pid=..., ...").
"""

from __future__ import annotations

import re
from datetime import UTC, datetime

PATTERN = r"IO_PAGE_FAULT|RMP_PAGE_FAULT|NVRM: Xid"
_LINE = re.compile(r"^(\d+(?:\.\d+)?) (\S+) (.*)$")


def journal_argv(since=None):
    """journalctl reading this boot's kernel messages that match, with unix timestamps (-o short-unix)."""
    argv = ["journalctl", "-k", "-b", "--no-pager", "-o", "short-unix", "--grep", PATTERN]
    return argv + (["--since", f"@{int(since)}"] if since is not None else [])


def faults(text, since=None):
    """The matching lines of journalctl -o short-unix output logged at or after `since` (unix time),
    each as "<UTC time> <message>"."""
    found = []
    for line in (text or "").splitlines():
        m = _LINE.match(line)
        if not m or not re.search(PATTERN, m.group(3)):
            continue
        stamp = float(m.group(1))
        if since is not None and stamp < float(since):
            continue
        when = datetime.fromtimestamp(stamp, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        found.append(f"{when} {m.group(3)}")
    return found


def read_result(rc, out, err):
    """(lines text, error): journalctl exits 1, with nothing on stderr, when nothing matches."""
    if rc == 0 or (rc == 1 and not (err or "").strip()):
        return out, None
    return None, f"cannot read the kernel log (journalctl exit {rc}: {(err or out or '').strip()[-200:]})"
