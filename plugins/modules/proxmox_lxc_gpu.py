#!/usr/bin/python
"""Ansible module: put a host's NVIDIA device nodes into an LXC container's devN entries via the PVE API."""

from __future__ import annotations

DOCUMENTATION = r"""
module: proxmox_lxc_gpu
short_description: Pass NVIDIA device nodes into a Proxmox LXC container as devN entries (proxmoxer)
author: provision maintainers (!UNKNOWN)
description:
  - Reads the container config with its digest, keeps unrelated devN/mpN/... entries, puts the NVIDIA
    entries into free slots and writes with the digest, retrying a bounded number of times when PVE answers
    "detected modified configuration". Restarts the container only when a change is left pending (PVE 8, or an
    edited entry on PVE 9; a new entry hot-plugs on PVE 9). Waits for every task and checks its exitstatus.
  - A call the network lost or PVE answered with 5xx/59x is retried with backoff; a reboot whose answer was lost is
    looked for (a running reboot task of the CT, or the change in its running config) before it is asked for again.
    Every failure is one line naming the CT and node and saying what to do. The login, the retries and the
    refusals are module_utils/pve_api.py's, shared with every module that calls the API.
  - Runs on the controller. Supports check mode and diff. Passwords and token secrets are never returned.
extends_documentation_fragment:
  - provision.pve_sglang.pve_api
options:
  backend: {type: str, choices: [https, ssh], default: https, description: ssh runs pvesh on the node as root}
  ssh_host: {type: str, description: the node's address for the ssh backend}
  ssh_port: {type: int, default: 22, description: its ssh port}
  ssh_user: {type: str, default: root, description: the user pvesh runs as (root)}
  ssh_private_key_file: {type: path, description: the key the ssh backend logs in with}
  ssh_known_hosts: {type: path, description: known_hosts file; unknown or changed host keys are refused}
  node: {type: str, required: true, description: the PVE node the container lives on}
  vmid: {type: int, required: true, description: the container's VMID}
  state:
    type: str
    choices: [present, absent]
    default: present
    description:
      - C(present) puts the selected GPUs' entries in; C(absent) deletes every NVIDIA devN entry of the CT (other
        devN entries stay) and leaves its features as they are (C(provision retire)).
  nodes:
    type: list
    elements: dict
    description: "the host's device nodes (path, type, mode); needed with state=present"
  gpus:
    type: raw
    default: all
    description:
      - C(all), or a list of GPU indices.
  mode: {type: str, default: "0666", description: the devN entries' mode}
  uid: {type: int, description: the owner of the nodes in the container (PVE's default where unset)}
  gid: {type: int, description: their group in the container (PVE's default where unset)}
  restart:
    type: str
    choices: [auto, never]
    default: auto
    description: auto restarts a running container for a change PVE left pending; never leaves it pending.
  nesting:
    type: bool
    default: true
    description: "set features: nesting=1, which systemd needs to sandbox units in an unprivileged CT"
  task_timeout: {type: int, default: 300, description: seconds to wait for each PVE task}
"""

EXAMPLES = r"""
- name: Pass all GPUs into CT 101
  proxmox_lxc_gpu:
    api_host: pve.example.net
    api_user: root@pam
    api_password: "{{ lookup('env', 'PROXMOX_PASSWORD') }}"
    node: pve1
    vmid: 101
    nodes: "{{ discovered_nodes }}"

- name: Take every NVIDIA devN entry out of CT 101 again, and restart it if it runs
  proxmox_lxc_gpu:
    api_host: pve.example.net
    api_user: root@pam
    api_password: "{{ lookup('env', 'PROXMOX_PASSWORD') }}"
    node: pve1
    vmid: 101
    state: absent
"""

RETURN = r"""
entries: {description: devN -> value of the NVIDIA entries after the run, type: dict, returned: always}
set: {description: entries written, type: dict, returned: always}
deleted: {description: entries deleted, type: list, returned: always}
restarted: {description: whether the container was rebooted to apply pending changes, type: bool, returned: always}
pending: {description: device paths whose devN entry the running CT does not have yet, type: list, returned: always}
nesting_pending: {description: whether the running CT lacks features nesting=1, type: bool, returned: always}
"""

import re

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.provision.pve_sglang.plugins.module_utils import pve_api
from ansible_collections.provision.pve_sglang.plugins.module_utils.gpu_devices import (
    DeviceError,
    desired_entries,
    is_ours,
    parse_entry,
    plan,
    select_nodes,
)
from ansible_collections.provision.pve_sglang.plugins.module_utils.pve_api import (
    DEVICE_MISSING,
    MODIFIED,
    ApiFailure,
    TaskFailed,
    connect,
    lost_connection,
)

TOKEN_DEVN_HELP = (
    "PVE lets only root@pam change devN entries, and an API token ({token}) is refused even when it belongs to "
    "root@pam (HTTP 403). Use a ticket login instead (proxmox_api_user: root@pam with proxmox_api_password from "
    "the environment or vault, and no proxmox_api_token_id), or gpu_passthrough_api_backend: ssh, which runs "
    "pvesh on the node as root over ssh with its host key checked"
)
# PVE's config lock taken by another task (pve-common lock_file's timeout), or the CT's lock property (vzdump)
LOCKED = re.compile(r"can't lock file '[^']*' - got timeout|CT is locked")
IN_EFFECT = "in effect: PVE's answer to the reboot was lost, the running config has the change"
LOCK_HELD = "another task holds CT {vmid}'s lock (a backup, snapshot or migration): run again once it has ended"


def with_retries(p, what, call, explain=None):
    """pve_api.with_retries for this CT: a 403 names /vms/<vmid>, a lock still held at the end says who holds it."""
    return pve_api.with_retries(
        p,
        what,
        call,
        explain,
        grant_on=f"/vms/{p['vmid']}",
        still_failing=lambda last: LOCK_HELD.format(vmid=p["vmid"]) if LOCKED.search(str(last)) else None,
    )


def wait_task(p, api, node, upid, what):
    """pve_api.wait_task with this CT's retries; past task_timeout the error names gpu_passthrough_task_timeout."""
    return pve_api.wait_task(p, api, node, upid, what, with_retries, "gpu_passthrough_task_timeout")


def wanted_features(features, nesting):
    """The CT's `features` string with nesting=1 added (other flags kept), or None when nothing is to change."""
    parts = [f for f in str(features or "").split(",") if f]
    flags = dict(f.split("=", 1) if "=" in f else (f, "") for f in parts)
    if not nesting or flags.get("nesting") == "1":
        return None
    flags["nesting"] = "1"
    return ",".join(f"{key}={value}" for key, value in sorted(flags.items()))


def diff_lines(entries):
    return "".join(f"{k}: {v}\n" for k, v in sorted(entries.items(), key=lambda kv: int(kv[0][3:])))


def write_config(p, ct, config, body):
    """PUT the change with the config's digest; PVE's refusals become one-line errors (`put_refused`)."""
    with_retries(
        p,
        "writing the container config",
        lambda: ct.config.put(**dict(body, digest=config["digest"])),
        explain=lambda exc: put_refused(p, exc),
    )


def put_refused(p, exc):
    """What to do about PVE's refusal of the devN change, for the refusals PVE's devN rules explain (else None)."""
    missing = DEVICE_MISSING.search(str(exc))
    if missing:  # LXC/Tools.pm get_device_mode_and_rdev: the path is not on the node; no retry helps
        return ApiFailure(
            f"PVE refused devN for {missing.group(1)}: it does not exist on node {p['node']}. Make it there first "
            "(the gpu phase's provision-nvidia-nodes.service does at boot) or leave that GPU out "
            "(gpu_passthrough_gpus)"
        )
    if exc.status_code == 403 and p["api_token_id"] and p["backend"] == "https":
        return ApiFailure(TOKEN_DEVN_HELP.format(token=f"{p['api_user']}!{p['api_token_id']}"))
    if exc.status_code == 403:
        return ApiFailure(
            f"PVE refused the devN change ({exc}): only root@pam may change devN entries: set proxmox_api_user: "
            "root@pam, then run again"
        )
    if exc.status_code == 400 and unknown_devn(exc.errors):
        return ApiFailure(
            f"PVE on node {p['node']} does not know devN entries (they came with PVE 8.1, pve-container 5.0.7): "
            "upgrade the node to PVE 8.1 or later, then run again"
        )
    if exc.status_code == 400:
        return ApiFailure(f"PVE rejected the devN entries: {exc} {exc.errors or ''}")
    return None


def unknown_devn(errors):
    """Whether PVE's parameter check refused a devN key as unknown to its schema (PVE before 8.1: JSONSchema's
    "property is not defined in schema and the schema does not allow additional properties")."""
    if not isinstance(errors, dict):
        return False
    return any(re.fullmatch(r"dev\d+", key) and "not defined in schema" in str(why) for key, why in errors.items())


def run(module):
    """Plan the CT's devN entries and nesting, write them with the config's digest, then restart for what is
    pending."""
    p = module.params
    wanted = {}  # state=absent: no NVIDIA entry is wanted, so plan() deletes every one
    if p["state"] == "present":
        gpus = p["gpus"]
        if isinstance(gpus, str) and gpus != "all":
            gpus = [g for g in gpus.split(",") if g.strip()]
        wanted = desired_entries(select_nodes(p["nodes"], gpus), p["mode"], p["uid"], p["gid"])
    else:
        p["nesting"] = False  # a retired CT keeps its features: other software in it may need nesting
    api = with_retries(p, "logging in", lambda: connect(p))
    ct = api.nodes(p["node"]).lxc(p["vmid"])
    result = write_with_digest(module, api, ct, wanted)
    return restart_for_pending(module, api, ct, wanted, result)


def write_with_digest(module, api, ct, wanted):
    """Read the config, plan, and PUT the change with the digest read; when the config changed in between (PVE
    refuses the digest), read and plan again, up to `retries` more times."""
    p = module.params
    ResourceException = pve_api.proxmoxer_modules()[1]
    result = dict(changed=False, restarted=False, set={}, deleted=[], attempts=0)
    for attempt in range(1, p["retries"] + 2):
        # GET config merges pending changes in; what the CT runs with is current=1 (pve-guest-common
        # load_current_config). Write towards the merged view; restart while the running one differs.
        config = with_retries(p, "reading the container config", ct.config.get)
        body = plan_body(module, config, wanted, result, attempt)
        if body is None:
            return result
        try:
            write_config(p, ct, config, body)
            return result
        except ResourceException as exc:
            if MODIFIED in str(exc) and attempt <= p["retries"]:
                continue  # someone changed the config between our read and write: read again
            raise
    raise ApiFailure(f"the container config kept changing underneath ({p['retries'] + 1} attempts)")


def plan_body(module, config, wanted, result, attempt):
    """The PUT body that brings `config` to the wanted entries and nesting, the plan noted in `result` (with a
    diff when asked); None when nothing is to change, or in check mode."""
    p = module.params
    change = plan(config, wanted)
    features = wanted_features(config.get("features"), p["nesting"])
    result["entries"] = {k: v for k, v in change["after"].items() if is_ours(parse_entry(v).get("path", ""))}
    if not change["set"] and not change["delete"] and features is None:
        return None
    result.update(changed=True, set=change["set"], deleted=change["delete"], attempts=attempt)
    if features is not None:
        result["features"] = features
    if module._diff:
        header = f"CT {p['vmid']} devN ({p['node']})"
        result["diff"] = dict(
            before=diff_lines(change["before"]),
            after=diff_lines(change["after"]),
            before_header=header,
            after_header=header,
        )
    if module.check_mode:
        return None
    body = dict(change["set"])
    if features is not None:
        body["features"] = features
    if change["delete"]:
        body["delete"] = ",".join(change["delete"])
    return body


def left_pending(running, wanted, nesting):
    """What the running config (current=1) lacks: the device paths whose entries differ, and whether nesting."""
    in_effect = plan(running, wanted)
    paths = {parse_entry(v)["path"] for v in in_effect["set"].values()}
    paths |= {parse_entry(running[k]).get("path", k) for k in in_effect["delete"]}
    return sorted(paths), wanted_features(running.get("features"), nesting) is not None


def restart_for_pending(module, api, ct, wanted, result):
    """Reboot a running CT whose running config lacks our entries or nesting (PVE 8 applies no devN change
    hot; PVE 9 only adds new ones; features always wait). Left as is when asked not to, and said."""
    p = module.params
    running = with_retries(p, "reading the running config", lambda: ct.config.get(current=1))
    result["pending"], result["nesting_pending"] = left_pending(running, wanted, p["nesting"])
    if not result["pending"] and not result["nesting_pending"]:
        return result
    status = with_retries(p, "reading the container status", ct.status.current.get)
    if status.get("status") != "running":
        return result  # the next start applies them
    if p["restart"] == "auto" and module.check_mode:
        result.update(changed=True, would_restart=True)
    elif p["restart"] == "auto":
        result["restart_exitstatus"] = reboot(p, api, ct, wanted)
        result.update(restarted=True, changed=True, pending=[], nesting_pending=False)
    elif result["nesting_pending"] and not module.check_mode:
        raise ApiFailure(
            "the container runs without features: nesting=1 (now set, pending until it restarts); systemd in the "
            f"container cannot sandbox the SGLang unit without it. Restart it (pct reboot {p['vmid']} on "
            f"{p['node']}) and run again, or set gpu_passthrough_restart: auto"
        )
    return result


def reboot(p, api, ct, wanted):
    """Reboot the CT through PVE, wait for the task and return its exitstatus. When the network lost PVE's
    answer, the task may be under way or done: that is looked for before asking again, so that the container
    is not rebooted twice (a second outage)."""
    lost = []

    def attempt():
        started = started_reboot(p, api, ct, wanted) if lost else None
        if started:
            return started
        try:
            return ct.status.reboot.post()
        except Exception as exc:
            if lost_connection(exc):
                lost.append(exc)
            raise

    upid = with_retries(p, "rebooting the container", attempt)
    if upid == IN_EFFECT:
        return IN_EFFECT
    try:
        return wait_task(p, api, p["node"], upid, "the container's reboot")
    except TaskFailed as exc:
        raise ApiFailure(
            f"{exc}; the devN entries are written and wait for a restart: run again, or reboot it yourself "
            f"(pct reboot {p['vmid']} on {p['node']})"
        ) from exc


def started_reboot(p, api, ct, wanted):
    """After a lost answer: the UPID of a reboot task of the CT still running, IN_EFFECT when the running config
    has everything (the reboot has been), or None (PVE never started it)."""
    tasks = api.nodes(p["node"]).tasks.get(vmid=p["vmid"], typefilter="vzreboot", source="active")
    running = [t["upid"] for t in tasks if t.get("type") == "vzreboot" and t.get("status", "running") == "running"]
    if running:
        return running[0]
    pending, nesting = left_pending(ct.config.get(current=1), wanted, p["nesting"])
    return IN_EFFECT if not pending and not nesting else None


def main():
    module = AnsibleModule(
        argument_spec=dict(
            pve_api.CT_ARGUMENT_SPEC,
            backend=dict(type="str", choices=["https", "ssh"], default="https"),
            ssh_host=dict(type="str"),
            ssh_port=dict(type="int", default=22),
            ssh_user=dict(type="str", default="root"),
            ssh_private_key_file=dict(type="path"),
            ssh_known_hosts=dict(type="path"),
            state=dict(type="str", choices=["present", "absent"], default="present"),
            nodes=dict(type="list", elements="dict"),
            gpus=dict(type="raw", default="all"),
            mode=dict(type="str", default="0666"),
            uid=dict(type="int"),
            gid=dict(type="int"),
            restart=dict(type="str", choices=["auto", "never"], default="auto"),
            nesting=dict(type="bool", default=True),
            task_timeout=dict(type="int", default=300),
        ),
        supports_check_mode=True,
        required_if=[("state", "present", ("nodes",))],
    )
    if not module.params["validate_certs"] and module.params["backend"] == "https":
        module.warn(pve_api.UNVERIFIED)
    where = f"CT {module.params['vmid']} on {module.params['node']}: "
    module.exit_json(**pve_api.run_module(module, where, run, failures=(ApiFailure, DeviceError)))


if __name__ == "__main__":
    main()
