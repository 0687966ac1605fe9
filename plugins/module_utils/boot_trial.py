"""A new kernel command line booted once, as a trial, before it becomes the default: the pure part.

Shared by the kernel_cmdline module (which reads the node and writes the entries) and provision's tests.
Standard library only. Each rule below is read from the real sources of the bootloaders a PVE node uses:

GRUB (Debian 12, grub2 2.06-13):
- /etc/grub.d/41_custom makes grub.cfg `source ${config_directory}/custom.cfg` (or `$prefix/custom.cfg`) at boot,
  after the generated menu entries: a menu entry written to /boot/grub/custom.cfg needs no update-grub.
- /etc/grub.d/00_header writes, whatever GRUB_DEFAULT is (`saved` or not), `load_env` from `$prefix/grubenv` and
  `if [ "${next_entry}" ]; then set default="${next_entry}"; set next_entry=; save_env next_entry; ...`:
  `grub-reboot ID` (which sets next_entry in grubenv) makes entry ID the default once, and GRUB clears it before
  the menu runs. Otherwise `set default="${GRUB_DEFAULT}"`; with GRUB_DEFAULT unset or 0 that is the first
  top-level menu entry, which the trial entry copies.
- GRUB cannot clear next_entry where it cannot write grubenv: 00_header's own check_writable() disables its
  recordfail for the same reason when `grub-probe --target=abstraction /boot/grub` names diskfilter or lvm, or
  `grub-probe --target=fs /boot/grub` names btrfs, cpiofs, newc, odc, romfs, squash4, tarfs or zfs (and
  grub-reboot warns "... will remain the default boot entry until manually cleared" for diskfilter/lvm). A
  next_entry that is never cleared would boot the trial every time: no trial there. cryptodisk and every other
  abstraction are refused too (GRUB's cryptodisk has no write support either).

systemd-boot (systemd 252, as proxmox-boot-tool lays it out):
- src/boot/efi/boot.c config_load_defaults() reads the EFI variable LoaderEntryOneShot and deletes it at once
  ("Unset variable now, after all it's 'one shot'"), then boots the entry it names.
- bootctl set-oneshot (src/boot/bootctl.c verb_set_efivar()) only writes that variable: it needs no mounted ESP,
  but a node booted by systemd-boot (the LoaderInfo variable) and not a container.
- Without a one-shot, systemd-boot boots the first entry, in its order (ids by version, newest first), that
  matches loader.conf's `default` glob; proxmox-boot-tool writes `default proxmox-*` (or a pinned
  `proxmox-<kver>.conf`, proxmox-kernel-helper's set_systemd_boot_default()).
"""

from __future__ import annotations

import fnmatch
import re

from ansible_collections.provision.pve_sglang.plugins.module_utils.kernel_cmdline import merge

TRIAL_ID = "provision-trial"
# systemd-boot's EFI variables (its loader interface), by name: LoaderEntryOneShot, LoaderEntrySelected, ...
LOADER_VARS = "/sys/firmware/efi/efivars/{}-4a67b082-0a4c-41cf-b6c7-440b29bb8c4f"
# The systemd-boot trial entry's file name, which is also its id (LoaderEntryOneShot, LoaderEntrySelected): it carries a
# boot counter of one try (the Boot Loader Specification's boot counting; systemd src/boot boot.c
# config_entry_parse_tries, config_entry_bump_counters). systemd-boot renames the file before it boots it (+1 -> +0-1),
# and systemd-bless-boot drops the counter once that boot is good. So a file still under this name after the reboot was
# never booted: the one-shot did not reach the loader.
SDBOOT_ENTRY = TRIAL_ID + "+1.conf"
_SDBOOT_TRIAL_FILE = re.compile(re.escape(TRIAL_ID) + r"(\+\d+(-\d+)?)?\.conf")
# in the kernel phase's state directory: a trial entry was written and not yet removed (with the line it boots)
TRIAL_RECORD = "trial.json"
# in the kernel phase's state directory: the firmware lost a one-shot that read back as armed
ONESHOT_LOST_RECORD = "oneshot-lost.json"
TRIAL_TITLE = "provision trial boot of a new kernel command line"
# the delimited block of /boot/grub/custom.cfg that is ours; everything outside it is the user's and stays
BLOCK_BEGIN = "### BEGIN provision trial boot (removed after the trial) ###"
BLOCK_END = "### END provision trial boot ###"
# what GRUB cannot write grubenv on (Debian 12 /etc/grub.d/00_header, check_writable())
GRUB_READONLY_FS = frozenset({"btrfs", "cpiofs", "newc", "odc", "romfs", "squash4", "tarfs", "zfs"})
MODES = ("auto", "required", "off")


class Unavailable(Exception):
    """No trial boot on this node; the message says why, in one line."""


class OneShotLost(Unavailable):
    """The firmware refused the one-shot, or did not keep it: found only once the entry is written."""


def efi_write_refused(rc: int, said: str) -> bool:
    """Whether bootctl failed because the EFI variable write failed (its words for it), not for another reason."""
    return rc != 0 and "EFI variable" in said


def oneshot_lost(rc: int, said: str, read_back: str | None) -> str | None:
    """Why `bootctl set-oneshot provision-trial.conf` armed nothing, from its exit code and words (a failed write of
    the variable: efi_write_refused) and the LoaderEntryOneShot value read back after it, or None where the one-shot
    is armed. Some firmware refuses or drops
    EFI variable writes, which is why Proxmox's own one-shot (proxmox-kernel-helper's `proxmox-boot-tool kernel pin
    --next-boot`) writes loader.conf instead."""
    if rc != 0:  # bootctl's words for a write efivarfs failed (src/boot/bootctl: "Failed to update EFI variable")
        said = said.strip()[-200:]
        return f"the firmware refused systemd-boot's one-shot (bootctl set-oneshot {SDBOOT_ENTRY}: {said})"
    if (read_back or "").lower() != SDBOOT_ENTRY:
        return (
            f"the firmware did not keep systemd-boot's one-shot (after bootctl set-oneshot {SDBOOT_ENTRY}, "
            f"LoaderEntryOneShot reads {read_back or 'nothing'})"
        )
    return None


def sdboot_trial_files(names: list[str]) -> list[str]:
    """The trial entry's files among an ESP's loader/entries names, under any boot-counter state."""
    return sorted(n for n in names if _SDBOOT_TRIAL_FILE.fullmatch(n.lower()))


def sdboot_trial_booted(names: list[str]) -> bool | None:
    """Whether systemd-boot booted the trial entry, from its files' names (None where there is none): the file it
    boots is renamed first, so only an entry never booted keeps its name."""
    files = sdboot_trial_files(names)
    return any(n.lower() != SDBOOT_ENTRY for n in files) if files else None


def oneshot_lost_after_boot(selected: str | None) -> str:
    """Why the trial never ran, where the loader did not boot the trial entry although it was armed and read back."""
    return (
        f"the firmware did not keep systemd-boot's one-shot through the reboot: LoaderEntryOneShot read back "
        f"{SDBOOT_ENTRY} after bootctl set-oneshot, yet the loader booted {selected or 'another entry'} and never "
        f"{SDBOOT_ENTRY} (its boot counter is untouched)"
    )


# ------------------------------------------------------------------ the decision
def decision(trial_boot: str, wanted: bool, problem: str | None) -> str:
    """What this run does: `trial` (boot the new line once first), `warn` (no trial possible: say why and write
    the default as before), `refuse` (required, yet not possible: write nothing) or `none` (no trial wanted:
    kernel_cmdline_trial_boot off, or this run does not both change the boot configuration and reboot)."""
    if trial_boot not in MODES:
        raise ValueError(f"trial_boot must be one of {', '.join(MODES)}, not {trial_boot!r}")
    if trial_boot == "off" or not wanted:
        return "none"
    if problem is None:
        return "trial"
    return "refuse" if trial_boot == "required" else "warn"


# ------------------------------------------------------------------ GRUB
def grub_cfg_problem(cfg: str) -> str | None:
    """Why this grub.cfg cannot boot a one-shot entry from custom.cfg, or None."""
    if not re.search(r"^\s*source\s+\S*custom\.cfg\s*$", cfg, re.M):
        return "/boot/grub/grub.cfg does not source custom.cfg (no /etc/grub.d/41_custom)"
    if not re.search(r'^\s*set default="\$\{next_entry\}"\s*$', cfg, re.M) or "save_env next_entry" not in cfg:
        return "/boot/grub/grub.cfg does not take a one-shot next_entry from grubenv (no /etc/grub.d/00_header)"
    return None


def grub_default_problem(grub_default: str) -> str | None:
    """Why GRUB_DEFAULT (as update-grub sees it) rules out a trial, or None: the trial copies the first entry."""
    if grub_default.strip() in ("", "0"):
        return None
    return f"GRUB_DEFAULT is {grub_default.strip()!r}, not 0: the entry the node boots by default is not the first"


def grub_env_problem(abstraction: str, fs: str) -> str | None:
    """Why GRUB could not clear next_entry in /boot/grub/grubenv, from grub-probe's answers, or None."""
    layers = abstraction.split()
    if layers:
        return (
            f"/boot/grub is on {' '.join(layers)} (grub-probe --target=abstraction), where GRUB cannot write "
            "grubenv to clear a one-shot entry"
        )
    if fs.strip() in GRUB_READONLY_FS:
        return f"/boot/grub is on {fs.strip()}, where GRUB cannot write grubenv to clear a one-shot entry"
    return None


def _opens(line: str) -> bool:
    return line.rstrip().endswith("{")


def grub_default_entry(cfg: str) -> list[str]:
    """The lines of the first top-level `menuentry` of a grub.cfg (what GRUB_DEFAULT=0 boots), its closing `}`
    included. grub-mkconfig's scripts open a block with a line ending in `{` and close it with a line that starts
    with `}`."""
    lines, depth, start = cfg.split("\n"), 0, None
    for i, line in enumerate(lines):
        word = line.split(None, 1)[0] if line.strip() else ""
        if depth == 0 and word == "menuentry" and _opens(line):
            start = i
        if _opens(line):
            depth += 1
        elif line.strip().startswith("}"):
            depth -= 1
            if depth == 0 and start is not None:
                return lines[start : i + 1]
    raise Unavailable("/boot/grub/grub.cfg has no top-level menuentry to copy")


def grub_trial_entry(cfg: str, add: list[str], remove: list[str]) -> tuple[str, str]:
    """(the trial menu entry, its kernel arguments): a copy of the default entry with our title and id, and the
    arguments of its `linux` line merged as the module merges the configured line, each kept as grub.cfg writes it
    (GRUB script words: its quoting stays, an added argument is written as `written()` gives it)."""
    entry = grub_default_entry(cfg)
    out, line = [f"menuentry '{TRIAL_TITLE}' --id {TRIAL_ID} {{"], None
    for text in entry[1:]:
        m = re.match(r"(\s*linux(?:efi|16)?\s+)(\S+)(.*)$", text)
        if m and line is None:
            line = merge(m.group(3), add, remove)["line"]
            text = f"{m.group(1)}{m.group(2)} {line}".rstrip()
        out.append(text)
    if line is None:
        raise Unavailable("the default entry of /boot/grub/grub.cfg has no linux line")
    return "\n".join(out) + "\n", line


def custom_cfg_with(existing: str | None, entry: str) -> str:
    """custom.cfg with our block holding entry: the user's own text kept, any earlier block of ours replaced."""
    kept = custom_cfg_without(existing) or ""
    if kept and not kept.endswith("\n"):
        kept += "\n"
    return f"{kept}{BLOCK_BEGIN}\n{entry}{BLOCK_END}\n"


def custom_cfg_without(existing: str | None) -> str | None:
    """custom.cfg with our block taken out (everything else as it was); None when nothing else is left."""
    if existing is None:
        return None
    pattern = re.compile(rf"^{re.escape(BLOCK_BEGIN)}\n.*?^{re.escape(BLOCK_END)}\n?", re.M | re.S)
    kept = pattern.sub("", existing)
    return kept if kept.strip() else None


def has_block(existing: str | None) -> bool:
    return existing is not None and BLOCK_BEGIN in existing


def grubenv_next_entry(listing: str) -> str | None:
    """next_entry from `grub-editenv FILE list`."""
    m = re.search(r"^next_entry=(.*)$", listing, re.M)
    return m.group(1) if m else None


# ------------------------------------------------------------------ systemd-boot
def _version_key(name: str) -> list:
    """An order like systemd's strverscmp_improved() for entry ids: digit runs as numbers."""
    return [(0, int(p), "") if p.isdigit() else (1, 0, p) for p in re.findall(r"\d+|\D+", name)]


def loader_default(loader_conf: str | None) -> str | None:
    """The `default` glob of a loader.conf, or None."""
    for line in (loader_conf or "").split("\n"):
        parts = line.split(None, 1)
        if len(parts) == 2 and parts[0] == "default":
            return parts[1].strip()
    return None


def sdboot_default_entry(names: list[str], default_glob: str | None) -> str | None:
    """The entry file systemd-boot boots without a one-shot: of proxmox-boot-tool's entries (proxmox-*.conf), the
    newest by version that matches loader.conf's `default` glob (all of them when it has none); compared in lower
    case, as systemd-boot does."""
    ours = sorted(
        (n for n in names if fnmatch.fnmatchcase(n.lower(), "proxmox-*.conf")), key=_version_key, reverse=True
    )
    pattern = (default_glob or "proxmox-*").lower()
    for name in ours:
        stem = name.lower()
        if fnmatch.fnmatchcase(stem, pattern) or fnmatch.fnmatchcase(stem.removesuffix(".conf"), pattern):
            return name
    return None


def sdboot_trial_entry(entry: str, options: str) -> str:
    """The trial entry: the default entry's lines with our title and its options replaced by the new line."""
    out, seen = [], set()
    for line in entry.split("\n"):
        key = line.split(None, 1)[0] if line.strip() else ""
        if key == "title":
            line, seen = f"title    {TRIAL_TITLE}", seen | {"title"}
        elif key == "options":
            if "options" in seen:
                continue  # systemd-boot joins several options lines: ours is the whole line
            line, seen = f"options  {options}", seen | {"options"}
        out.append(line)
    out = [ln for ln in out if ln.strip()]
    if "options" not in seen:
        out.append(f"options  {options}")
    if "title" not in seen:
        out.insert(0, f"title    {TRIAL_TITLE}")
    return "\n".join(out) + "\n"


def efi_string(raw: bytes) -> str:
    """A UTF-16 string EFI variable as efivarfs gives it (4 bytes of attributes first), without its NUL."""
    return raw[4:].decode("utf-16-le", errors="replace").split("\0", 1)[0]
