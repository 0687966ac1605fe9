#!/usr/bin/python
"""Ansible module: record which provision release converged which phase, and the phase's
fingerprint, in one call."""

from __future__ import annotations

DOCUMENTATION = r"""
module: provision_state
short_description: Write <dir>/<phase>.json and the phase's fingerprint when they differ
author: provision maintainers (!UNKNOWN)
description:
  - "One call instead of a C(file) and a C(copy) task (each its own round trip): creates I(dir) (0755, root),
    compares the record with what is on the host, and writes it atomically (0644, root) only when it differs."
  - "With I(fingerprint), also records what the next run compares to skip a converged phase:
    C(<dir>/fingerprint/<name>.json) (0600, root, in a 0700 directory) holds the digest of the phase's inputs
    (computed on the controller), the paths the phase watches, and the digest of those paths as they are now
    (see C(provision_facts))."
  - "Writing the fingerprint alone is not reported as a change (nor shown as a diff): it is provision's memory of
    its own last run, not configuration of the host. A phase that ran and changed nothing stays C(changed=false)."
  - Supports check mode and diff mode.
options:
  dir:
    type: path
    required: true
    description: The state directory the records live in (the roles' C(provision_state_dir)).
  phase:
    type: str
    choices: [kernel, driver, gpu, sglang, gateway, verify]
    description: The phase whose record to write; without it only the fingerprint is written.
  version:
    type: str
    description: The provision release; required with I(phase).
  fingerprint:
    type: dict
    description: The fingerprint to record.
    suboptions:
      name: {type: str, required: true, description: "file name, e.g. C(gpu) or C(gpu@sglang-01)"}
      inputs: {type: str, required: true, description: digest of the phase's inputs}
      watch: {type: list, elements: str, required: true, description: paths and glob patterns the phase manages}
"""

EXAMPLES = r"""
- name: Record the converged phase
  provision_state:
    dir: /var/lib/provision
    phase: kernel
    version: 0.1.0
    fingerprint:
      name: kernel
      inputs: "{{ provision_state_inputs.kernel }}"
      watch: [/proc/cmdline, /etc/default/grub]
"""

RETURN = r"""
path: {description: the record file, type: str, returned: when phase is given}
fingerprint_path: {description: the fingerprint file, type: str, returned: when fingerprint is given}
fingerprint_written: {description: whether the fingerprint file was (or in check mode would be) written, type: bool,
                      returned: when fingerprint is given}
"""

import json
import os
import tempfile

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.provision.pve_sglang.plugins.module_utils.provision_fingerprint import digest, fingerprint_path
from ansible_collections.provision.pve_sglang.plugins.module_utils.provision_phases import PHASES


def record_text(phase, version):
    # the same bytes as `to_nice_json` wrote before, so hosts converged by older releases stay unchanged
    data = {"phase": phase, "provision_version": version}
    return json.dumps(data, indent=4, sort_keys=True, separators=(",", ": "), ensure_ascii=False) + "\n"


def fingerprint_text(fingerprint):
    data = dict(fingerprint, state=digest(fingerprint["watch"]))
    return json.dumps(data, indent=1, sort_keys=True) + "\n"


def current(path):
    try:
        with open(path) as f:
            return f.read(), os.stat(path)
    except OSError:
        return None, None


def make_dir(directory, mode):
    # several containers record their parts on one node at once: another may create it first
    os.makedirs(directory, mode=mode, exist_ok=True)
    os.chmod(directory, mode)


def write(path, text, mode, dir_mode):
    directory = os.path.dirname(path)
    if not os.path.isdir(directory) or os.stat(directory).st_mode & 0o7777 != dir_mode:
        make_dir(directory, dir_mode)
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=".provision-state-")
    with os.fdopen(fd, "w") as f:
        f.write(text)
    os.chmod(tmp, mode)
    os.chown(tmp, 0, 0)
    os.replace(tmp, path)


def converge(module, path, text, mode, dir_mode, result, diff=True):
    """Write `text` to `path` unless it is there already with this mode; True when it changed."""
    before, st = current(path)
    changed = before != text or (st.st_mode & 0o7777, st.st_uid, st.st_gid) != (mode, 0, 0)
    if diff and module._diff and before != text:
        diff_entry = dict(before=before or "", after=text, before_header=path, after_header=path)
        result.setdefault("diff", []).append(diff_entry)
    if changed and not module.check_mode:
        write(path, text, mode, dir_mode)
    return changed


def main():
    module = AnsibleModule(
        argument_spec=dict(
            dir=dict(type="path", required=True),
            phase=dict(type="str", choices=list(PHASES)),
            version=dict(type="str"),
            fingerprint=dict(
                type="dict",
                options=dict(
                    name=dict(type="str", required=True),
                    inputs=dict(type="str", required=True),
                    watch=dict(type="list", elements="str", required=True),
                ),
            ),
        ),
        required_by=dict(phase="version"),
        required_one_of=[("phase", "fingerprint")],
        supports_check_mode=True,
    )
    p = module.params
    result = dict(changed=False)
    if p["phase"]:
        result["path"] = os.path.join(p["dir"], p["phase"] + ".json")
        text = record_text(p["phase"], p["version"])
        result["changed"] |= converge(module, result["path"], text, 0o644, 0o755, result)
    if p["fingerprint"]:
        if not os.path.isdir(p["dir"]) and not module.check_mode:
            make_dir(p["dir"], 0o755)
        result["fingerprint_path"] = fingerprint_path(p["dir"], p["fingerprint"]["name"])
        text = fingerprint_text(p["fingerprint"])
        result["fingerprint_written"] = converge(module, result["fingerprint_path"], text, 0o600, 0o700, result, False)
    module.exit_json(**result)


if __name__ == "__main__":
    main()
