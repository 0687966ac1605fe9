"""The JSON object a command run through ansible.builtin.raw printed last, after whatever the login shell printed."""

from __future__ import annotations

from ansible.errors import AnsibleFilterError
from ansible_collections.provision.pve_sglang.plugins.module_utils.json_record import last_json_line


def raw_json(output):
    """`stdout | provision.pve_sglang.raw_json`: the JSON object on the output's last non-empty line."""
    try:
        return last_json_line(output)
    except ValueError as e:
        raise AnsibleFilterError(f"raw_json: {e}") from e


class FilterModule:
    def filters(self):
        return {"raw_json": raw_json}
