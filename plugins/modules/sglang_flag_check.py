#!/usr/bin/python
"""Ansible module (controller): check server flags against a pinned SGLang release's own flag list."""

from __future__ import annotations

DOCUMENTATION = r"""
module: sglang_flag_check
short_description: Fail on flags the pinned SGLang release does not have, before anything is rendered
author: provision maintainers (!UNKNOWN)
description:
  - Reads the flag list from the sglang wheel's source (no torch, no GPU needed; see
    plugins/module_utils/sglang_flags.py), looking for the wheel in I(wheel_dirs) and downloading it
    (pip download --no-deps) into the first one when it is missing. Unique prefixes are accepted, as argparse
    accepts them.
options:
  version: {type: str, required: true, description: the pinned SGLang release}
  args: {type: list, elements: str, required: true, description: the server's command-line arguments to check}
  wheel_dirs:
    type: list
    elements: path
    required: true
    description: where to look for the release's wheel; a missing one is downloaded into the first
  index_url: {type: str, description: the package index to download the wheel from (pip's default where unset)}
"""

EXAMPLES = r"""
- name: Fail on a server flag SGLang 0.5.23 does not have, on the controller
  provision.pve_sglang.sglang_flag_check:
    version: 0.5.23
    args: [--model-path, /srv/models/qwen, --tp-size, "2", --disable-custom-all-reduce]
    wheel_dirs: [~/.cache/provision/wheels]
  delegate_to: localhost
"""

RETURN = r"""
wheel: {description: the wheel whose source was read, type: str, returned: always}
flags_known: {description: how many flags the release has, type: int, returned: always}
"""

import glob
import os
import sys

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.provision.pve_sglang.plugins.module_utils.sglang_flags import flags_from_wheel, unknown_flags


def find_or_fetch(module, version, dirs, index_url):
    for d in dirs:
        found = sorted(glob.glob(os.path.join(d, f"sglang-{version}-*.whl")))
        if found:
            return found[0]
    target = dirs[0]
    os.makedirs(target, exist_ok=True)
    cmd = [
        sys.executable,
        "-m",
        "pip",
        "download",
        "--quiet",
        "--no-deps",
        "--only-binary=:all:",
        "--python-version",
        "3.11",
        "--platform",
        "manylinux_2_34_x86_64",
        "-d",
        target,
        f"sglang=={version}",
    ]
    if index_url:
        cmd[4:4] = ["--index-url", index_url]
    rc, out, err = module.run_command(cmd)
    found = sorted(glob.glob(os.path.join(target, f"sglang-{version}-*.whl")))
    if rc != 0 or not found:
        module.fail_json(
            msg=f"cannot get the sglang {version} wheel to check flags (looked in {', '.join(dirs)}; "
            f"pip download: {(err or out).strip()[-300:]})"
        )
    return found[0]


def main():
    module = AnsibleModule(
        argument_spec=dict(
            version=dict(type="str", required=True),
            args=dict(type="list", elements="str", required=True),
            wheel_dirs=dict(type="list", elements="path", required=True),
            index_url=dict(type="str"),
        ),
        supports_check_mode=True,
    )
    p = module.params
    wheel = find_or_fetch(module, p["version"], p["wheel_dirs"], p["index_url"])
    known = flags_from_wheel(wheel)
    unknown = unknown_flags(p["args"], known)
    if unknown:
        module.fail_json(
            msg=f"SGLang {p['version']} has no flag {', '.join(unknown)} (checked against {os.path.basename(wheel)}); "
            "check sglang_extra_args and the role's variables",
            unknown=unknown,
        )
    module.exit_json(changed=False, wheel=wheel, flags_known=len(known))


if __name__ == "__main__":
    main()
