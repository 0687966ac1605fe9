#!/usr/bin/python
"""Ansible module: read which recorded phase fingerprints still hold on this host (read-only)."""

from __future__ import annotations

DOCUMENTATION = r"""
module: provision_facts
short_description: Recompute each recorded phase fingerprint on the host and say which still match
description:
  - Reads every C(<dir>/fingerprint/<name>.json) that C(provision_state) wrote, recomputes the digest of the
    paths it watches, and returns whether it still matches, with the recorded inputs digest.
  - The controller skips a phase on a host whose fingerprint still matches and whose inputs digest is the
    one it computes now (C(playbooks/facts.yml)). Nothing is written. One call reads every phase.
options:
  dir:
    type: path
    required: true
"""

EXAMPLES = r"""
- name: Read the recorded phase fingerprints
  provision_facts:
    dir: /var/lib/provision
"""

RETURN = r"""
ansible_facts:
  description: C(provision_fingerprints), C({name: {inputs, current}}); C(provision_boot_id).
  type: dict
  returned: always
"""

import glob
import json
import os

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.provision_fingerprint import digest, fingerprint_path


def read_fingerprints(state_dir):
    found = {}
    for path in sorted(glob.glob(fingerprint_path(state_dir, "*"))):
        name = os.path.basename(path)[: -len(".json")]
        try:
            with open(path) as f:
                record = json.load(f)
            current = record["state"] == digest(record["watch"])
        except (OSError, ValueError, KeyError, TypeError):
            continue
        found[name] = dict(inputs=record.get("inputs"), current=current)
    return found


def main():
    module = AnsibleModule(argument_spec=dict(dir=dict(type="path", required=True)), supports_check_mode=True)
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            boot_id = f.read().strip()
    except OSError:
        boot_id = None
    facts = dict(provision_fingerprints=read_fingerprints(module.params["dir"]), provision_boot_id=boot_id)
    module.exit_json(changed=False, ansible_facts=facts)


if __name__ == "__main__":
    main()
