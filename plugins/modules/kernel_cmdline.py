#!/usr/bin/python
"""Ansible module: merge kernel arguments into the bootloader's configuration, safely."""

from __future__ import annotations

DOCUMENTATION = r"""
module: kernel_cmdline
short_description: Merge kernel command line arguments for GRUB or systemd-boot (proxmox-boot-tool)
author: provision maintainers (!UNKNOWN)
description:
  - C(configure) merges I(add) and I(remove) into the configured command line, never overwriting it. On GRUB
    hosts it edits C(GRUB_CMDLINE_LINUX_DEFAULT) where its effective value is defined (C(/etc/default/grub) or
    the last C(/etc/default/grub.d/*.cfg) snippet that sets it), or, when that definition is not a plain
    literal, writes the merged value to C(/etc/default/grub.d/zz-provision.cfg). Arguments to remove are also
    removed from C(GRUB_CMDLINE_LINUX). On systemd-boot hosts it edits the first line of C(/etc/kernel/cmdline).
    Every changed file is backed up first.
  - C(verify_generated) checks that the generated boot configuration (C(/boot/grub/grub.cfg), or the loader
    entries on every ESP listed in C(/etc/kernel/proxmox-boot-uuids)) carries the wanted arguments.
  - C(restore) puts back the files of the latest backup. C(running) compares C(/proc/cmdline) with the wanted
    arguments. C(findings) reads the IOMMU default domain, the SEV-SNP proof and the IO_PAGE_FAULT count
    (plugins/module_utils/kernel_findings.py and sev_snp.py, which the GPU diagnostic reads them by too).
  - C(mark_changed) records that the boot configuration changed (C(marker_file), JSON with C(changed_at) in UTC
    and the new C(line)), so that verdicts taken before the change (the GPU diagnostic's) can be refused.
  - A trial boot (I(trial_boot)) boots the new line once before it becomes the default
    (plugins/module_utils/boot_trial.py has the rules and their sources). When C(configure) would change the
    boot configuration and the running kernel lacks the wanted arguments (a reboot is due, I(reboot=auto)), it
    writes no default file but a one-shot entry instead. On GRUB, a copy of the first menu entry of
    C(/boot/grub/grub.cfg) with the merged arguments, in a delimited block of C(/boot/grub/custom.cfg), and
    C(grub-reboot provision-trial). On systemd-boot, C(loader/entries/provision-trial+1.conf) on every ESP (a copy
    of the entry systemd-boot boots by default, its options the merged first line of C(/etc/kernel/cmdline)),
    and C(bootctl set-oneshot provision-trial+1.conf). The next C(configure) call (after the trial boot, the commit,
    which writes the default files as without a trial) and C(trial_remove) remove it, and the C(trial.json)
    record in I(backup_dir) that says it was written.
options:
  action:
    type: str
    choices: [configure, verify_generated, restore, running, findings, mark_changed, trial_remove]
    default: configure
    description:
      - configure merges the line and plans or prepares its boot; verify_generated checks the generated boot
        files; restore puts back the last backup; running compares the running kernel with the wanted arguments;
        findings records this boot's IOMMU and SEV-SNP findings; mark_changed records when the line changed;
        trial_remove removes a trial entry.
  bootloader:
    type: str
    choices: [auto, grub, systemd-boot]
    default: auto
    description: The node's boot loader; auto tells GRUB from systemd-boot through proxmox-boot-tool.
  add:
    type: list
    elements: str
    default: []
    description: Arguments the line must have (a same-key argument is replaced in place).
  remove:
    type: list
    elements: str
    default: []
    description: Arguments to remove; C(key=value) removes that exact argument, C(key) every argument with that key.
  backup_dir:
    type: path
    description: Where the backups and C(wanted.json) are kept (the role's is C(provision_state_dir)/kernel-cmdline);
      required with action=configure and action=restore.
  findings_file:
    type: path
    description:
      - with action=findings, where to record them (kept up to date, not reported as a change); with
        action=configure, the same, when the running kernel already has the wanted arguments
  snp_required:
    type: bool
    default: false
    description:
      - SEV-SNP must be proven on this node. With action=configure, a node that would need a reboot into the
        new line but cannot do SEV-SNP (no C(sev_snp) CPU flag, or a kernel older than 6.11 to boot) fails before
        anything is written. Recorded in wanted.json for C(provision verify).
  trial_boot:
    type: str
    choices: [auto, required, "off"]
    default: "off"
    description:
      - with action=configure, boot a changed line once before it becomes the default. C(auto) where the
        bootloader can (else C(trial) says why not, and the default files are written as with C(off)),
        C(required) writes nothing where it cannot (C(trial.mode) is C(refuse)).
  after_trial:
    type: bool
    default: false
    description:
      - with action=trial_remove, the call follows a trial boot that did not come up on the new line. It then says
        whether the bootloader never booted the trial entry (C(trial_never_ran)), and on systemd-boot records the
        firmware's loss of the one-shot in I(backup_dir).
  reboot:
    type: str
    choices: [auto, never]
    default: auto
    description: with action=configure, whether the caller reboots a node that needs it (C(never) means no trial).
  marker_file:
    type: path
    description: with action=mark_changed, the file to write
  line:
    type: str
    description: with action=mark_changed, the new kernel command line
extends_documentation_fragment:
  - provision.pve_sglang.attributes
attributes:
  check_mode: {support: full}
  diff_mode: {support: full}
"""

EXAMPLES = r"""
- name: Merge SEV-SNP arguments
  kernel_cmdline:
    add: [kvm_amd.sev=1, iommu=nopt]
    remove: [iommu=pt]
"""

RETURN = r"""
bootloader: {description: "grub or systemd-boot, and how it was detected", type: str, returned: always}
line: {description: the configured (effective) command line after the change, type: str, returned: configure}
previous: {description: the configured command line before, type: str, returned: configure}
files: {description: files changed, type: list, returned: configure}
running:
  description: the running kernel against the wanted arguments (as action=running)
  type: dict
  returned: configure
findings:
  description: this boot's findings (as action=findings)
  type: dict
  returned: configure when no reboot is needed
snp_before_reboot:
  description: SEV-SNP prerequisites missing for the next boot (empty when none or not required)
  type: list
  returned: configure
trial:
  description:
    - the trial boot decision, C(mode) one of C(trial) (written; C(entry) says where, C(line) the trial's
      arguments), C(warn) or C(refuse) (not possible; C(reason) says why), C(none) (not wanted)
    - a systemd-boot one-shot that the firmware refuses, or does not keep (read back after C(bootctl set-oneshot)),
      turns C(trial) into C(warn) or C(refuse) once the entry is written; the entry is removed again
  type: dict
  returned: configure
trial_removed:
  description: what of a trial boot entry was removed (in check mode, would be)
  type: list
  returned: configure, trial_remove
trial_never_ran:
  description:
    - with I(after_trial), why the bootloader never booted the trial entry (GRUB left C(next_entry) set; systemd-boot
      left the entry's boot counter untouched although C(LoaderEntryOneShot) read back as armed), else null
    - on systemd-boot this is recorded in I(backup_dir) as C(oneshot-lost.json), and later runs boot no trial there
      (C(auto) warns and reboots monitored, C(required) refuses) until that file is removed
  type: str
  returned: trial_remove
loader_entry_selected:
  description:
    - the systemd-boot entry this boot came from (EFI variable LoaderEntrySelected), or null; action=configure
      returns it inside C(running)
  type: str
  returned: running, findings
backup: {description: directory holding the originals, type: str, returned: when changed}
"""

import contextlib
import datetime
import glob
import json
import os
import shutil
import tempfile

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.provision.pve_sglang.plugins.module_utils import boot_trial, kernel_findings
from ansible_collections.provision.pve_sglang.plugins.module_utils.boot_kernel import (
    detect_bootloader,
    on_this_node,
)
from ansible_collections.provision.pve_sglang.plugins.module_utils.kernel_cmdline import (
    assigned_word,
    assignments,
    canonical,
    literal_value,
    merge,
    missing,
    quote,
    set_assignment,
    split,
)
from ansible_collections.provision.pve_sglang.plugins.module_utils.rendered_values import value_problems
from ansible_collections.provision.pve_sglang.plugins.module_utils.sev_snp import (
    before_reboot,
    node_proof,
)

GRUB_MAIN = "/etc/default/grub"
GRUB_SNIPPETS = "/etc/default/grub.d"
GRUB_OVERRIDE = "/etc/default/grub.d/zz-provision.cfg"
GRUB_CFG = "/boot/grub/grub.cfg"
KERNEL_CMDLINE = "/etc/kernel/cmdline"
PBT_UUIDS = "/etc/kernel/proxmox-boot-uuids"
PBT_PIN = "/etc/kernel/proxmox-boot-pin"
DEFAULT_VAR = "GRUB_CMDLINE_LINUX_DEFAULT"
LINUX_VAR = "GRUB_CMDLINE_LINUX"
GRUB_CUSTOM = "/boot/grub/custom.cfg"
GRUB_DIR = "/boot/grub"
GRUBENV = "/boot/grub/grubenv"
EFI_DIR = "/sys/firmware/efi"
# systemd-boot's variables (the Boot Loader Interface): efivarfs names them <name>-<vendor GUID>
LOADER_VARS = boot_trial.LOADER_VARS
TRIAL_RECORD = "trial.json"  # in backup_dir: a trial entry was written and not yet removed
ACTIONS = ("configure", "verify_generated", "restore", "running", "findings", "mark_changed", "trial_remove")


# ------------------------------------------------------------------ detection
# ------------------------------------------------------------------ GRUB files
def grub_files():
    return [GRUB_MAIN, *sorted(glob.glob(os.path.join(GRUB_SNIPPETS, "*.cfg")))]


def read_file(path):
    with open(path) as f:
        return f.read()


def read_if_exists(path, missing=None):
    """The file's text, or `missing` when there is no such file."""
    return read_file(path) if os.path.exists(path) else missing


def write_if_different(path, content):
    if read_if_exists(path) != content:
        atomic_write(path, content)


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


def effective_grub_value(module, var):
    """The value update-grub will see: source the main file and the snippets in order, as it does."""
    script = '. "$1"; shift; for f in "$@"; do . "$f"; done; printf %s "$' + var + '"'
    rc, out, err = module.run_command(["/bin/sh", "-c", script, "sh", *grub_files()])
    if rc != 0:
        module.fail_json(msg=f"cannot evaluate {var} from {', '.join(grub_files())}: {err.strip()}")
    return out


# ------------------------------------------------------------------ backups
class Backup:
    def __init__(self, root):
        self.root = root
        self.dir = None

    def save(self, path):
        if self.dir is None:
            stamp = datetime.datetime.now(datetime.UTC).strftime("%Y%m%dT%H%M%S%fZ")
            self.dir = os.path.join(self.root, "backups", stamp)
            os.makedirs(self.dir, mode=0o700)
            self.manifest = {"created": stamp, "files": {}}
        target = os.path.join(self.dir, "files", path.lstrip("/"))
        os.makedirs(os.path.dirname(target), exist_ok=True)
        if os.path.exists(path):
            shutil.copy2(path, target)
            self.manifest["files"][path] = "saved"
        else:
            self.manifest["files"][path] = "absent"

    def commit(self):
        if self.dir is None:
            return None
        with open(os.path.join(self.dir, "manifest.json"), "w") as f:
            json.dump(self.manifest, f, indent=1)
        latest = os.path.join(self.root, "latest")
        tmp = latest + ".tmp"
        if os.path.lexists(tmp):
            os.unlink(tmp)
        os.symlink(self.dir, tmp)
        os.replace(tmp, latest)
        return self.dir


def atomic_write(path, content):
    directory = os.path.dirname(path)
    mode = os.stat(path).st_mode & 0o7777 if os.path.exists(path) else 0o644
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=".provision-")
    with os.fdopen(fd, "w") as f:
        f.write(content)
    os.chmod(tmp, mode)
    os.replace(tmp, path)


def record_wanted(directory, bootloader, add, remove, snp_required):
    """What provision wants, for `provision verify` to compare with the node (bookkeeping, not a change)."""
    os.makedirs(directory, mode=0o700, exist_ok=True)
    path = os.path.join(directory, "wanted.json")
    wanted = {"bootloader": bootloader, "add": add, "remove": remove, "snp_required": snp_required}
    write_if_different(path, json.dumps(wanted, indent=1, sort_keys=True) + "\n")


# ------------------------------------------------------------------ ESPs (proxmox-boot-tool)
class EspError(Exception):
    """An ESP that cannot be read or written; the message names it."""


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
        module.run_command(["umount", mnt])
        os.rmdir(mnt)


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


# ------------------------------------------------------------------ trial boot
class TrialError(Exception):
    """Preparing the trial boot failed; what was written is removed again."""


class GrubTrial:
    """A one-shot GRUB menu entry: our block in /boot/grub/custom.cfg, selected once by grub-reboot."""

    def __init__(self, module):
        self.module = module

    def run(self, argv):
        rc, out, err = self.module.run_command(argv)
        if rc != 0:
            raise TrialError(f"{' '.join(argv)} failed: {(err or out).strip()[-300:]}")
        return out

    def problem(self, add, remove):
        """Why this node cannot boot a one-shot GRUB entry, or None."""
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
        found = boot_trial.grub_cfg_problem(cfg) or boot_trial.grub_default_problem(
            effective_grub_value(self.module, "GRUB_DEFAULT")
        )
        if found:
            return found
        try:
            answers = [self.run(["grub-probe", f"--target={t}", GRUB_DIR]) for t in ("abstraction", "fs")]
            found = boot_trial.grub_env_problem(*answers)
            boot_trial.grub_trial_entry(cfg, add, remove)
        except (TrialError, boot_trial.Unavailable) as e:
            return str(e)
        return found

    def prepare(self, add, remove, line):
        entry, trial_line = boot_trial.grub_trial_entry(read_file(GRUB_CFG), add, remove)
        atomic_write(GRUB_CUSTOM, boot_trial.custom_cfg_with(read_if_exists(GRUB_CUSTOM), entry))
        self.run(["grub-reboot", boot_trial.TRIAL_ID])
        return dict(
            entry=f"{GRUB_CUSTOM} (menuentry --id {boot_trial.TRIAL_ID}, once through grub-reboot)", line=trial_line
        )

    def remove(self, dry_run, recorded):
        """Take out our custom.cfg block and a next_entry still naming it; what was (or would be) removed. `booted`:
        whether GRUB took the one-shot (it clears next_entry as it boots it), where a trial was recorded."""
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
        if os.path.exists(GRUBENV) and self.module.get_bin_path("grub-editenv"):
            rc, listing, _err = self.module.run_command(["grub-editenv", GRUBENV, "list"])
            if rc == 0 and boot_trial.grubenv_next_entry(listing) == boot_trial.TRIAL_ID:
                removed.append(f"{GRUBENV}: next_entry={boot_trial.TRIAL_ID}")
                self.booted = False if recorded else None
                if not dry_run:
                    self.run(["grub-editenv", GRUBENV, "unset", "next_entry"])
        return removed


class SdbootTrial:
    """A one-shot systemd-boot entry: loader/entries/provision-trial+1.conf on every ESP, and LoaderEntryOneShot."""

    def __init__(self, module):
        self.module = module

    def problem(self, add, remove):
        """Why this node cannot boot a one-shot systemd-boot entry, or None."""
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

    def prepare(self, add, remove, line):
        written = []
        for uuid in esp_uuids():
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
                written.append(f"{uuid}:loader/entries/{boot_trial.SDBOOT_ENTRY} (a copy of {default})")
        rc, out, err = self.module.run_command(["bootctl", "set-oneshot", boot_trial.SDBOOT_ENTRY])
        if rc != 0 and not boot_trial.efi_write_refused(rc, err or out):
            raise TrialError(f"bootctl set-oneshot {boot_trial.SDBOOT_ENTRY} failed: {(err or out).strip()[-300:]}")
        lost = boot_trial.oneshot_lost(rc, err or out, efi_variable("LoaderEntryOneShot"))
        if lost:
            raise boot_trial.OneShotLost(lost)
        return dict(entry="; ".join(written) + ", once through bootctl set-oneshot", line=line)

    def remove(self, dry_run, recorded):
        """Remove the entry from every ESP (mounted only when our record says one was written), under whatever name
        its boot counter has, and a one-shot still naming it; what was (or would be) removed. `booted`: whether
        systemd-boot booted the entry from any ESP (it renames the file it boots), or None where none was found."""
        removed, seen = [], []
        oneshot = (efi_variable("LoaderEntryOneShot") or "").lower() == boot_trial.SDBOOT_ENTRY
        self.oneshot_left = oneshot
        if recorded or oneshot:
            for uuid in esp_uuids():
                try:
                    with mounted_esp(self.module, uuid, writable=not dry_run) as esp:
                        entries = os.path.join(esp, "loader", "entries")
                        names = boot_trial.sdboot_trial_files(os.listdir(entries) if os.path.isdir(entries) else [])
                        seen += names
                        for name in names:
                            removed.append(f"{uuid}:loader/entries/{name}")
                            if not dry_run:
                                os.unlink(os.path.join(entries, name))
                except EspError as e:
                    raise TrialError(str(e)) from e
        self.booted = boot_trial.sdboot_trial_booted(seen) if recorded else None
        if oneshot:
            removed.append("EFI variable LoaderEntryOneShot")
            if not dry_run:
                rc, out, err = self.module.run_command(["bootctl", "set-oneshot", ""])
                if rc != 0:
                    raise TrialError(f"bootctl set-oneshot '' failed: {(err or out).strip()[-300:]}")
        return removed


def trial_for(module, bootloader):
    return GrubTrial(module) if bootloader == "grub" else SdbootTrial(module)


def trial_record(module):
    return os.path.join(module.params["backup_dir"], TRIAL_RECORD)


def remove_trial(module, bootloader, after_trial=False):
    """Remove a trial entry (an earlier run's, or this run's after its trial boot); in check mode only say what.
    With `after_trial` (a trial boot that did not come up on the new line), a systemd-boot entry the loader never
    booted, though its one-shot read back as armed, is recorded as the firmware losing it: the next run does not trust
    the firmware with a one-shot (SdbootTrial.lost_before). Returns (removed, why the trial never ran or None)."""
    record = trial_record(module)
    trial = trial_for(module, bootloader)
    try:
        removed = trial.remove(module.check_mode, os.path.exists(record))
    except (TrialError, OSError) as e:
        hint = f"; {record} records it: remove that file once the entry is gone" if os.path.exists(record) else ""
        module.fail_json(msg=f"cannot remove the trial boot entry: {e}{hint}")
    never_ran = None
    if after_trial and trial.booted is False:
        never_ran = trial_never_ran(module, bootloader, trial)
    if os.path.exists(record) and not module.check_mode:
        os.unlink(record)
    return removed, never_ran


def trial_never_ran(module, bootloader, trial):
    """Why the loader never booted the trial entry; on systemd-boot the firmware's loss is recorded for later runs."""
    if bootloader == "grub":
        return (
            f"GRUB did not take the one-shot: {GRUBENV} still names next_entry={boot_trial.TRIAL_ID} after the reboot"
        )
    selected = efi_variable("LoaderEntrySelected")
    if trial.oneshot_left:  # the firmware kept the variable; the loader did not read it
        return (
            f"systemd-boot did not take the one-shot: LoaderEntryOneShot still named {boot_trial.SDBOOT_ENTRY} "
            f"after the reboot, which booted {selected or 'without systemd-boot'}"
        )
    reason = boot_trial.oneshot_lost_after_boot(selected)
    path = os.path.join(module.params["backup_dir"], boot_trial.ONESHOT_LOST_RECORD)
    if not module.check_mode:
        stamp = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        atomic_write(path, json.dumps({"reason": reason, "at": stamp}) + "\n")
    return (
        f"{reason}; recorded in {path}: until it is removed, runs boot no trial on this node (auto makes the line "
        "the default and reboots, monitored; required refuses)"
    )


def plan_trial(module, bootloader, changes, running_check):
    """The trial decision for this configure call (module_utils/boot_trial.decision); the probes read only."""
    p = module.params
    wanted = bool(changes) and running_check["reboot_needed"] and p["reboot"] == "auto"
    problem = None
    if wanted and p["trial_boot"] != "off":
        problem = trial_for(module, bootloader).problem(p["add"], p["remove"])
    mode = boot_trial.decision(p["trial_boot"], wanted, problem)
    return dict(mode=mode, reason=problem or "")


def prepare_trial(module, bootloader, line):
    """Write the trial entry and its one-shot (after our record of it); on a failure remove them and stop. A one-shot
    the firmware lost is no failure: the trial is then not possible, and the returned mode says what follows."""
    record = trial_record(module)
    os.makedirs(os.path.dirname(record), mode=0o700, exist_ok=True)
    stamp = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    atomic_write(record, json.dumps({"bootloader": bootloader, "prepared_at": stamp}) + "\n")
    trial = trial_for(module, bootloader)
    try:
        prepared = trial.prepare(module.params["add"], module.params["remove"], line)
        # the line the one-shot boots, for readers that cannot mount the ESPs (gpu_p2p_node: the next boot's IOMMU)
        atomic_write(
            record, json.dumps({"bootloader": bootloader, "prepared_at": stamp, "line": prepared["line"]}) + "\n"
        )
        return prepared
    except (TrialError, EspError, boot_trial.Unavailable, OSError) as e:
        with contextlib.suppress(TrialError, EspError, OSError):
            trial.remove(False, True)
        with contextlib.suppress(OSError):
            os.unlink(record)
        if isinstance(e, boot_trial.OneShotLost):
            return dict(mode=boot_trial.decision(module.params["trial_boot"], True, str(e)), reason=str(e))
        module.fail_json(msg=f"cannot prepare the trial boot ({e}): its entry was removed again; nothing was changed")


# ------------------------------------------------------------------ configure
def plan_grub(module, add, remove):
    """Return (changes {path: new content}, before line, after line, notes)."""
    before = effective_grub_value(module, DEFAULT_VAR)
    result = merge(before, add, remove)
    linux_before = effective_grub_value(module, LINUX_VAR)
    linux_result = merge(linux_before, [], remove)
    changes, notes = {}, []
    contents = {}

    def read(path):  # a file as edited so far: a second edit of the same line sees the first
        if path not in contents:
            contents[path] = read_file(path)
        return contents[path]

    overrides = {}
    for var, res in ((DEFAULT_VAR, result), (LINUX_VAR, linux_result)):
        if not res["changed"]:
            continue
        where = last_assignment(var, read)
        path, at, word = where or (None, None, None)
        if word is not None and literal_value(word) is not None and path != GRUB_OVERRIDE:
            # only the value's shell word changes: other statements and a comment on its line stay
            contents[path] = set_assignment(read(path), at, res["line"])
            changes[path] = contents[path]
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


def grub_override(existing, overrides):
    """GRUB_OVERRIDE's new text: its lines that set none of `overrides` ({var: value}) kept, then each var set."""
    lines = [ln for ln in existing.split("\n") if ln and not any(assignments(ln, v) for v in overrides)]
    if not lines:
        lines = ["# Written by provision (kernel_cmdline): the merged kernel arguments, applied last."]
    lines += [f"{var}={quote(value)}" for var, value in overrides.items()]
    return "\n".join(lines) + "\n"


def plan_systemd_boot(module, add, remove):
    if os.path.exists(KERNEL_CMDLINE):
        with open(KERNEL_CMDLINE) as f:
            content = f.read()
        first, _sep, rest = content.partition("\n")
        notes = []
    else:
        with open("/proc/cmdline") as f:
            first = " ".join(a for a in split(f.read()) if not a.startswith(("initrd=", "BOOT_IMAGE=")))
        rest, content = "", None
        notes = [f"{KERNEL_CMDLINE} did not exist: started from /proc/cmdline, as proxmox-boot-tool does"]
    result = merge(first, add, remove)
    if not any(a.startswith("root=") for a in split(result["line"])):
        module.fail_json(
            msg=f"{KERNEL_CMDLINE}: the first line has no root= argument; proxmox-boot-tool refresh would refuse it"
        )
    changes = {}
    if result["changed"] or content is None:
        changes[KERNEL_CMDLINE] = result["line"] + "\n" + rest
    return changes, first, result, notes


SNP_OFF_HINT = (
    "set kernel_cmdline_snp_profile: false to run without the SEV-SNP profile "
    "(or kernel_cmdline_snp_required: false to apply it without proof)"
)


def refuse_unbootable_snp(module, bootloader, changes, running_check, planned_line):
    """Fail before writing anything when this run would lead to a reboot into SNP that cannot come up."""
    if not module.params["snp_required"] or not (changes or running_check["reboot_needed"]):
        return []
    gaps = snp_before_reboot(bootloader, planned_line)
    if gaps:
        module.fail_json(
            msg=f"cannot boot into SEV-SNP: {'; '.join(gaps)}; nothing was changed; {SNP_OFF_HINT}",
            snp_before_reboot=gaps,
        )
    return gaps


def configure(module, bootloader, add, remove):
    # a trial entry left by an earlier run, or by this run's own trial boot (this call is then its commit), goes first
    trial_removed = remove_trial(module, bootloader)[0]
    planner = plan_grub if bootloader == "grub" else plan_systemd_boot
    changes, before, result, notes = planner(module, add, remove)
    running_check = {k: v for k, v in running(add, remove).items() if k != "changed"}
    snp_gaps = refuse_unbootable_snp(module, bootloader, changes, running_check, result["line"])
    trial = plan_trial(module, bootloader, changes, running_check)
    out = dict(
        changed=bool(changes) or bool(trial_removed),
        line=result["line"],
        previous=before,
        files=sorted(changes),
        added=result["added"],
        replaced=result["replaced"],
        removed=result["removed"],
        warnings_list=result["warnings"],
        notes=notes,
        trial=trial,
        trial_removed=trial_removed,
        running=running_check,
        snp_before_reboot=snp_gaps,
    )
    if trial["mode"] == "refuse":  # kernel_cmdline_trial_boot: required, and no trial possible: write nothing
        out["changed"] = bool(trial_removed)
        return out
    if changes and module._diff:
        out["diff"] = [
            dict(before=read_if_exists(path, ""), after=new, before_header=path, after_header=path)
            for path, new in sorted(changes.items())
        ]
    if not module.check_mode:
        write_planned(module, bootloader, changes, result["line"], out)
    if not module.check_mode and out["trial"]["mode"] != "refuse":
        record_wanted(module.params["backup_dir"], bootloader, add, remove, module.params["snp_required"])
    # the same call reads the running kernel, and when no reboot is needed records this boot's findings:
    # a converged node costs one round trip for the whole check (action=running/findings stay for later steps)
    if not running_check["reboot_needed"]:
        out["findings"] = findings(module, add, remove)["findings"]
    return out


def write_planned(module, bootloader, changes, line, out):
    """A trial entry in place of the default files, or the default files (each backed up first). Where the firmware
    loses the trial's one-shot, the run goes on as on a node that cannot boot a trial: `auto` writes the default
    files (a monitored reboot, no trial), `required` writes nothing."""
    if out["trial"]["mode"] == "trial":
        out["trial"].update(prepare_trial(module, bootloader, line))
    if out["trial"]["mode"] == "refuse":
        out["changed"] = bool(out["trial_removed"])
    elif out["trial"]["mode"] != "trial" and changes:
        backup = Backup(module.params["backup_dir"])
        for path in changes:
            backup.save(path)
        out["backup"] = backup.commit()
        for path, new in changes.items():
            atomic_write(path, new)


# ------------------------------------------------------------------ checks
def generated_lines(module, bootloader):
    """The kernel command lines the bootloader will use, as (source, line) pairs."""
    found = []
    if bootloader == "grub":
        with open(GRUB_CFG) as f:
            for line in f:
                stripped = line.strip()
                if stripped.startswith("linux") and ("vmlinuz" in stripped or "/boot/" in stripped):
                    found.append((GRUB_CFG, " ".join(stripped.split()[2:])))
                    break  # the default (first) entry is what boots
        return found
    for uuid in esp_uuids():
        try:
            with mounted_esp(module, uuid) as mnt:
                for entry in sorted(glob.glob(os.path.join(mnt, "loader", "entries", "proxmox-*.conf"))):
                    with open(entry) as f:
                        for line in f:
                            if line.startswith("options"):
                                found.append((f"{uuid}:{os.path.basename(entry)}", line.split(None, 1)[1].strip()))
        except EspError as e:
            module.fail_json(msg=str(e))
    return found


def verify_generated(module, bootloader, add, remove):
    lines = generated_lines(module, bootloader)
    if not lines:
        module.fail_json(
            msg="no kernel command line found in the generated boot configuration "
            f"({GRUB_CFG if bootloader == 'grub' else 'loader entries on the ESPs'})"
        )
    bad = []
    for source, line in lines:
        gap = missing(line, add, remove)
        if not gap["ok"]:
            bad.append(f"{source}: missing {gap['absent'] or '-'}, still has {gap['still_present'] or '-'}")
    if bad:
        module.fail_json(
            msg="the generated boot configuration does not carry the new arguments: " + "; ".join(bad), generated=lines
        )
    return dict(changed=False, generated=lines)


def configured_line(module, bootloader):
    planner = plan_grub if bootloader == "grub" else plan_systemd_boot
    return planner(module, [], [])[2]["line"]


def restore(module, bootloader):
    """Put back the latest backup; say whether the running kernel then needs a reboot to match."""
    before = configured_line(module, bootloader)
    result = _restore_files(module)
    after = configured_line(module, bootloader) if not module.check_mode else before
    with open("/proc/cmdline") as f:
        running_args = [canonical(a) for a in split(f.read())]
    after_args = [canonical(a) for a in split(after)]
    dropped = [a for a in (canonical(b) for b in split(before)) if a not in after_args]
    result.update(
        configured_before=before,
        configured_after=after,
        reboot_needed=bool(result["changed"])
        and (any(a not in running_args for a in after_args) or any(a in running_args for a in dropped)),
    )
    return result


def _restore_files(module):
    latest = os.path.join(module.params["backup_dir"], "latest")
    if not os.path.exists(latest):
        module.fail_json(msg=f"no backup to restore under {module.params['backup_dir']}")
    source = os.path.realpath(latest)
    with open(os.path.join(source, "manifest.json")) as f:
        manifest = json.load(f)
    restored = []
    for path, how in sorted(manifest["files"].items()):
        saved = os.path.join(source, "files", path.lstrip("/"))
        if how == "saved":
            with open(saved) as f:
                original = f.read()
            current = read_if_exists(path)
            if current != original:
                restored.append(path)
                if not module.check_mode:
                    atomic_write(path, original)
        elif os.path.exists(path):
            restored.append(path)
            if not module.check_mode:
                os.unlink(path)
    return dict(changed=bool(restored), restored=restored, backup=source)


def running(add, remove):
    with open("/proc/cmdline") as f:
        line = f.read().strip()
    gap = missing(line, add, remove)
    # after a systemd-boot trial boot, the entry it came from (null where the variable does not exist)
    selected = efi_variable("LoaderEntrySelected")
    return dict(changed=False, proc_cmdline=line, reboot_needed=not gap["ok"], loader_entry_selected=selected, **gap)


def read_text(path):
    try:
        with open(path) as f:
            return f.read()
    except OSError:
        return None


def next_boot_release(bootloader):
    """The kernel release the node boots next (module_utils/boot_kernel.py)."""
    return on_this_node(bootloader, GRUB_CFG, PBT_PIN)


def snp_before_reboot(bootloader, planned_line):
    """The SEV-SNP prerequisites that can be checked before a reboot into `planned_line`, missing on this node."""
    cpuinfo, running_line = read_text("/proc/cpuinfo") or "", read_text("/proc/cmdline") or ""
    return before_reboot(cpuinfo, next_boot_release(bootloader), running_line, planned_line)


def run_tool(module):
    """run(argv) -> (rc, stdout) for module_utils/kernel_findings.py; a tool that is not installed answers 127."""

    def run(argv):
        if not module.get_bin_path(argv[0]):
            return 127, ""
        rc, out, _err = module.run_command(argv)
        return rc, out

    return run


def findings(module, add, remove):
    """This boot's findings (module_utils/kernel_findings.py) plus the running-kernel check, written to
    <state_dir>/kernel-findings.json."""
    dmesg, kernel_log = kernel_findings.read_logs(run_tool(module))
    out = kernel_findings.findings(dmesg, node_proof(kernel_log))
    check = running(add, remove)
    out["proc_cmdline"] = check["proc_cmdline"]
    path = module.params["findings_file"]
    if path and not module.check_mode:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        write_if_different(path, json.dumps(out, indent=2, sort_keys=True) + "\n")
    return dict(changed=False, findings=out, **{k: v for k, v in check.items() if k != "changed"})


def changed_marker(line, now):
    """The record that the boot configuration changed: when (UTC) and to which line."""
    return json.dumps({"changed_at": now.strftime("%Y-%m-%dT%H:%M:%SZ"), "cmdline": line}, sort_keys=True) + "\n"


def mark_changed(module):
    """Write the marker (node clock, UTC); called only by tasks that changed the boot configuration."""
    path = module.params["marker_file"]
    if not module.check_mode:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        atomic_write(path, changed_marker(module.params["line"], datetime.datetime.now(datetime.UTC)))
    return dict(changed=True, marker_file=path)


def main():
    module = AnsibleModule(
        argument_spec=dict(
            action=dict(
                type="str",
                default="configure",
                choices=list(ACTIONS),
            ),
            bootloader=dict(type="str", default="auto", choices=["auto", "grub", "systemd-boot"]),
            add=dict(type="list", elements="str", default=[]),
            remove=dict(type="list", elements="str", default=[]),
            backup_dir=dict(type="path"),
            findings_file=dict(type="path"),
            snp_required=dict(type="bool", default=False),
            marker_file=dict(type="path"),
            line=dict(type="str"),
            trial_boot=dict(type="str", default="off", choices=list(boot_trial.MODES)),
            reboot=dict(type="str", default="auto", choices=["auto", "never"]),
            after_trial=dict(type="bool", default=False),
        ),
        required_if=[
            ("action", "mark_changed", ("marker_file", "line")),
            ("action", "configure", ("backup_dir",)),
            ("action", "restore", ("backup_dir",)),
            ("action", "trial_remove", ("backup_dir",)),
        ],
        supports_check_mode=True,
    )
    p = module.params
    problems = value_problems({"add": p["add"], "remove": p["remove"]})
    if problems:  # a newline would start a new statement in /etc/default/grub, a new line in /etc/kernel/cmdline
        module.fail_json(msg="; ".join(problems) + ": nothing was changed")
    if p["bootloader"] == "auto":
        bootloader, how = detect_bootloader(module)
    else:
        bootloader, how = p["bootloader"], "set by the inventory"
    action = p["action"]
    if action == "configure":
        result = configure(module, bootloader, p["add"], p["remove"])
    elif action == "verify_generated":
        result = verify_generated(module, bootloader, p["add"], p["remove"])
    elif action == "restore":
        result = restore(module, bootloader)
    elif action == "running":
        result = running(p["add"], p["remove"])
    elif action == "mark_changed":
        result = mark_changed(module)
    elif action == "trial_remove":
        removed, never_ran = remove_trial(module, bootloader, after_trial=p["after_trial"])
        result = dict(changed=bool(removed), trial_removed=removed, trial_never_ran=never_ran)
    else:
        result = findings(module, p["add"], p["remove"])
    module.exit_json(bootloader=bootloader, bootloader_detection=how, **result)


if __name__ == "__main__":
    main()
