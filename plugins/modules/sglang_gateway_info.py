#!/usr/bin/python
"""Ansible module: read SGLang's gateway on its host, its readiness and its workers (read-only)."""

from __future__ import annotations

DOCUMENTATION = r"""
module: sglang_gateway_info
short_description: Read SGLang's gateway (smg) on its host - whether it runs, its readiness and its workers
author: provision maintainers (!UNKNOWN)
description:
  - Asks the gateway's C(/liveness), C(/readiness) and C(/workers) (smg 1.13's routes), on the host it runs on.
  - C(/workers) needs the control-plane admin key where the gateway has one; the module reads it from
    I(control_key_file), so the key never leaves the host.
options:
  timeout:
    description: Seconds each request may take.
    type: float
    default: 10
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
- name: Read the gateway's workers
  provision.pve_sglang.sglang_gateway_info:
    url: http://127.0.0.1:30000
    control_key_file: /etc/sglang-gateway/control-plane-key
  register: gateway

- name: Read the gateway that the sglang_gateway role set up on sglang-gw
  provision.pve_sglang.sglang_gateway_info:
    record: /var/lib/provision/sglang-gateway.json
  delegate_to: sglang-gw
  register: gateway
"""

RETURN = r"""
url:
  description: The gateway's URL that was asked.
  type: str
  returned: always
running:
  description: Whether the gateway answered on C(/liveness).
  type: bool
  returned: always
readiness:
  description: C(/readiness) with C(ready) (its status was 200), C(healthy_workers) and C(total_workers) or C(reason).
  type: dict
  returned: when running
workers:
  description: Each registered worker.
  type: list
  elements: dict
  returned: when running
  contains:
    id: {description: the gateway's id of the worker, type: str}
    url: {description: the worker's URL, type: str}
    model: {description: "the model the worker serves, as the gateway read it", type: str}
    status: {description: "pending, ready, not_ready, failed or draining", type: str}
    healthy: {description: whether its health checks pass, type: bool}
    load: {description: the requests the gateway has in flight there, type: int}
"""

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.provision.pve_sglang.plugins.module_utils.sglang_gateway import (
    ARGUMENT_SPEC,
    Gateway,
    GatewayError,
    connect,
    settings,
)


def read(gateway: Gateway) -> dict:
    if not gateway.running():
        return {"running": False}
    return {"running": True, "readiness": gateway.readiness(), "workers": gateway.workers()}


def main():
    module = AnsibleModule(
        argument_spec=dict(
            **ARGUMENT_SPEC,
            timeout=dict(type="float", default=10),
        ),
        supports_check_mode=True,
    )
    p = module.params
    try:
        where = settings(p["url"], p["control_key_file"], p["record"])
        if p["record"] and not where["recorded"] and not p["url"]:
            module.exit_json(changed=False, running=False, url=where["url"])
        found = read(connect(where["url"], where["control_key_file"], p["timeout"]))
    except GatewayError as e:
        module.fail_json(msg=str(e))
    module.exit_json(changed=False, url=where["url"], **found)


if __name__ == "__main__":
    main()
