#!/usr/bin/python
"""Ansible module: add a worker to SGLang's gateway, or take it out, and wait for the effect."""

from __future__ import annotations

DOCUMENTATION = r"""
module: sglang_gateway_worker
short_description: Add a worker to SGLang's gateway (smg), or take it out, on the gateway's host
author: provision maintainers (!UNKNOWN)
description:
  - C(present) registers the worker through C(POST /workers) with the workers' API key, unless the gateway lists it,
    then waits until the gateway counts it ready and healthy.
  - C(absent) removes it through C(DELETE /workers/<id>) and waits until it is gone. From the removal on the gateway
    sends it no new request; the requests it is serving finish (smg drains it, then drops it from the list).
  - Run on the gateway's host, which holds the keys (I(control_key_file), I(secrets_file)); no key leaves it. With
    a I(record) that is missing (the gateway is not set up yet), it changes nothing.
options:
  worker:
    description: The worker's URL as the gateway reaches it (C(http://address:port)).
    type: str
    required: true
  state:
    description: Whether the gateway should send requests to the worker.
    type: str
    choices: [present, absent]
    default: present
  secrets_file:
    description:
      - The gateway's JSON file whose C(api_key) the worker is registered with (the workers' key); unset - from
        I(record), else none.
    type: path
  api_key:
    description:
      - The key the gateway registers the worker with, where it is not the one in I(secrets_file) - a worker whose key
        changed, before its gateway's next restart takes the new one.
    type: str
  wait_timeout:
    description: Seconds to wait for the worker to be ready (C(present)) or gone (C(absent)); 0 does not wait.
    type: float
    default: 120
extends_documentation_fragment:
  - provision.pve_sglang.sglang_gateway
  - provision.pve_sglang.attributes
attributes:
  check_mode:
    support: full
  diff_mode:
    support: none
"""

EXAMPLES = r"""
- name: Take sglang-01 out of the gateway before its server restarts
  provision.pve_sglang.sglang_gateway_worker:
    worker: http://10.0.0.11:30000
    state: absent
    control_key_file: /etc/sglang-gateway/control-plane-key
  delegate_to: sglang-gw

- name: Put it back, and wait until the gateway counts it healthy
  provision.pve_sglang.sglang_gateway_worker:
    worker: http://10.0.0.11:30000
    control_key_file: /etc/sglang-gateway/control-plane-key
    secrets_file: /etc/sglang-gateway/secrets.json
  delegate_to: sglang-gw
"""

RETURN = r"""
worker:
  description: The gateway's view of the worker once the module is done (none when it is not listed).
  type: dict
  returned: always
seconds:
  description: How long the change and the wait took.
  type: float
  returned: always
"""

import json
import time

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.provision.pve_sglang.plugins.module_utils.sglang_gateway import (
    ARGUMENT_SPEC,
    Gateway,
    GatewayError,
    connect,
    settings,
)


def _api_key(module: AnsibleModule, path: str | None) -> str:
    if not path:
        return ""
    try:
        with open(path, encoding="utf-8") as f:
            return str(json.load(f).get("api_key") or "")
    except (OSError, ValueError) as e:
        module.fail_json(msg=f"cannot read the gateway's API key from {path}: {e}")


def converge(module: AnsibleModule, gateway: Gateway, secrets_file: str | None) -> tuple[bool, dict | None]:
    p = module.params
    present, seen = p["state"] == "present", gateway.find(p["worker"])
    changed = (seen is None) == present
    if changed and not module.check_mode:
        if present:
            gateway.add(p["worker"], p["api_key"] or _api_key(module, secrets_file))
        else:
            gateway.remove(seen["id"])
    if module.check_mode or p["wait_timeout"] <= 0:
        return changed, seen
    return changed, gateway.wait(p["worker"], present, p["wait_timeout"])


def main():
    module = AnsibleModule(
        argument_spec=dict(
            worker=dict(type="str", required=True),
            state=dict(type="str", choices=["present", "absent"], default="present"),
            **ARGUMENT_SPEC,
            secrets_file=dict(type="path", no_log=False),
            api_key=dict(type="str", no_log=True),
            wait_timeout=dict(type="float", default=120),
        ),
        supports_check_mode=True,
    )
    p = module.params
    start = time.monotonic()
    try:
        where = settings(p["url"], p["control_key_file"], p["record"])
        if p["record"] and not where["recorded"] and not p["url"]:  # the gateway is not set up: nothing to change
            module.exit_json(changed=False, worker=None, seconds=0.0)
        gateway = connect(where["url"], where["control_key_file"])
        changed, worker = converge(module, gateway, p["secrets_file"] or where["secrets_file"])
    except GatewayError as e:
        module.fail_json(msg=str(e), seconds=round(time.monotonic() - start, 1))
    module.exit_json(changed=changed, worker=worker, seconds=round(time.monotonic() - start, 1))


if __name__ == "__main__":
    main()
