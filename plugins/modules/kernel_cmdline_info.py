#!/usr/bin/python
"""Ansible module: read a node's kernel command line as configured, generated, armed and running (read-only)."""

from __future__ import annotations

DOCUMENTATION = r"""
module: kernel_cmdline_info
short_description: Read a node's kernel command line for this boot and the next, for GRUB or systemd-boot
author: provision maintainers (!UNKNOWN)
description:
  - The read-only sibling of M(provision.pve_sglang.kernel_cmdline). It reads, through the same bootloader class
    (plugins/module_utils/bootloaders.py), what that module plans from and writes to.
  - The configured line (C(GRUB_CMDLINE_LINUX_DEFAULT) as update-grub sees it, or the first line of
    C(/etc/kernel/cmdline)); the lines the generated boot configuration boots (C(/boot/grub/grub.cfg)'s first entry, or
    every C(proxmox-*.conf) loader entry on the ESPs C(/etc/kernel/proxmox-boot-uuids) lists, mounted read-only);
    the running line (C(/proc/cmdline)); a one-shot armed for the next boot (GRUB's C(next_entry) in grubenv, or the
    C(LoaderEntryOneShot) EFI variable); and the kernel release the node boots next.
  - Changes nothing on the node, in check mode or not. On systemd-boot it mounts each ESP read-only for the read and
    unmounts it again, as PVE leaves ESPs unmounted.
notes:
  - On a node whose GRUB boots from ESPs that proxmox-boot-tool manages (C(/etc/kernel/proxmox-boot-uuids) with ESPs
    configured with grub), the GRUB files read are C(/boot/grub)'s, not the ESPs' copies.
options:
  bootloader:
    type: str
    choices: [auto, grub, systemd-boot]
    default: auto
    description: The node's boot loader; auto tells GRUB from systemd-boot through proxmox-boot-tool.
  backup_dir:
    type: path
    description:
      - The kernel phase's state directory (the role's is C(provision_state_dir)/kernel-cmdline). Where given,
        C(trial_recorded) says whether a trial entry is recorded there as written and not yet removed.
extends_documentation_fragment:
  - provision.pve_sglang.attributes
attributes:
  check_mode: {support: full}
  diff_mode: {support: none}
"""

EXAMPLES = r"""
- name: Read the node's kernel command line, now and at the next boot
  provision.pve_sglang.kernel_cmdline_info:
    backup_dir: /var/lib/provision/kernel-cmdline
  register: cmdline

- name: Say when the next boot would run another line than this one
  ansible.builtin.debug:
    msg: "{{ inventory_hostname }} boots {{ cmdline.generated[0][1] }} next, with {{ cmdline.not_running }} new"
  when: cmdline.not_running | length > 0
"""

RETURN = r"""
bootloader: {description: "grub or systemd-boot", type: str, returned: always}
bootloader_detection: {description: how the bootloader was told, type: str, returned: always}
configured_line:
  description:
    - the line the bootloader's configuration files give, which M(provision.pve_sglang.kernel_cmdline) merges into
  type: str
  returned: always
generated:
  description:
    - the lines the generated boot configuration boots, each a pair of its source and the line; the entry booted by
      default first (GRUB's first menu entry; on each ESP the entry loader.conf's default selects)
    - empty where there is none (no C(/boot/grub/grub.cfg), or no ESP listed)
  type: list
  elements: list
  returned: always
generated_from: {description: what the regeneration writes, type: str, returned: always}
regenerate:
  description: the command that writes the generated configuration
  type: list
  elements: str
  returned: always
running_line: {description: the running kernel's command line (C(/proc/cmdline)), type: str, returned: always}
not_running:
  description: arguments of the first generated line (the entry booted by default) that the running kernel lacks
  type: list
  elements: str
  returned: always
armed:
  description: the one-shot armed for the next boot (GRUB's next_entry, or LoaderEntryOneShot), or null
  type: str
  returned: always
trial_recorded: {description: whether I(backup_dir) records a trial entry not yet removed, type: bool, returned: always}
next_release: {description: the kernel release the node boots next, type: str, returned: always}
"""

import os

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.provision.pve_sglang.plugins.module_utils import boot_trial, bootloaders
from ansible_collections.provision.pve_sglang.plugins.module_utils.kernel_cmdline import canonical, split


def not_running(generated, running_line):
    """The default entry's arguments the running kernel lacks (the loader's own, BOOT_IMAGE= and initrd=, aside)."""
    if not generated:
        return []
    running_args = {canonical(a) for a in split(running_line)}
    return [a for a in split(generated[0][1]) if canonical(a) not in running_args and not a.startswith("initrd=")]


def read(module, loader):
    try:
        generated = loader.generated_lines()
    except (bootloaders.EspError, OSError) as e:
        module.fail_json(msg=f"cannot read the generated boot configuration ({loader.generated_from}): {e}")
    with open("/proc/cmdline") as f:
        running_line = f.read().strip()
    backup_dir = module.params["backup_dir"]
    return dict(
        changed=False,
        configured_line=loader.configured_line(),
        generated=[list(pair) for pair in generated],
        generated_from=loader.generated_from,
        regenerate=list(loader.regenerate),
        running_line=running_line,
        not_running=not_running(generated, running_line),
        armed=loader.armed(),
        trial_recorded=bool(backup_dir) and os.path.exists(os.path.join(backup_dir, boot_trial.TRIAL_RECORD)),
        next_release=loader.next_release(),
    )


def main():
    module = AnsibleModule(
        argument_spec=dict(
            bootloader=dict(type="str", default="auto", choices=["auto", *bootloaders.NAMES]),
            backup_dir=dict(type="path"),
        ),
        supports_check_mode=True,
    )
    loader, bootloader, how = bootloaders.for_params(module)
    result = read(module, loader)
    module.exit_json(bootloader=bootloader, bootloader_detection=how, **result)


if __name__ == "__main__":
    main()
