#!/usr/bin/python
"""Ansible module (container): take the server's credentials out of SGLang's benchmark JSONL, in place."""

from __future__ import annotations

DOCUMENTATION = r"""
module: sglang_bench_results
short_description: Take the API key out of the JSONL that SGLang's benchmark client wrote
author: provision maintainers (!UNKNOWN)
description:
  - SGLang's benchmark client copies the server's C(/server_info) into every line of its C(--output-file), and
    SGLang 0.5.23 returns the API key there, as C(api_key) and inside C(launch_command).
  - This module rewrites the file without them, atomically and root-only (0600), so that the container keeps no
    copy of the key once the sweep is over. Lines that are not JSON (a last line cut short) are left out and
    their numbers returned, since their credentials cannot be taken out.
  - The same rule reads the fetched copy on the controller (module_utils bench_results).
options:
  path:
    type: path
    required: true
    description: The client's JSONL file. A missing file is no change.
"""

EXAMPLES = r"""
- name: Take the API key out of the results
  provision.pve_sglang.sglang_bench_results:
    path: /var/lib/provision/bench/run-1/results.jsonl
"""

RETURN = r"""
dropped:
  description: Numbers of the lines that were not JSON and were left out.
  type: list
  elements: int
  returned: always
"""

import os
import tempfile

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.provision.pve_sglang.plugins.module_utils.bench_results import scrub_jsonl


def rewrite(path, text):
    """Replace `path` with `text`, root-only, never half-written."""
    fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path), prefix=".results.")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        os.chmod(tmp, 0o600)
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise


def main():
    module = AnsibleModule(argument_spec=dict(path=dict(type="path", required=True)), supports_check_mode=True)
    path = module.params["path"]
    if not os.path.isfile(path):
        module.exit_json(changed=False, dropped=[])
    with open(path, encoding="utf-8", errors="replace") as f:
        before = f.read()
    after, dropped = scrub_jsonl(before)
    changed = after != before
    if changed and not module.check_mode:
        rewrite(path, after)
    module.exit_json(changed=changed, dropped=dropped)


if __name__ == "__main__":
    main()
