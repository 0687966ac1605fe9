#!/usr/bin/python
"""Ansible module: read, on a Proxmox node, the context a GPU P2P decision depends on (read-only)."""

from __future__ import annotations

DOCUMENTATION = r"""
module: gpu_p2p_node
short_description: The node's boot id, kernel command line, IOMMU mode and NVIDIA driver version, in one read
author: provision maintainers (!UNKNOWN)
description:
  - "Read-only. The IOMMU mode comes from each NVIDIA GPU's IOMMU group (C(/sys/bus/pci/devices/<bus>/iommu_group/type))
    where sysfs shows it, and from this boot's kernel log line C(iommu: Default domain type) (dmesg, else the journal)."
  - Also returns when the kernel phase last changed the command line (C(<state_dir>/cmdline-changed)), so that a
    diagnostic verdict taken before that change no longer counts.
  - "And the lines the node may boot next (plugins/module_utils/next_boot.py): GRUB's default entry in
    C(/boot/grub/grub.cfg) and the line update-grub writes from C(/etc/default/grub) and its snippets, systemd-boot's
    C(/etc/kernel/cmdline), and an armed one-shot (grubenv's C(next_entry), the C(LoaderEntryOneShot) EFI variable),
    whose line is read from its GRUB menu entry or from the kernel phase's trial record; a one-shot whose line cannot
    be read without mounting an ESP is returned with C(cmdline) null."
options:
  state_dir:
    description: The node's provision state directory (provision_state_dir).
    type: path
    required: true
"""

EXAMPLES = r"""
- name: Read the node's IOMMU, GPU groups and the lines it may boot next, for the P2P decision
  provision.pve_sglang.gpu_p2p_node:
    state_dir: /var/lib/provision
  delegate_to: "{{ proxmox_host }}"
  register: node_context
"""

RETURN = r"""
context:
  description: "{boot_id, cmdline, default_domain, gpu_groups: {bus: type}, driver_version, now, cmdline_changed_at,
    next_boot: [{source, cmdline}]}"
  type: dict
  returned: always
"""

import glob
import json
import os
import re
import time

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.provision.pve_sglang.plugins.module_utils import next_boot
from ansible_collections.provision.pve_sglang.plugins.module_utils.boot_trial import efi_string
from ansible_collections.provision.pve_sglang.plugins.module_utils.kernel_findings import default_domain as domain_in


def _read(path):
    try:
        with open(path) as f:
            return f.read().strip()
    except OSError:
        return None


def default_domain(module):
    """This boot's "iommu: Default domain type" word; the journal when the ring buffer has rotated it out."""
    for argv in (["dmesg"], ["journalctl", "-k", "-b", "--no-pager", "-o", "cat", "-g", "Default domain type"]):
        if not module.get_bin_path(argv[0]):
            continue
        rc, out, _err = module.run_command(argv)
        found = domain_in(out) if rc == 0 else None
        if found:
            return found
    return None


def gpu_groups():
    groups = {}
    for info in sorted(glob.glob("/proc/driver/nvidia/gpus/*")):
        bus = os.path.basename(info).lower()
        kind = _read(f"/sys/bus/pci/devices/{bus}/iommu_group/type")
        if kind:
            groups[bus] = kind
    return groups


def driver_version():
    m = re.search(r"Kernel Module\s+(?:for \S+\s+)?(\d+\.\d+(?:\.\d+)?)", _read("/proc/driver/nvidia/version") or "")
    return m.group(1) if m else None


def cmdline_changed_at(state_dir):
    try:
        return json.loads(_read(os.path.join(state_dir, "cmdline-changed")) or "null")["changed_at"]
    except (TypeError, KeyError, ValueError):
        return None


def next_boot_lines(module, state_dir):
    """The lines this node may boot next (module_utils/next_boot.py), from its own files."""
    rc, out, _err = module.run_command(["sh", "-c", next_boot.GRUB_CONFIGURED])
    try:
        with open(next_boot.ONESHOT, "rb") as f:
            oneshot = efi_string(f.read())
    except OSError:
        oneshot = None
    reads = dict(
        grub_cfg=_read(next_boot.GRUB_CFG),
        grubenv=_read(next_boot.GRUBENV),
        grub_custom=_read(next_boot.GRUB_CUSTOM),
        kernel_cmdline=_read(next_boot.KERNEL_CMDLINE),
        grub_configured=dict(rc=rc, stdout=out),
        oneshot=oneshot,
        trial_line=next_boot.trial_line(_read(os.path.join(state_dir, next_boot.TRIAL_RECORD))),
    )
    return next_boot.lines(reads)


def main():
    module = AnsibleModule(argument_spec=dict(state_dir=dict(type="path", required=True)), supports_check_mode=True)
    module.exit_json(
        changed=False,
        context=dict(
            boot_id=_read("/proc/sys/kernel/random/boot_id"),
            cmdline=_read("/proc/cmdline"),
            default_domain=default_domain(module),
            gpu_groups=gpu_groups(),
            driver_version=driver_version(),
            now=time.time(),
            cmdline_changed_at=cmdline_changed_at(module.params["state_dir"]),
            next_boot=next_boot_lines(module, module.params["state_dir"]),
        ),
    )


if __name__ == "__main__":
    main()
