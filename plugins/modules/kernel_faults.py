#!/usr/bin/python
"""Ansible module: GPU DMA faults in a node's kernel log since a given time (read-only)."""

from __future__ import annotations

DOCUMENTATION = r"""
module: kernel_faults
short_description: AMD-Vi IO_PAGE_FAULT / RMP_PAGE_FAULT and NVRM Xid lines logged since a time, and the node's clock
author: provision maintainers (!UNKNOWN)
description:
  - Read-only. Reads this boot's kernel messages through journalctl (see plugins/module_utils/kernel_faults.py for
    the lines and their sources). Without C(since), returns only the node's clock, to mark the start of a window.
options:
  since:
    description: Unix time (the node's clock) from which lines count.
    type: float
  gpus:
    description:
      - The PCI bus ids of the GPUs the faults are counted against (a container's, as its sglang role recorded
        them). A line that names another device (a NIC, NVMe, another container's GPU) goes to C(other_faults).
      - Unset, every line counts.
    type: list
    elements: str
"""

EXAMPLES = r"""
- name: Mark the start of a window on the node's clock
  provision.pve_sglang.kernel_faults: {}
  delegate_to: "{{ proxmox_host }}"
  register: mark

- name: The GPU DMA faults of this container's GPUs logged since
  provision.pve_sglang.kernel_faults:
    since: "{{ mark.now }}"
    gpus: ["0000:41:00.0", "0000:42:00.0"]
  delegate_to: "{{ proxmox_host }}"
  register: faults
"""

RETURN = r"""
now: {description: "the node's clock, unix time", type: float, returned: always}
faults: {description: "matching lines since C(since) of C(gpus) or of no named device, as '<UTC time> <message>'",
         type: list, returned: with since}
other_faults: {description: "matching lines since C(since) that name another device", type: list, returned: with since}
"""

import time

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.provision.pve_sglang.plugins.module_utils.kernel_faults import (
    faults,
    journal_argv,
    of_devices,
    read_result,
)


def main():
    module = AnsibleModule(
        argument_spec=dict(since=dict(type="float"), gpus=dict(type="list", elements="str")), supports_check_mode=True
    )
    since, gpus = module.params["since"], module.params["gpus"]
    result = dict(changed=False, now=time.time())
    if since is not None:
        if not module.get_bin_path("journalctl"):
            module.fail_json(msg="cannot read the kernel log: journalctl is not on this node", **result)
        text, error = read_result(*module.run_command(journal_argv(since)))
        if error:
            module.fail_json(msg=error, **result)
        found = faults(text, since)
        result["faults"], result["other_faults"] = of_devices(found, gpus)
    module.exit_json(**result)


if __name__ == "__main__":
    main()
