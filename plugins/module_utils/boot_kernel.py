"""The kernel release a node boots next (pure; the kernel_cmdline module reads the node's files for it, and
`provision verify` the probe's reading of the same files). Standard library only.

- GRUB: the first `linux` line of /boot/grub/grub.cfg, which update-grub writes for the newest kernel after
  each kernel update;
- systemd-boot through proxmox-boot-tool: the kernel pinned with `proxmox-boot-tool kernel pin`
  (/etc/kernel/proxmox-boot-pin), else the newest in /boot (proxmox-boot-tool's default entry);
- else the running one.

`detect_bootloader` and `on_this_node` read the node itself, for a module that runs there.
"""

from __future__ import annotations

import glob
import os
import re

GRUB_CFG = "/boot/grub/grub.cfg"
PBT_PIN = "/etc/kernel/proxmox-boot-pin"

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


def detect_bootloader(module) -> tuple[str, str]:
    """(bootloader, how it was told) as the PVE docs and proxmox-boot-tool do, for a module on the node:
    `proxmox-boot-tool status` exits 0 and lists ESPs 'configured with: uefi' -> systemd-boot; exit 2 (no uuids
    file), only 'grub', or no tool -> GRUB. ESPs of both kinds fail the module: the firmware may boot either, and
    systemd-boot reads the kernel line from /etc/kernel/cmdline where GRUB reads /etc/default/grub."""
    tool = module.get_bin_path("proxmox-boot-tool")
    if tool is None:
        return "grub", "proxmox-boot-tool not installed"
    rc, out, _err = module.run_command([tool, "status"])
    if rc == 2:
        return "grub", "proxmox-boot-tool status: no ESPs managed (exit 2)"
    kinds = esp_kinds(out)
    if "uefi" in kinds and "grub" in kinds:
        module.fail_json(
            msg=f"proxmox-boot-tool status lists ESPs configured with uefi ({', '.join(kinds['uefi'])}) and with grub "
            f"({', '.join(kinds['grub'])}): the firmware may boot either, and systemd-boot reads the kernel line from "
            "/etc/kernel/cmdline where GRUB reads /etc/default/grub; make every ESP one kind (proxmox-boot-tool init "
            "on the odd one, or proxmox-boot-tool clean for one that is gone), then run again"
        )
    if rc == 0 and "uefi" in kinds:
        return "systemd-boot", "proxmox-boot-tool status: ESP configured with uefi"
    return "grub", "proxmox-boot-tool status: ESPs use grub"


def esp_kinds(status: str) -> dict[str, list[str]]:
    """kind -> the ESPs `proxmox-boot-tool status` says are configured with it: "<UUID> is configured with: uefi
    (versions: ...)", or "uefi (versions: ...), grub (versions: ...)" for an ESP that holds both (GRUB's files stay
    after `proxmox-boot-tool init` moves an ESP to systemd-boot). Such an ESP counts as uefi: UEFI firmware boots its
    systemd-boot. "grub" lists the ESPs that are GRUB's alone."""
    kinds: dict[str, list[str]] = {}
    for uuid, rest in re.findall(r"^(\S+) is configured with: (.*)$", status, re.M):
        found = set(re.findall(r"(\w+) \(versions", rest)) or set(re.findall(r"^(\w+)", rest))
        kind = "uefi" if "uefi" in found else "grub" if "grub" in found else None
        if kind:
            kinds.setdefault(kind, []).append(uuid)
    return kinds


def read_text(path: str) -> str | None:
    """A file's text (undecodable bytes replaced), or None where it cannot be read."""
    try:
        with open(path, encoding="utf-8", errors="replace") as handle:
            return handle.read()
    except OSError:
        return None


def on_this_node(bootloader: str | None, grub_cfg: str = GRUB_CFG, pin: str = PBT_PIN) -> str:
    """The kernel release this node boots next, from its own files."""
    vmlinuz = [os.path.basename(p)[len("vmlinuz-") :] for p in glob.glob("/boot/vmlinuz-*")]
    return next_kernel(bootloader, read_text(grub_cfg), read_text(pin), vmlinuz, os.uname().release)
