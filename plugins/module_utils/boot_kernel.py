"""The kernel release a node boots next (pure; the kernel_cmdline module reads the node's files for it, and
`provision verify` the probe's reading of the same files). Standard library only.

- GRUB: the first `linux` line of /boot/grub/grub.cfg, which update-grub writes for the newest kernel after
  each kernel update;
- systemd-boot through proxmox-boot-tool: the kernel pinned with `proxmox-boot-tool kernel pin`
  (/etc/kernel/proxmox-boot-pin), else the newest in /boot (proxmox-boot-tool's default entry);
- else the running one.
"""

from __future__ import annotations

import re

_GRUB_LINUX = re.compile(r"^\s*linux\s+\S*vmlinuz-(\S+)", re.M)


def newest_release(releases: list[str]) -> str | None:
    """The highest kernel release by version numbers (`6.14.8-2-pve` over `6.8.12-11-pve`)."""

    def order(release: str) -> list[int]:
        return [int(n) for n in re.findall(r"\d+", release)]

    return max(releases, key=order) if releases else None


def next_kernel(bootloader: str | None, grub_cfg: str | None, pin: str | None, vmlinuz: list[str], running: str) -> str:
    """The kernel release the node boots next; `vmlinuz` are the release parts of /boot/vmlinuz-*."""
    if bootloader == "grub":
        m = _GRUB_LINUX.search(grub_cfg or "")
        if m:
            return m.group(1)
    else:
        pinned = (pin or "").strip()
        newest = newest_release(vmlinuz)
        if pinned or newest:
            return pinned or newest
    return running
