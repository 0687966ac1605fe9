#!/usr/bin/python
"""Ansible module (container): does this container's SGLang serve, and wait until it does again."""

from __future__ import annotations

DOCUMENTATION = r"""
module: sglang_serving
short_description: Whether a container's SGLang service serves; optionally wait until it answers again
author: provision maintainers (!UNKNOWN)
description:
  - Reads the service record the sglang role writes (C(<state_dir>/sglang-service.json)), which names the unit and its
    readiness URL on this host. A container without that record runs no SGLang of provision's, and is not serving.
  - Serving means the unit is active (C(systemctl is-active)) and its readiness URL answers 200. SGLang leaves its
    readiness paths open whatever its API key (sglang/srt/utils/auth.py), so no key is read or sent.
  - With I(wait) above 0, polls the readiness URL every second until it answers 200 and fails when I(wait) seconds
    pass first. The kernel phase waits this way, after a node's reboot, for each container that served before it,
    so that a rolling reboot never takes the next node while the last one's models are still loading.
  - It only reads, so check mode runs it as it is.
options:
  state_dir:
    type: path
    required: true
    description: provision's state directory in the container.
  wait:
    type: int
    default: 0
    description: Seconds to wait for the readiness URL to answer 200; 0 reads once.
  name:
    type: str
    description: The container's name in the inventory, for the failure message.
"""

EXAMPLES = r"""
- name: Note whether the container serves before its node reboots
  provision.pve_sglang.sglang_serving:
    state_dir: /var/lib/provision
  delegate_to: sglang-01
  register: serving

- name: Wait until it serves again
  provision.pve_sglang.sglang_serving:
    state_dir: /var/lib/provision
    wait: 900
  delegate_to: sglang-01
"""

RETURN = r"""
service: {description: "the unit's name, or null without a service record", type: str, returned: always}
ready_url: {description: the readiness URL on this host, type: str, returned: always}
active: {description: whether systemd reports the unit active, type: bool, returned: always}
ready: {description: whether the readiness URL answered 200 (at the last try), type: bool, returned: always}
serving: {description: active and ready, type: bool, returned: always}
waited_s: {description: seconds spent waiting, type: float, returned: always}
"""

import os
import time
import urllib.error

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.urls import ConnectionError as UrlsConnectionError
from ansible.module_utils.urls import open_url
from ansible_collections.provision.pve_sglang.plugins.module_utils.json_record import read_json

POLL_S = 1  # one local HTTP request a second: the reboot rollout waits on this before the next node goes


def answers(url: str) -> bool:
    try:
        with open_url(url, timeout=10) as response:
            return response.status == 200
    except (urllib.error.URLError, UrlsConnectionError, OSError, ValueError):
        return False


def main():
    module = AnsibleModule(
        argument_spec=dict(
            state_dir=dict(type="path", required=True), wait=dict(type="int", default=0), name=dict(type="str")
        ),
        supports_check_mode=True,
    )
    record = read_json(os.path.join(module.params["state_dir"], "sglang-service.json"))
    if not record or not record.get("ready_url"):
        module.exit_json(
            changed=False, service=None, ready_url="", active=False, ready=False, serving=False, waited_s=0.0
        )
    service, url = record["service"], record["ready_url"]
    start = time.monotonic()
    ready = answers(url)
    while not ready and time.monotonic() - start + POLL_S <= module.params["wait"]:
        time.sleep(POLL_S)
        ready = answers(url)
    waited = round(time.monotonic() - start, 1)
    active = module.run_command(["systemctl", "is-active", "--quiet", service])[0] == 0
    result = dict(
        changed=False,
        service=service,
        ready_url=url,
        active=active,
        ready=ready,
        serving=active and ready,
        waited_s=waited,
    )
    if module.params["wait"] > 0 and not ready:
        who = f"{module.params['name']}: " if module.params["name"] else ""
        module.fail_json(
            msg=f"{who}{service} did not serve again within {module.params['wait']}s ({url} does not "
            "answer 200); the rollout stops here, before the next node reboots",
            **result,
        )
    module.exit_json(**result)


if __name__ == "__main__":
    main()
