#!/usr/bin/python
"""Ansible module: record which provision release converged which phase, in one call."""

from __future__ import annotations

DOCUMENTATION = r"""
module: provision_state
short_description: Write <dir>/<phase>.json when it differs, creating the directory
description:
  - One call instead of a C(file) and a C(copy) task (each its own round trip): creates I(dir) (0755, root),
    compares the record with what is on the host, and writes it atomically (0644, root) only when it differs.
  - Supports check mode and diff mode.
options:
  dir:
    type: path
    required: true
  phase:
    type: str
    required: true
    choices: [kernel, gpu, sglang, verify]
  version:
    type: str
    required: true
"""

EXAMPLES = r"""
- name: Record the converged phase
  provision_state:
    dir: /var/lib/provision
    phase: kernel
    version: 0.1.0
"""

RETURN = r"""
path: {description: the record file, type: str, returned: always}
"""

import json
import os
import tempfile

from ansible.module_utils.basic import AnsibleModule


def record_text(phase, version):
    # the same bytes as `to_nice_json` wrote before, so hosts converged by older releases stay unchanged
    data = {"phase": phase, "provision_version": version}
    return json.dumps(data, indent=4, sort_keys=True, separators=(",", ": "), ensure_ascii=False) + "\n"


def current(path):
    try:
        with open(path) as f:
            return f.read(), os.stat(path)
    except OSError:
        return None, None


def write(directory, path, text):
    if not os.path.isdir(directory):
        os.makedirs(directory, mode=0o755)
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=".provision-state-")
    with os.fdopen(fd, "w") as f:
        f.write(text)
    os.chmod(tmp, 0o644)
    os.chown(tmp, 0, 0)
    os.replace(tmp, path)


def main():
    module = AnsibleModule(
        argument_spec=dict(
            dir=dict(type="path", required=True),
            phase=dict(type="str", required=True, choices=["kernel", "gpu", "sglang", "verify"]),
            version=dict(type="str", required=True),
        ),
        supports_check_mode=True,
    )
    directory, phase = module.params["dir"], module.params["phase"]
    path = os.path.join(directory, phase + ".json")
    text = record_text(phase, module.params["version"])
    before, st = current(path)
    changed = before != text or (st.st_mode & 0o7777, st.st_uid, st.st_gid) != (0o644, 0, 0)
    result = dict(changed=changed, path=path)
    if module._diff and before != text:
        result["diff"] = dict(before=before or "", after=text, before_header=path, after_header=path)
    if changed and not module.check_mode:
        write(directory, path, text)
    module.exit_json(**result)


if __name__ == "__main__":
    main()
