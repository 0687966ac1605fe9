"""What a node boots next, and what that boot's kernel command line does to its IOMMU (pure functions; read by the
gpu_p2p_node and sglang_p2p modules and by tests).

The IOMMU's default domain is fixed once per boot from that boot's command line (Linux `iommu_subsys_init`,
`arch/x86/kernel/pci-dma.c`). A line written now and not booted yet (a pending reboot, a refused one, an armed
one-shot) changes it at the next boot, whoever reboots: a P2P decision must hold for that boot too.

The lines a node may boot next:
- GRUB: the default entry of /boot/grub/grub.cfg, and the line update-grub writes into it at the next kernel update
  (GRUB_CMDLINE_LINUX and GRUB_CMDLINE_LINUX_DEFAULT, sourced from /etc/default/grub and its grub.d snippets as
  grub-mkconfig sources them); a one-shot armed with grub-reboot (grubenv's next_entry);
- systemd-boot through proxmox-boot-tool: /etc/kernel/cmdline, the options every loader entry gets at the next
  refresh; a one-shot armed with `bootctl set-oneshot` (the LoaderEntryOneShot EFI variable).
"""

from __future__ import annotations

import json
import re

from ansible_collections.provision.pve_sglang.plugins.module_utils.boot_trial import LOADER_VARS, SDBOOT_ENTRY
from ansible_collections.provision.pve_sglang.plugins.module_utils.boot_trial import TRIAL_RECORD as TRIAL_FILE
from ansible_collections.provision.pve_sglang.plugins.module_utils.kernel_cmdline import canonical, key, split

# what is read on a node for its next boot's lines, by the names `lines` takes them under
GRUB_CFG = "/boot/grub/grub.cfg"
GRUB_CUSTOM = "/boot/grub/custom.cfg"
GRUBENV = "/boot/grub/grubenv"
KERNEL_CMDLINE = "/etc/kernel/cmdline"
ONESHOT = LOADER_VARS.format("LoaderEntryOneShot")
# the kernel phase's trial record, under the state directory: the line its systemd-boot one-shot boots
TRIAL_RECORD = "kernel-cmdline/" + TRIAL_FILE
# the line grub-mkconfig writes: a shell sources the same files in the same order; exit 3 where there is no
# /etc/default/grub (a node whose GRUB configuration is not Debian's)
NO_DEFAULT_GRUB = 3
GRUB_CONFIGURED = (
    f"[ -e /etc/default/grub ] || exit {NO_DEFAULT_GRUB}; GRUB_CMDLINE_LINUX= GRUB_CMDLINE_LINUX_DEFAULT=; "
    '. /etc/default/grub; for f in /etc/default/grub.d/*.cfg; do [ -e "$f" ] && . "$f"; done; '
    'printf "%s %s" "$GRUB_CMDLINE_LINUX" "$GRUB_CMDLINE_LINUX_DEFAULT"'
)

# the command-line parameters that choose the IOMMU's mode (Documentation/admin-guide/kernel-parameters.txt)
IOMMU_KEYS = ("iommu", "iommu.passthrough", "amd_iommu", "intel_iommu")
_OFF = {"iommu": ("off",), "amd_iommu": ("off",), "intel_iommu": ("off",)}
_PASSTHROUGH = {
    "iommu": {"pt": False, "nopt": True},
    "iommu.passthrough": {"1": False, "on": False, "y": False, "0": True, "off": True, "n": True},
}
_NEXT_ENTRY = re.compile(r"^next_entry=(.*)$", re.M)
_MENUENTRY = re.compile(r"^\s*menuentry\s+(?:'([^']*)'|\"([^\"]*)\")([^{]*)\{", re.M)


def iommu_args(line: str | None) -> list[str]:
    """The arguments of `line` that choose the IOMMU's mode, in their order, as the kernel reads them (a quoted value
    such as dyndbg="module iommu +p" is one argument)."""
    return [canonical(a) for a in split(line or "") if key(a) in IOMMU_KEYS]


def translates(line: str) -> bool | None:
    """Whether a boot of `line` translates GPU DMA: False for an IOMMU that is off or in passthrough, True where the
    line asks for translation, None where the line does not say (the kernel's built-in default decides)."""
    mode = None
    for arg in iommu_args(line):
        name, _sep, value = arg.partition("=")
        if value in _OFF.get(name, ()):
            return False
        mode = _PASSTHROUGH.get(name, {}).get(value, mode)
    return mode


def boot_iommu(running_line: str | None, running: dict, line: str | None) -> dict:
    """{"translates", "source"} for a boot of `line`: this boot's measured mode where the IOMMU arguments are the same
    as this boot's, else what the line says; an unreadable line (None) may translate."""
    if line is None:
        return {"translates": None, "source": "its line cannot be read here"}
    if iommu_args(line) == iommu_args(running_line):
        return {"translates": running["translates"], "source": "the same IOMMU arguments as this boot"}
    args = " ".join(iommu_args(line)) or "no IOMMU argument"
    mode = translates(line)
    said = {True: "translated", False: "not translated", None: "the kernel's default, which may translate"}[mode]
    return {"translates": mode, "source": f"{args}: {said}"}


def grubenv_next_entry(grubenv: str | None) -> str | None:
    """The one-shot entry grub-reboot armed (grubenv's next_entry), or None; GRUB leaves `next_entry=` once taken."""
    m = _NEXT_ENTRY.search(grubenv or "")
    return m.group(1).strip() or None if m else None


def grub_entry_line(cfg: str | None, entry: str) -> str | None:
    """The kernel arguments of the menu entry whose title or --id is `entry` in a grub.cfg or custom.cfg text."""
    text = cfg or ""
    for m in _MENUENTRY.finditer(text):
        title, ident = m.group(1) or m.group(2), re.search(r"--id\s+(\S+)", m.group(3))
        if entry in (title, ident.group(1) if ident else None):
            linux = re.search(r"^\s*linux\s+\S+\s*(.*)$", text[m.end() :], re.M)
            return linux.group(1).strip() if linux else None
    return None


def grub_default_line(cfg: str | None) -> str | None:
    """The kernel arguments of grub.cfg's first `linux` line: the default entry's (GRUB_DEFAULT=0)."""
    m = re.search(r"^\s*linux\s+\S*vmlinuz\S*\s*(.*)$", cfg or "", re.M)
    return m.group(1).strip() if m else None


def trial_line(record: str | None) -> str | None:
    """The line of the kernel phase's trial record (its text), or None."""
    try:
        found = json.loads(record or "{}")
    except ValueError:
        return None
    return found.get("line") if isinstance(found, dict) else None


def lines(reads: dict) -> list[dict]:
    """The lines a node may boot next, each {"source", "cmdline", "loader"}: the bootloader that boots it, and
    cmdline None where it cannot be read without mounting an ESP. From what was read on the node: `grub_cfg`,
    `grubenv`, `grub_custom` and `kernel_cmdline` (the texts of GRUB_CFG, GRUBENV, GRUB_CUSTOM and KERNEL_CMDLINE,
    None where absent), `grub_configured` (GRUB_CONFIGURED's {"rc", "stdout"}), `oneshot` (LoaderEntryOneShot's
    value) and `trial_line` (trial_line of the trial record)."""
    grub, sdboot = [], []
    cfg = reads.get("grub_cfg")
    if cfg is not None:
        grub.append((f"{GRUB_CFG} default entry", grub_default_line(cfg)))
    configured = reads.get("grub_configured") or {"rc": NO_DEFAULT_GRUB}
    if configured["rc"] != NO_DEFAULT_GRUB:
        line = " ".join(configured.get("stdout", "").split()) if configured["rc"] == 0 else None
        grub.append(("/etc/default/grub (the line update-grub writes next)", line))
    entry = grubenv_next_entry(reads.get("grubenv"))
    if entry:
        line = grub_entry_line(reads.get("grub_custom"), entry) or grub_entry_line(cfg, entry)
        grub.append((f"one-shot GRUB entry {entry} (grub-reboot)", line))
    text = reads.get("kernel_cmdline")
    if text is not None:
        line = text.partition("\n")[0].strip()  # its first line, as the kernel_cmdline module reads and writes it
        sdboot.append((f"{KERNEL_CMDLINE} (every loader entry at the next proxmox-boot-tool refresh)", line))
    oneshot = reads.get("oneshot")
    if oneshot:
        line = reads.get("trial_line") if oneshot.lower() == SDBOOT_ENTRY else None
        sdboot.append((f"one-shot loader entry {oneshot} (LoaderEntryOneShot)", line))
    return [dict(source=source, cmdline=line, loader="grub") for source, line in grub] + [
        dict(source=source, cmdline=line, loader="systemd-boot") for source, line in sdboot
    ]
