"""The node's bootloader: one class per kind, each with the same interface, for a module that runs on the node.

- `plan(add, remove)`: read the configured line and plan its merge (files and their new text), writing nothing;
- `write(changes)`: the planned files, each replaced atomically;
- `regenerate`: the command that writes the boot configuration from them (the role runs it);
- `generated_lines()`: the lines that configuration boots, to prove the merge reached it;
- `next_release()`: the kernel release the node boots next;
- `armed()`: a one-shot armed for the next boot, or None;
- the trial boot: `trial_problem`, `prepare_trial`, `remove_trial` and `trial_never_ran`.

`Grub` is GRUB from /boot (/etc/default/grub, update-grub, grubenv's next_entry); `SystemdBoot` is systemd-boot
through proxmox-boot-tool (/etc/kernel/cmdline, `proxmox-boot-tool refresh`, the ESPs it lists, LoaderEntryOneShot).
`for_node` picks one by name. The regeneration commands are the PVE admin guide's ("Editing the Kernel
Commandline", sysboot_edit_kernel_cmdline). The pure rules are in kernel_cmdline.py (the line), boot_trial.py (the
trial boot) and boot_kernel.py (the next kernel); this file reads and writes the node for them.
"""

from __future__ import annotations

import contextlib
import datetime
import glob
import json
import os
import tempfile

from ansible_collections.provision.pve_sglang.plugins.module_utils import boot_trial
from ansible_collections.provision.pve_sglang.plugins.module_utils.boot_kernel import detect_bootloader, on_this_node
from ansible_collections.provision.pve_sglang.plugins.module_utils.kernel_cmdline import (
    assigned_word,
    assignments,
    literal_value,
    merge,
    quote,
    set_assignment,
    split,
)

GRUB_MAIN = "/etc/default/grub"
GRUB_SNIPPETS = "/etc/default/grub.d"
GRUB_OVERRIDE = "/etc/default/grub.d/zz-provision.cfg"
GRUB_CFG = "/boot/grub/grub.cfg"
GRUB_CUSTOM = "/boot/grub/custom.cfg"
GRUB_DIR = "/boot/grub"
GRUBENV = "/boot/grub/grubenv"
KERNEL_CMDLINE = "/etc/kernel/cmdline"
PBT_UUIDS = "/etc/kernel/proxmox-boot-uuids"
PBT_PIN = "/etc/kernel/proxmox-boot-pin"
DEFAULT_VAR = "GRUB_CMDLINE_LINUX_DEFAULT"
LINUX_VAR = "GRUB_CMDLINE_LINUX"
EFI_DIR = "/sys/firmware/efi"
# systemd-boot's variables (the Boot Loader Interface): efivarfs names them <name>-<vendor GUID>
LOADER_VARS = boot_trial.LOADER_VARS


# ------------------------------------------------------------------ files
def read_file(path):
    with open(path) as f:
        return f.read()


def read_if_exists(path, missing=None):
    """The file's text, or `missing` when there is no such file."""
    return read_file(path) if os.path.exists(path) else missing


def atomic_write(path, content):
    """Replace a file by a temporary one renamed over it, keeping its mode (0644 for a new file)."""
    directory = os.path.dirname(path)
    mode = os.stat(path).st_mode & 0o7777 if os.path.exists(path) else 0o644
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=".provision-")
    with os.fdopen(fd, "w") as f:
        f.write(content)
    os.chmod(tmp, mode)
    os.replace(tmp, path)


def write_if_different(path, content):
    if read_if_exists(path) != content:
        atomic_write(path, content)


def replace_file(path, content):
    """Write a file on a FAT file system: a temporary file renamed over it (FAT has no modes to keep), synced."""
    tmp = f"{path}.provision-tmp"
    with open(tmp, "w") as f:
        f.write(content)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def efi_variable(name):
    """A systemd-boot EFI variable's string value, or None where it is not set (or the node has no EFI)."""
    try:
        with open(LOADER_VARS.format(name), "rb") as f:
            return boot_trial.efi_string(f.read())
    except OSError:
        return None


# ------------------------------------------------------------------ errors
class TrialError(Exception):
    """Preparing or removing the trial boot failed; the message says what."""


class EspError(Exception):
    """An ESP that cannot be read or written; the message names it."""


# ------------------------------------------------------------------ the interface
class Bootloader:
    """What every bootloader class answers; `module` is the AnsibleModule that runs on the node."""

    name = ""
    regenerate: tuple[str, ...] = ()
    generated_from = ""

    def __init__(self, module):
        self.module = module

    def plan(self, add, remove):
        """(changes {path: new text}, line before, merge result as kernel_cmdline.merge gives it, notes)."""
        raise NotImplementedError

    def configured_line(self):
        return self.plan([], [])[2]["line"]

    def write(self, changes):
        for path, new in changes.items():
            atomic_write(path, new)

    def generated_lines(self):
        """The kernel command lines the generated boot configuration boots, as (source, line) pairs."""
        raise NotImplementedError

    def next_release(self):
        """The kernel release the node boots next (module_utils/boot_kernel.py)."""
        return on_this_node(self.name, GRUB_CFG, PBT_PIN)

    def armed(self):
        """The one-shot armed for the next boot (what the bootloader boots once), or None."""
        raise NotImplementedError

    def trial_problem(self, add, remove):
        """Why this node cannot boot a one-shot entry, or None."""
        raise NotImplementedError

    def prepare_trial(self, add, remove, line):
        """Write the trial entry and arm its one-shot: {entry, line}. Raises TrialError, EspError,
        boot_trial.Unavailable (boot_trial.OneShotLost where the firmware lost the one-shot) or OSError."""
        raise NotImplementedError

    def remove_trial(self, dry_run, recorded):
        """Remove a trial entry and a one-shot still naming it; what was (or would be) removed. Sets `booted`: whether
        the loader booted the entry, where a trial was `recorded` (else None)."""
        raise NotImplementedError

    def trial_never_ran(self, backup_dir, check_mode):
        """After remove_trial found the entry never booted: why, in one line."""
        raise NotImplementedError


def for_node(module, name):
    """The class for bootloader `name` (a key of CLASSES), reading and writing the node `module` runs on."""
    return CLASSES[name](module)


def for_params(module):
    """(the class, its name, how it was told) for a module's `bootloader` parameter: auto detects it as
    boot_kernel.detect_bootloader does, else the inventory's word."""
    name, how = module.params["bootloader"], "set by the inventory"
    if name == "auto":
        name, how = detect_bootloader(module)
    return for_node(module, name), name, how


# ------------------------------------------------------------------ GRUB
def grub_files():
    return [GRUB_MAIN, *sorted(glob.glob(os.path.join(GRUB_SNIPPETS, "*.cfg")))]


def last_assignment(var, read=read_file):
    """(file, where, value word) of the last assignment of var across the grub files, as `read` gives them (where:
    as module_utils.kernel_cmdline.assignments gives it; the word None when it goes on past its line), or None."""
    found = None
    for path in grub_files():
        try:
            text = read(path)
        except OSError:
            continue
        for where in assignments(text, var):
            found = (path, where, assigned_word(text, where))
    return found


def grub_override(existing, overrides):
    """GRUB_OVERRIDE's new text: its lines that set none of `overrides` ({var: value}) kept, then each var set."""
    lines = [ln for ln in existing.split("\n") if ln and not any(assignments(ln, v) for v in overrides)]
    if not lines:
        lines = ["# Written by provision (kernel_cmdline): the merged kernel arguments, applied last."]
    lines += [f"{var}={quote(value)}" for var, value in overrides.items()]
    return "\n".join(lines) + "\n"


class Grub(Bootloader):
    """GRUB from /boot: the line in /etc/default/grub (and grub.d), update-grub, a one-shot through grub-reboot."""

    name = "grub"
    regenerate = ("update-grub",)
    generated_from = GRUB_CFG

    def value(self, var):
        """The value update-grub will see: source the main file and the snippets in order, as it does."""
        script = '. "$1"; shift; for f in "$@"; do . "$f"; done; printf %s "$' + var + '"'
        rc, out, err = self.module.run_command(["/bin/sh", "-c", script, "sh", *grub_files()])
        if rc != 0:
            self.module.fail_json(msg=f"cannot evaluate {var} from {', '.join(grub_files())}: {err.strip()}")
        return out

    def plan(self, add, remove):
        before = self.value(DEFAULT_VAR)
        result = merge(before, add, remove)
        merged = {DEFAULT_VAR: result, LINUX_VAR: merge(self.value(LINUX_VAR), [], remove)}
        changes, notes, overrides, contents = {}, [], {}, {}

        def read(path):  # a file as edited so far: a second edit of the same line sees the first
            if path not in contents:
                contents[path] = read_file(path)
            return contents[path]

        for var, res in ((v, r) for v, r in merged.items() if r["changed"]):
            where = last_assignment(var, read)
            path, at, word = where or (None, None, None)
            if word is not None and literal_value(word) is not None and path != GRUB_OVERRIDE:
                # only the value's shell word changes: other statements and a comment on its line stay
                contents[path] = changes[path] = set_assignment(read(path), at, res["line"])
                notes.append(f"{var} set in {path}")
            else:
                overrides[var] = res["line"]
                notes.append(
                    f"{var} is not a plain literal where it is last set ({where[0] if where else 'nowhere'}); "
                    f"the merged value goes to {GRUB_OVERRIDE}"
                )
        if overrides:
            existing = read(GRUB_OVERRIDE) if os.path.exists(GRUB_OVERRIDE) else ""
            changes[GRUB_OVERRIDE] = grub_override(existing, overrides)
        return changes, before, result, notes

    def generated_lines(self):
        for line in (read_if_exists(GRUB_CFG) or "").split("\n"):
            stripped = line.strip()
            if stripped.startswith("linux") and ("vmlinuz" in stripped or "/boot/" in stripped):
                return [(GRUB_CFG, " ".join(stripped.split()[2:]))]  # the default (first) entry is what boots
        return []

    def grubenv_next_entry(self):
        if not (os.path.exists(GRUBENV) and self.module.get_bin_path("grub-editenv")):
            return None
        rc, listing, _err = self.module.run_command(["grub-editenv", GRUBENV, "list"])
        return boot_trial.grubenv_next_entry(listing) if rc == 0 else None

    def armed(self):
        entry = self.grubenv_next_entry()
        return f"{GRUBENV}: next_entry={entry}" if entry else None

    def run(self, argv):
        rc, out, err = self.module.run_command(argv)
        if rc != 0:
            raise TrialError(f"{' '.join(argv)} failed: {(err or out).strip()[-300:]}")
        return out

    def trial_problem(self, add, remove):
        cfg = read_if_exists(GRUB_CFG)
        if cfg is None:
            return f"{GRUB_CFG} does not exist"
        if os.path.exists(PBT_UUIDS):
            return (
                f"GRUB boots from the ESPs proxmox-boot-tool manages ({PBT_UUIDS}), whose grub.cfg and grubenv "
                f"are not {GRUB_DIR}'s"
            )
        tools = ("grub-probe", "grub-reboot", "grub-editenv")
        missing_tool = next((t for t in tools if not self.module.get_bin_path(t)), None)
        if missing_tool:
            return f"{missing_tool} is not installed"
        found = boot_trial.grub_cfg_problem(cfg) or boot_trial.grub_default_problem(self.value("GRUB_DEFAULT"))
        if found:
            return found
        try:
            answers = [self.run(["grub-probe", f"--target={t}", GRUB_DIR]) for t in ("abstraction", "fs")]
            found = boot_trial.grub_env_problem(*answers)
            boot_trial.grub_trial_entry(cfg, add, remove)
        except (TrialError, boot_trial.Unavailable) as e:
            return str(e)
        return found

    def prepare_trial(self, add, remove, line):
        entry, trial_line = boot_trial.grub_trial_entry(read_file(GRUB_CFG), add, remove)
        atomic_write(GRUB_CUSTOM, boot_trial.custom_cfg_with(read_if_exists(GRUB_CUSTOM), entry))
        self.run(["grub-reboot", boot_trial.TRIAL_ID])
        return dict(
            entry=f"{GRUB_CUSTOM} (menuentry --id {boot_trial.TRIAL_ID}, once through grub-reboot)", line=trial_line
        )

    def remove_trial(self, dry_run, recorded):
        """Take out our custom.cfg block and a next_entry still naming it. GRUB clears next_entry as it boots it."""
        removed = []
        self.booted = True if recorded else None
        existing = read_if_exists(GRUB_CUSTOM)
        if boot_trial.has_block(existing):
            removed.append(f"{GRUB_CUSTOM}: the trial menu entry")
            if not dry_run:
                kept = boot_trial.custom_cfg_without(existing)
                if kept is None:
                    os.unlink(GRUB_CUSTOM)  # the file was ours alone
                else:
                    atomic_write(GRUB_CUSTOM, kept)
        if self.grubenv_next_entry() == boot_trial.TRIAL_ID:
            removed.append(f"{GRUBENV}: next_entry={boot_trial.TRIAL_ID}")
            self.booted = False if recorded else None
            if not dry_run:
                self.run(["grub-editenv", GRUBENV, "unset", "next_entry"])
        return removed

    def trial_never_ran(self, backup_dir, check_mode):
        return (
            f"GRUB did not take the one-shot: {GRUBENV} still names next_entry={boot_trial.TRIAL_ID} after the reboot"
        )


# ------------------------------------------------------------------ systemd-boot through proxmox-boot-tool
def esp_uuids():
    """The ESPs proxmox-boot-tool keeps in sync, by file system UUID."""
    text = read_if_exists(PBT_UUIDS, "")
    return [ln.split()[0] for ln in text.split("\n") if ln.strip()]


@contextlib.contextmanager
def mounted_esp(module, uuid, writable=False):
    """The ESP mounted on a directory of its own for the block (ESPs are not mounted on a PVE node)."""
    device = "/dev/disk/by-uuid/" + uuid
    if not os.path.exists(device):
        raise EspError(f"ESP {device} listed in {PBT_UUIDS} does not exist")
    mnt = tempfile.mkdtemp(prefix="provision-esp-")
    rc, _out, err = module.run_command(["mount", "-o", "rw" if writable else "ro", device, mnt])
    if rc != 0:
        os.rmdir(mnt)
        raise EspError(f"cannot mount ESP {device}: {err.strip()}")
    try:
        yield mnt
    finally:
        rc, _out, err = module.run_command(["umount", mnt])
        if rc != 0:  # a busy ESP: say where it stays mounted rather than fail on the directory's removal
            raise EspError(f"cannot unmount ESP {device} from {mnt}: {err.strip()}; it stays mounted there")
        os.rmdir(mnt)


class SystemdBoot(Bootloader):
    """systemd-boot through proxmox-boot-tool: the first line of /etc/kernel/cmdline, copied to every ESP's loader
    entries by `proxmox-boot-tool refresh`; a one-shot through `bootctl set-oneshot` (LoaderEntryOneShot)."""

    name = "systemd-boot"
    regenerate = ("proxmox-boot-tool", "refresh")
    generated_from = "loader/entries/proxmox-*.conf on the ESPs"

    def plan(self, add, remove):
        first, rest, content = self.first_line()
        notes = []
        if content is None:
            notes.append(f"{KERNEL_CMDLINE} did not exist: started from /proc/cmdline, as proxmox-boot-tool does")
        result = merge(first, add, remove)
        if not any(a.startswith("root=") for a in split(result["line"])):
            self.module.fail_json(
                msg=f"{KERNEL_CMDLINE}: the first line has no root= argument; proxmox-boot-tool refresh would refuse it"
            )
        changes = {KERNEL_CMDLINE: result["line"] + "\n" + rest} if result["changed"] or content is None else {}
        return changes, first, result, notes

    def generated_lines(self):
        """Every proxmox-*.conf entry's options on every ESP; on each ESP the entry systemd-boot boots by default
        first (loader.conf's default)."""
        found = []
        for uuid in esp_uuids():
            with mounted_esp(self.module, uuid) as mnt:
                entries = os.path.join(mnt, "loader", "entries")
                names = [os.path.basename(e) for e in glob.glob(os.path.join(entries, "proxmox-*.conf"))]
                conf = read_if_exists(os.path.join(mnt, "loader", "loader.conf"))
                default = boot_trial.sdboot_default_entry(names, boot_trial.loader_default(conf))
                for name in sorted(names, key=lambda n: (n != default, n)):
                    with open(os.path.join(entries, name)) as f:
                        options = [ln.split(None, 1)[1].strip() for ln in f if ln.startswith("options")]
                    found += [(f"{uuid}:{name}", o) for o in options]
        return found

    def configured_line(self):
        """The first line of /etc/kernel/cmdline as it is, without plan's check of root=."""
        return self.first_line()[0]

    @staticmethod
    def first_line():
        """(the first line, the rest of the file, the file's text or None where there is none): with no file, the
        running line without the loader's own arguments, as proxmox-boot-tool starts from it."""
        content = read_if_exists(KERNEL_CMDLINE)
        if content is None:
            with open("/proc/cmdline") as f:
                first = " ".join(a for a in split(f.read()) if not a.startswith(("initrd=", "BOOT_IMAGE=")))
            return first, "", None
        first, _sep, rest = content.partition("\n")
        return first, rest, content

    def armed(self):
        oneshot = efi_variable("LoaderEntryOneShot")
        return f"EFI variable LoaderEntryOneShot={oneshot}" if oneshot else None

    def trial_problem(self, add, remove):
        if not os.path.isdir(EFI_DIR):
            return "the node did not boot with UEFI"
        if not os.path.exists(LOADER_VARS.format("LoaderInfo")):
            return "systemd-boot did not boot this node (no LoaderInfo EFI variable)"
        if not self.module.get_bin_path("bootctl"):
            return "bootctl is not installed (Debian package systemd-boot-tools on PVE 9, systemd-boot on PVE 8)"
        if not esp_uuids():
            return f"{PBT_UUIDS} lists no ESP"
        return self.lost_before()

    def lost_before(self):
        """Why the firmware is not trusted with a one-shot: our record that it lost one at a trial boot, or None."""
        path = os.path.join(self.module.params["backup_dir"], boot_trial.ONESHOT_LOST_RECORD)
        text = read_if_exists(path)
        if text is None:
            return None
        try:
            record = json.loads(text)
        except ValueError:
            record = {}
        reason = record.get("reason", "the firmware lost the one-shot of an earlier trial boot")
        at = record.get("at", "an earlier run")
        return f"{reason} (trial boot of {at}; remove {path} once the firmware keeps EFI variables)"

    def prepare_trial(self, add, remove, line):
        written = [self.write_trial_entry(uuid, line) for uuid in esp_uuids()]
        rc, out, err = self.module.run_command(["bootctl", "set-oneshot", boot_trial.SDBOOT_ENTRY])
        if rc != 0 and not boot_trial.efi_write_refused(rc, err or out):
            raise TrialError(f"bootctl set-oneshot {boot_trial.SDBOOT_ENTRY} failed: {(err or out).strip()[-300:]}")
        lost = boot_trial.oneshot_lost(rc, err or out, efi_variable("LoaderEntryOneShot"))
        if lost:
            raise boot_trial.OneShotLost(lost)
        return dict(entry="; ".join(written) + ", once through bootctl set-oneshot", line=line)

    def write_trial_entry(self, uuid, line):
        """A copy of the entry systemd-boot boots by default on this ESP, with `line` as its options."""
        with mounted_esp(self.module, uuid, writable=True) as esp:
            entries = os.path.join(esp, "loader", "entries")
            names = os.listdir(entries) if os.path.isdir(entries) else []
            default = boot_trial.sdboot_default_entry(
                names, boot_trial.loader_default(read_if_exists(os.path.join(esp, "loader", "loader.conf")))
            )
            if default is None:
                raise TrialError(f"ESP {uuid}: no proxmox-*.conf loader entry matches loader.conf's default")
            text = boot_trial.sdboot_trial_entry(read_file(os.path.join(entries, default)), line)
            replace_file(os.path.join(entries, boot_trial.SDBOOT_ENTRY), text)
        return f"{uuid}:loader/entries/{boot_trial.SDBOOT_ENTRY} (a copy of {default})"

    def remove_trial(self, dry_run, recorded):
        """The entry from every ESP (mounted only when our record says one was written), under whatever name its boot
        counter has; systemd-boot renames the file it boots, so a file under its first name was never booted."""
        removed, seen = [], []
        self.oneshot_left = (efi_variable("LoaderEntryOneShot") or "").lower() == boot_trial.SDBOOT_ENTRY
        for uuid in esp_uuids() if recorded or self.oneshot_left else []:
            try:
                with mounted_esp(self.module, uuid, writable=not dry_run) as esp:
                    entries = os.path.join(esp, "loader", "entries")
                    names = boot_trial.sdboot_trial_files(os.listdir(entries) if os.path.isdir(entries) else [])
                    seen += names
                    removed += [f"{uuid}:loader/entries/{name}" for name in names]
                    for name in names if not dry_run else []:
                        os.unlink(os.path.join(entries, name))
            except EspError as e:
                raise TrialError(str(e)) from e
        self.booted = boot_trial.sdboot_trial_booted(seen) if recorded else None
        if self.oneshot_left:
            removed.append("EFI variable LoaderEntryOneShot")
            if not dry_run:
                rc, out, err = self.module.run_command(["bootctl", "set-oneshot", ""])
                if rc != 0:
                    raise TrialError(f"bootctl set-oneshot '' failed: {(err or out).strip()[-300:]}")
        return removed

    def trial_never_ran(self, backup_dir, check_mode):
        """The loader never read the one-shot, or the firmware lost it: the latter is recorded for later runs."""
        selected = efi_variable("LoaderEntrySelected")
        if self.oneshot_left:  # the firmware kept the variable; the loader did not read it
            return (
                f"systemd-boot did not take the one-shot: LoaderEntryOneShot still named {boot_trial.SDBOOT_ENTRY} "
                f"after the reboot, which booted {selected or 'without systemd-boot'}"
            )
        reason = boot_trial.oneshot_lost_after_boot(selected)
        path = os.path.join(backup_dir, boot_trial.ONESHOT_LOST_RECORD)
        if not check_mode:
            stamp = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
            atomic_write(path, json.dumps({"reason": reason, "at": stamp}) + "\n")
        return (
            f"{reason}; recorded in {path}: until it is removed, runs boot no trial on this node (auto makes the line "
            "the default and reboots, monitored; required refuses)"
        )


# ------------------------------------------------------------------ the registry
# a new bootloader is a class here and its entry below; its name then joins the `bootloader` choices of the modules
# and of the kernel_cmdline role's argument spec, and boot_kernel.detect_bootloader where `auto` should find it
# (tests/unit/plugins/module_utils/test_bootloaders.py drives a toy third one through kernel_cmdline's configure,
# verify_generated and restore)
CLASSES = {"grub": Grub, "systemd-boot": SystemdBoot}
NAMES = tuple(CLASSES)
