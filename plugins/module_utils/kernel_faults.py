"""Kernel log lines that say a GPU's DMA went wrong while it served (pure; the kernel_faults module and
`provision verify` read them through this one rule).

- AMD-Vi `IO_PAGE_FAULT`: the IOMMU refused a device's DMA (drivers/iommu/amd/iommu.c,
  amd_iommu_report_page_fault: "Event logged [IO_PAGE_FAULT domain=... address=... flags=...]");
- AMD-Vi `RMP_PAGE_FAULT`: a DMA hit a page the SEV-SNP reverse map protects (same file,
  amd_iommu_report_rmp_fault: "Event logged [RMP_PAGE_FAULT vmg_tag=..., gpa=..., ...]");
- `NVRM: Xid`: the NVIDIA driver's error report ("NVRM: Xid (PCI:0000:41:00): 79, pid=..., ...").

Each line names its device where the kernel knows it: dev_err's "<driver> <BDF>: " prefix, or "device=<BDF>" in
the AMD-Vi event where the IOMMU found no PCI device, or the Xid's "PCI:<domain:bus:slot>". Under a translating
IOMMU NICs, NVMe and xHCI log IO_PAGE_FAULTs too, and a node's other GPUs (passed to other containers) log Xids:
`of_devices` keeps the lines of the given GPUs, and of no named device, apart from the others.
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


_DEVICE = (
    re.compile(r"(?:^|\s)([0-9a-fA-F]{4,8}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.[0-7]): AMD-Vi: "),
    re.compile(r"\bdevice=([0-9a-fA-F]{4,8}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.[0-7])\b"),
    re.compile(r"NVRM: Xid \(PCI:([0-9a-fA-F]{4,8}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2})\)"),
)


def device(line):
    """The PCI device a fault line names, as "dddd:bb:ss.f" (an Xid names no function: "dddd:bb:ss"), lower case and
    with a 4-digit domain; None where it names none."""
    for pattern in _DEVICE:
        m = pattern.search(line)
        if m:
            domain, rest = m.group(1).lower().split(":", 1)
            return f"{int(domain, 16):04x}:{rest}"
    return None


def of_devices(lines, gpus):
    """(the lines of these GPUs or of no named device, the lines of other devices): `gpus` are bus ids as nvidia-smi
    or sysfs print them (00000000:41:00.0 or 0000:41:00.0); None (not known) counts every line."""
    if gpus is None:
        return list(lines), []
    mine = set()
    for gpu in gpus:
        bus = device(f"device={gpu}") or gpu.lower()
        mine.update((bus, bus.rsplit(".", 1)[0]))
    own, other = [], []
    for line in lines:
        named = device(line)
        (own if named is None or named in mine else other).append(line)
    return own, other


def read_result(rc, out, err):
    """(lines text, error): journalctl exits 1, with nothing on stderr, when nothing matches."""
    if rc == 0 or (rc == 1 and not (err or "").strip()):
        return out, None
    return None, f"cannot read the kernel log (journalctl exit {rc}: {(err or out or '').strip()[-200:]})"
