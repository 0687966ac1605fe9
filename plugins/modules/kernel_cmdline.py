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
    description:
      - The node's boot loader; auto tells GRUB from systemd-boot through proxmox-boot-tool.
      - Each is one class in plugins/module_utils/bootloaders.py, with the same interface (plan, write, regenerate,
        generated lines, next kernel, armed one-shot, trial boot).
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
regenerate:
  description: the command that writes the boot configuration from the configured line (C(update-grub), or
    C(proxmox-boot-tool refresh))
  type: list
  elements: str
  returned: always
generated_from:
  description: what the regeneration writes (C(/boot/grub/grub.cfg), or the loader entries on the ESPs)
  type: str
  returned: always
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
import json
import os
import shutil

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.provision.pve_sglang.plugins.module_utils import boot_trial, bootloaders, kernel_findings
from ansible_collections.provision.pve_sglang.plugins.module_utils.bootloaders import (
    EspError,
    TrialError,
    atomic_write,
    efi_variable,
    read_if_exists,
    write_if_different,
)
from ansible_collections.provision.pve_sglang.plugins.module_utils.kernel_cmdline import canonical, missing, split
from ansible_collections.provision.pve_sglang.plugins.module_utils.rendered_values import value_problems
from ansible_collections.provision.pve_sglang.plugins.module_utils.sev_snp import before_reboot, node_proof

ACTIONS = ("configure", "verify_generated", "restore", "running", "findings", "mark_changed", "trial_remove")


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


def record_wanted(directory, bootloader, add, remove, snp_required, put=()):
    """What provision wants, for `provision verify` to compare with the node (bookkeeping, not a change), and `put`:
    every argument a configure of provision's has put on the line (added, or in place of another value of its key),
    over all its runs, for `provision retire`, which takes off those and no argument the node had before."""
    os.makedirs(directory, mode=0o700, exist_ok=True)
    path = os.path.join(directory, "wanted.json")
    try:
        with open(path, encoding="utf-8") as f:
            before = json.load(f).get("put", [])
    except (OSError, ValueError, AttributeError):
        before = []
    put = sorted(set(before) | set(put))
    wanted = {"bootloader": bootloader, "add": add, "remove": remove, "snp_required": snp_required, "put": put}
    write_if_different(path, json.dumps(wanted, indent=1, sort_keys=True) + "\n")


# ------------------------------------------------------------------ trial boot
def trial_record(module):
    return os.path.join(module.params["backup_dir"], boot_trial.TRIAL_RECORD)


def remove_trial(module, loader, after_trial=False):
    """Remove a trial entry (an earlier run's, or this run's after its trial boot); in check mode only say what.
    With `after_trial` (a trial boot that did not come up on the new line), a systemd-boot entry the loader never
    booted, though its one-shot read back as armed, is recorded as the firmware losing it: the next run does not trust
    the firmware with a one-shot (SystemdBoot.lost_before). Returns (removed, why the trial never ran or None)."""
    record = trial_record(module)
    try:
        removed = loader.remove_trial(module.check_mode, os.path.exists(record))
    except (TrialError, OSError) as e:
        hint = f"; {record} records it: remove that file once the entry is gone" if os.path.exists(record) else ""
        module.fail_json(msg=f"cannot remove the trial boot entry: {e}{hint}")
    never_ran = None
    if after_trial and loader.booted is False:
        never_ran = loader.trial_never_ran(module.params["backup_dir"], module.check_mode)
    if os.path.exists(record) and not module.check_mode:
        os.unlink(record)
    return removed, never_ran


def plan_trial(module, loader, changes, running_check):
    """The trial decision for this configure call (module_utils/boot_trial.decision); the probes read only."""
    p = module.params
    wanted = bool(changes) and running_check["reboot_needed"] and p["reboot"] == "auto"
    problem = None
    if wanted and p["trial_boot"] != "off":
        problem = loader.trial_problem(p["add"], p["remove"])
    mode = boot_trial.decision(p["trial_boot"], wanted, problem)
    return dict(mode=mode, reason=problem or "")


def prepare_trial(module, loader, line):
    """Write the trial entry and its one-shot (after our record of it); on a failure remove them and stop. A one-shot
    the firmware lost is no failure: the trial is then not possible, and the returned mode says what follows."""
    record = trial_record(module)
    os.makedirs(os.path.dirname(record), mode=0o700, exist_ok=True)
    stamp = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    atomic_write(record, json.dumps({"bootloader": loader.name, "prepared_at": stamp}) + "\n")
    try:
        prepared = loader.prepare_trial(module.params["add"], module.params["remove"], line)
        # the line the one-shot boots, for readers that cannot mount the ESPs (gpu_p2p_node: the next boot's IOMMU)
        atomic_write(
            record, json.dumps({"bootloader": loader.name, "prepared_at": stamp, "line": prepared["line"]}) + "\n"
        )
        return prepared
    except (TrialError, EspError, boot_trial.Unavailable, OSError) as e:
        with contextlib.suppress(TrialError, EspError, OSError):
            loader.remove_trial(False, True)
        with contextlib.suppress(OSError):
            os.unlink(record)
        if isinstance(e, boot_trial.OneShotLost):
            return dict(mode=boot_trial.decision(module.params["trial_boot"], True, str(e)), reason=str(e))
        module.fail_json(msg=f"cannot prepare the trial boot ({e}): its entry was removed again; nothing was changed")


# ------------------------------------------------------------------ configure
SNP_OFF_HINT = (
    "set kernel_cmdline_snp_profile: false to run without the SEV-SNP profile "
    "(or kernel_cmdline_snp_required: false to apply it without proof)"
)


def refuse_unbootable_snp(module, loader, changes, running_check, planned_line):
    """Fail before writing anything when this run would lead to a reboot into SNP that cannot come up."""
    if not module.params["snp_required"] or not (changes or running_check["reboot_needed"]):
        return []
    gaps = snp_before_reboot(loader, planned_line)
    if gaps:
        module.fail_json(
            msg=f"cannot boot into SEV-SNP: {'; '.join(gaps)}; nothing was changed; {SNP_OFF_HINT}",
            snp_before_reboot=gaps,
        )
    return gaps


def configure(module, loader, add, remove):
    # a trial entry left by an earlier run, or by this run's own trial boot (this call is then its commit), goes first
    trial_removed = remove_trial(module, loader)[0]
    changes, before, result, notes = loader.plan(add, remove)
    running_check = {k: v for k, v in running(add, remove).items() if k != "changed"}
    snp_gaps = refuse_unbootable_snp(module, loader, changes, running_check, result["line"])
    trial = plan_trial(module, loader, changes, running_check)
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
        write_planned(module, loader, changes, result["line"], out)
    if not module.check_mode and out["trial"]["mode"] != "refuse":
        put = result["added"] + [r.split(" -> ", 1)[1] for r in result["replaced"]]
        record_wanted(module.params["backup_dir"], loader.name, add, remove, module.params["snp_required"], put)
    # the same call reads the running kernel, and when no reboot is needed records this boot's findings:
    # a converged node costs one round trip for the whole check (action=running/findings stay for later steps)
    if not running_check["reboot_needed"]:
        out["findings"] = findings(module, add, remove)["findings"]
    return out


def write_planned(module, loader, changes, line, out):
    """A trial entry in place of the default files, or the default files (each backed up first). Where the firmware
    loses the trial's one-shot, the run goes on as on a node that cannot boot a trial: `auto` writes the default
    files (a monitored reboot, no trial), `required` writes nothing."""
    if out["trial"]["mode"] == "trial":
        out["trial"].update(prepare_trial(module, loader, line))
    if out["trial"]["mode"] == "refuse":
        out["changed"] = bool(out["trial_removed"])
    elif out["trial"]["mode"] != "trial" and changes:
        backup = Backup(module.params["backup_dir"])
        for path in changes:
            backup.save(path)
        out["backup"] = backup.commit()
        loader.write(changes)


# ------------------------------------------------------------------ checks
def verify_generated(module, loader, add, remove):
    try:
        lines = loader.generated_lines()
    except EspError as e:
        module.fail_json(msg=str(e))
    if not lines:
        where = loader.generated_from
        module.fail_json(msg=f"no kernel command line found in the generated boot configuration ({where})")
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


def restore(module, loader):
    """Put back the latest backup; say whether the running kernel then needs a reboot to match."""
    before = loader.configured_line()
    result = _restore_files(module)
    after = loader.configured_line() if not module.check_mode else before
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


def snp_before_reboot(loader, planned_line):
    """The SEV-SNP prerequisites that can be checked before a reboot into `planned_line`, missing on this node."""
    cpuinfo, running_line = read_text("/proc/cpuinfo") or "", read_text("/proc/cmdline") or ""
    return before_reboot(cpuinfo, loader.next_release(), running_line, planned_line)


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
            bootloader=dict(type="str", default="auto", choices=["auto", *bootloaders.NAMES]),
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
    loader, bootloader, how = bootloaders.for_params(module)
    result = act(module, loader, p["action"])
    module.exit_json(
        bootloader=bootloader,
        bootloader_detection=how,
        regenerate=list(loader.regenerate),
        generated_from=loader.generated_from,
        **result,
    )


def act(module, loader, action):
    p = module.params
    if action == "configure":
        return configure(module, loader, p["add"], p["remove"])
    if action == "verify_generated":
        return verify_generated(module, loader, p["add"], p["remove"])
    if action == "restore":
        return restore(module, loader)
    if action == "running":
        return running(p["add"], p["remove"])
    if action == "mark_changed":
        return mark_changed(module)
    if action == "trial_remove":
        removed, never_ran = remove_trial(module, loader, after_trial=p["after_trial"])
        return dict(changed=bool(removed), trial_removed=removed, trial_never_ran=never_ran)
    return findings(module, p["add"], p["remove"])


if __name__ == "__main__":
    main()
