#!/usr/bin/python
"""Ansible module: bind-mount a node directory read-only into an LXC container (an mpN entry) via the PVE API."""

from __future__ import annotations

DOCUMENTATION = r"""
module: proxmox_lxc_mount
short_description: Bind-mount a node directory read-only into a Proxmox LXC container as an mpN entry
author: provision maintainers (!UNKNOWN)
description:
  - >-
    Reads the container config with its digest (pending changes merged in), keeps every other entry, and writes
    C(mpN: <host_path>,mp=<ct_path>,ro=1) into the entry that mounts something at I(ct_path), or the first free
    slot, with the digest; reads again and retries when PVE answers "detected modified configuration".
  - PVE hot-plugs a new mount point into a running CT (PVE 8 and 9); a changed one stays pending until the CT
    restarts. The running config (C(current=1)) decides; with I(restart=auto) a running CT that lacks the mount is
    rebooted through PVE, and the task's exitstatus checked. Check mode, which writes nothing, predicts the running
    config by the same rule (module_utils/lxc_mounts.py running_after_write), so it reports the restart exactly
    when apply would do one.
  - Bind mounts are root@pam's only (an API token is refused, HTTP 403); a host path that is not a directory on the
    node fails the hot-plug and PVE writes nothing. Each is one line naming the CT, node and path.
  - Login, retries and refusals are module_utils/pve_api.py's. Runs on the controller. Supports check mode and diff.
extends_documentation_fragment:
  - provision.pve_sglang.pve_api
  - provision.pve_sglang.attributes
options:
  node: {type: str, required: true, description: the container's PVE node.}
  vmid: {type: int, required: true, description: the container's VMID.}
  host_path: {type: path, required: true, description: the directory on the node.}
  ct_path: {type: path, required: true, description: where it appears in the container.}
  restart:
    type: str
    choices: [auto, never]
    default: auto
    description: reboot a running CT whose running config lacks the mount (a changed entry stays pending).
  task_timeout: {type: int, default: 300, description: seconds to wait for the reboot task.}
attributes:
  check_mode:
    support: full
  diff_mode:
    support: full
"""

EXAMPLES = r"""
- name: Mount the node's model directory into CT 101
  provision.pve_sglang.proxmox_lxc_mount:
    api_host: pve.example.net
    api_password: "{{ lookup('env', 'PROXMOX_PASSWORD') }}"
    node: pve1
    vmid: 101
    host_path: /srv/models/Qwen3-8B
    ct_path: /models/Qwen3-8B
  delegate_to: localhost
"""

RETURN = r"""
key: {description: the mpN entry that holds the mount, type: str, returned: always}
value: {description: its value after the run, type: str, returned: always}
set: {description: entries written, type: dict, returned: always}
pending: {description: whether the running CT lacks the mount after the run (or would), type: bool, returned: always}
restarted: {description: whether the CT was rebooted to apply it, type: bool, returned: always}
would_restart: {description: check mode - the CT would be rebooted to apply it, type: bool, returned: when true}
"""

import re

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.provision.pve_sglang.plugins.module_utils import lxc_mounts, pve_api
from ansible_collections.provision.pve_sglang.plugins.module_utils.pve_api import MODIFIED, ApiFailure, connect

NOT_A_DIRECTORY = re.compile(r"directory '([^']*)' does not exist")


def with_retries(p, what, call, explain=None):
    return pve_api.with_retries(p, what, call, explain, grant_on=f"/vms/{p['vmid']}")


def put_refused(p, exc):
    """PVE's refusals of a bind mount that say what to do (else None: pve_api's generic line)."""
    missing = NOT_A_DIRECTORY.search(f"{exc} {exc.errors or ''}")
    if missing:
        return ApiFailure(
            f"{missing.group(1)} is not a directory on node {p['node']}: make it there (sglang_model_source.path)"
        )
    if exc.status_code == 403:
        return ApiFailure(
            f"PVE refused the bind mount ({exc}): only root@pam may set one, and an API token is refused even for "
            "root@pam: use proxmox_api_user root@pam with proxmox_api_password"
        )
    return None


def write(module, ct, result):
    """Plan from the config (pending merged in) and PUT with its digest; again when the config changed between."""
    p = module.params
    ResourceException = pve_api.proxmoxer_modules()[1]
    for attempt in range(p["retries"] + 1):
        config = with_retries(p, "reading the container config", ct.config.get)
        plan = lxc_mounts.plan_mount(config, p["host_path"], p["ct_path"])
        result.update(key=plan["key"], value=plan["value"], set=plan["set"])
        if not plan["set"]:
            return plan
        result["changed"] = True
        if module._diff:
            header = f"CT {p['vmid']} {plan['key']} ({p['node']})"
            before = f"{plan['key']}: {plan['replaces']}\n" if plan.get("replaces") else ""
            result["diff"] = dict(
                before=before, after=f"{plan['key']}: {plan['value']}\n", before_header=header, after_header=header
            )
        if module.check_mode:
            return plan
        body = dict(plan["set"], digest=config["digest"])
        try:
            with_retries(p, "writing the mount point", lambda b=body: ct.config.put(**b), lambda e: put_refused(p, e))
            return plan
        except ResourceException as exc:
            if MODIFIED not in str(exc) or attempt == p["retries"]:
                raise
    raise ApiFailure(f"the container config kept changing underneath ({p['retries'] + 1} attempts)")


def apply_pending(module, api, ct, result, plan):
    """Reboot a running CT whose running config lacks the mount, when allowed. In check mode nothing was written:
    the running config is the one the write would leave (lxc_mounts.running_after_write)."""
    p = module.params
    running = with_retries(p, "reading the running config", lambda: ct.config.get(current=1))
    status = None
    if module.check_mode and plan["set"]:
        status = with_retries(p, "reading the container status", ct.status.current.get)
        running = lxc_mounts.running_after_write(running, plan, status.get("status") == "running")
    result["pending"] = not lxc_mounts.in_effect(running, p["host_path"], p["ct_path"])
    if not result["pending"]:
        return
    status = status or with_retries(p, "reading the container status", ct.status.current.get)
    if status.get("status") != "running" or p["restart"] != "auto":
        return  # the next start mounts it
    result["changed"] = True
    if module.check_mode:
        result.update(would_restart=True, pending=False)
        return
    upid = with_retries(p, "rebooting the container", ct.status.reboot.post)
    pve_api.wait_task(p, api, p["node"], upid, "the container's reboot", with_retries)
    result.update(restarted=True, pending=False)


def run(module):
    p = module.params
    result = dict(changed=False, restarted=False, pending=False, set={})
    api = with_retries(p, "logging in", lambda: connect(p))
    ct = api.nodes(p["node"]).lxc(p["vmid"])
    apply_pending(module, api, ct, result, write(module, ct, result))
    return result


def main():
    module = AnsibleModule(
        argument_spec=dict(
            pve_api.CT_ARGUMENT_SPEC,
            host_path=dict(type="path", required=True),
            ct_path=dict(type="path", required=True),
            restart=dict(type="str", choices=["auto", "never"], default="auto"),
            task_timeout=dict(type="int", default=300),
        ),
        supports_check_mode=True,
    )
    if not module.params["validate_certs"]:
        module.warn(pve_api.UNVERIFIED)
    where = f"CT {module.params['vmid']} on {module.params['node']}: "
    module.exit_json(**pve_api.run_module(module, where, run, failures=(ApiFailure, ValueError)))


if __name__ == "__main__":
    main()
