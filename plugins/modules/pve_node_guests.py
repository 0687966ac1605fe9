#!/usr/bin/python
"""Ansible module: before a Proxmox VE node reboots, read its guests, its cluster's quorum and HA state through the
PVE API, and refuse a reboot that would take down guests the inventory does not own."""

from __future__ import annotations

DOCUMENTATION = r"""
module: pve_node_guests
short_description: Check a Proxmox VE node's guests, quorum and HA state before it reboots (proxmoxer)
author: provision maintainers (!UNKNOWN)
description:
  - Lists the node's VMs and containers (C(GET /nodes/{node}/qemu) and C(/lxc)), reads whether it is in a cluster
    and that cluster's quorum (C(GET /cluster/status)), and on a cluster which guests HA manages
    (C(GET /cluster/resources), their C(hastate)).
  - Fails, with one line naming them, while a guest runs on the node that is not one of the inventory's own
    containers (I(owned)), unless I(running_guests=allow); while the cluster has no quorum; and while HA manages
    one of the inventory's own containers on the node, whose GPUs stay on the node while maintenance mode would
    relocate it (pve-ha-manager). In check mode it fails for none of them and returns the reason in C(refusal).
  - PVE lists only the guests a user may audit (VM.Audit on C(/vms/<vmid>)), so the API user must hold VM.Audit on
    C(/vms), propagated (C(GET /access/permissions)); without it the module fails rather than miss a guest.
  - With I(wait_ha_away), once the caller has put the node in HA maintenance mode (C(ha-manager crm-command
    node-maintenance enable), which PVE offers on the command line only), waits until no guest HA manages still runs
    on the node, and fails when one still does after that many seconds.
  - Reads only; runs on the controller. The login, the retries (API down, 5xx/59x, connection lost) and PVE's
    refusals are module_utils/pve_api.py's, as for proxmox_lxc_gpu.
attributes:
  check_mode: {support: full, description: "reads only; in check mode a refusal is returned, not failed"}
  diff_mode: {support: none, description: nothing is changed}
extends_documentation_fragment:
  - provision.pve_sglang.pve_api
  - provision.pve_sglang.attributes
options:
  node: {type: str, required: true, description: the node's name in PVE}
  owned:
    type: list
    elements: int
    default: []
    description: VMIDs of the inventory's own containers on this node (gpu_containers hosts that name it)
  running_guests:
    type: str
    choices: [refuse, allow]
    default: refuse
    description: refuse, or allow, a reboot while other guests run on the node (they go down with it)
  wait_ha_away:
    type: int
    default: 0
    description: seconds to wait for the guests HA manages to leave the node (0 - do not wait)
"""

EXAMPLES = r"""
- name: Refuse to reboot pve1 while a guest that is not ours runs on it
  pve_node_guests:
    api_host: pve1.example.net
    api_password: "{{ lookup('env', 'PROXMOX_PASSWORD') }}"
    node: pve1
    owned: [101]
  delegate_to: localhost
"""

RETURN = r"""
guests:
  description: "the node's guests by VMID: type (qemu or lxc), vmid, name, status, ha (HA state or null)"
  type: list
  returned: always
running: {description: running guests as "VM 105 (name)" or "CT 101 (name)", type: list, returned: always}
foreign_running: {description: the running guests the inventory does not own, type: list, returned: always}
cluster: {description: "name, quorate and nodes of the node's cluster; null for a node in no cluster", type: dict,
          returned: always}
ha_managed: {description: the node's guests that HA manages (a cluster only), type: list, returned: always}
refusal: {description: why the node must not reboot now (empty when it may), type: str, returned: always}
"""

import time

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.provision.pve_sglang.plugins.module_utils import pve_api
from ansible_collections.provision.pve_sglang.plugins.module_utils.pve_api import ApiFailure, with_retries

POLL_S = 5
KINDS = (("qemu", "VM", "VMs"), ("lxc", "CT", "containers"))
NO_API = (
    "proxmox_api_host is not set: before a node reboots, the kernel phase reads its guests, its cluster's quorum and "
    "HA state through the PVE API: set the proxmox_api_* variables (or kernel_cmdline_reboot: never)"
)
# PVE answers GET /access/permissions?path=/vms for that path (pve-access-control API2/AccessControl.pm
# permissions); fakepve for the ACL path that grants it, "/"
AUDIT_PATHS = ("/vms", "/")
HA_NOT_ACTING = ("ignored",)


def label(guest):
    """A guest as messages name it: "VM 105 (snp-tenant)", "CT 101 (sglang)"."""
    kind = dict((k, word) for k, word, _plural in KINDS)[guest["type"]]
    return f"{kind} {guest['vmid']}" + (f" ({guest['name']})" if guest.get("name") else "")


def foreign(guests, owned):
    """The running guests that are not the inventory's own containers."""
    mine = {int(v) for v in owned}
    return [g for g in guests if g["status"] == "running" and not (g["type"] == "lxc" and g["vmid"] in mine)]


def refusal(node, cluster, strangers, running_guests, own_ha=(), disarmed=None):
    """Why `node` must not reboot now, as one line (empty: it may). `disarmed`: (the HA stack's disarm, the node's
    guests) where it is disarmed: maintenance mode would move none of them."""
    reasons = [disarmed_reason(*disarmed)] if disarmed else []
    if own_ha:
        resources = ", ".join(f"{label(g)} (HA resource ct:{g['vmid']}, {g['ha']})" for g in own_ha)
        reasons.append(
            f"the inventory's GPU containers are managed by HA: {resources}; HA maintenance mode would relocate them "
            "to another node, which may not have their GPUs: take them out of HA (ha-manager remove ct:<vmid>, or "
            "set their state to ignored) before the reboot"
        )
    if cluster and not cluster["quorate"]:
        reasons.append(
            f"its cluster {cluster['name']} has no quorum (GET /cluster/status: quorate 0): bring the cluster's "
            "nodes back first"
        )
    if strangers and running_guests == "refuse":
        reasons.append(
            "guests running that the inventory does not own: "
            + ", ".join(label(g) for g in strangers)
            + "; stop or migrate them, or set kernel_cmdline_reboot_running_guests: allow"
        )
    return f"{node}: not rebooting: " + "; ".join(reasons) if reasons else ""


def own_ha(guests, owned):
    """The inventory's own containers on the node that HA manages: its maintenance mode would move them away from
    their GPUs (pve-ha-manager Manager.pm: a node in maintenance has its services relocated)."""
    mine = {int(v) for v in owned}
    return [g for g in guests if g["ha"] and g["type"] == "lxc" and g["vmid"] in mine]


def still_on_node(guests):
    """The guests HA manages that still run on the node."""
    return [g for g in guests if g["ha"] and g["status"] == "running"]


def check_visibility(p, api):
    """Fail unless the API user sees every guest: the lists hold only those it may audit (qemu-server
    API2/Qemu.pm and pve-container API2/LXC.pm vmlist: `next if !$rpcenv->check(..., "/vms/$vmid", ['VM.Audit'])`)."""
    answer = with_retries(p, "reading the API user's privileges", lambda: api.access.permissions.get(path="/vms"))
    privileges = next((answer[path] for path in AUDIT_PATHS if path in (answer or {})), {})
    if not privileges.get("VM.Audit"):  # the value is "propagate": 0 holds on /vms alone, not on its guests
        who = p["api_user"] + (f"!{p['api_token_id']}" if p["api_token_id"] else "")
        raise ApiFailure(
            f"{who} cannot see every guest: PVE lists only the guests a user may audit, and {who} holds no "
            "VM.Audit on /vms (propagated): grant it (e.g. the PVEAuditor role on /vms), then run again"
        )


def read_cluster(p, api):
    """The node's cluster (name, quorate, nodes), or None for a node in no cluster: pve-manager PVE/API2/Cluster.pm
    get_status answers a `cluster` entry only where corosync has members, else only the node's own entry."""
    entries = with_retries(p, "reading the cluster status", api.cluster.status.get)
    for entry in entries:
        if entry.get("type") == "cluster":
            return dict(name=entry.get("name"), quorate=bool(int(entry.get("quorate") or 0)), nodes=entry.get("nodes"))
    return None


def read_ha(p, api):
    """VMID -> HA state of each guest HA acts on: /cluster/resources' hastate, the CRM's service state or else the
    resource's configured one (pve-manager PVE/API2/Cluster.pm resources, "get ha status")."""
    resources = with_retries(p, "reading the cluster's HA resources", lambda: api.cluster.resources.get(type="vm"))
    return {
        int(r["vmid"]): r["hastate"]
        for r in resources
        if r.get("vmid") is not None and r.get("hastate") and r["hastate"] not in HA_NOT_ACTING
    }


def read_guests(p, api, cluster):
    """The node's VMs and containers as the node lists them, each with its HA state (on a cluster)."""
    node = api.nodes(p["node"])
    guests = []
    for kind, _name, plural in KINDS:
        listing = getattr(node, kind)
        for item in with_retries(p, f"listing the node's {plural}", listing.get):
            guests.append(
                dict(
                    type=kind, vmid=int(item["vmid"]), name=item.get("name") or "", status=item.get("status", "unknown")
                )
            )
    ha = read_ha(p, api) if cluster else {}
    for guest in guests:
        guest["ha"] = ha.get(guest["vmid"])
    return sorted(guests, key=lambda g: g["vmid"])


def read_disarm(p, api):
    """The HA stack's disarm ({mode, state}) while it is disarming or disarmed (`ha-manager crm-command disarm-ha`,
    pve-ha-manager 5.1.3 and later), else None: PVE/HA/Manager.pm drops a node maintenance request then ("ignoring
    maintenance command ... HA stack is disarmed") and moves no service. A PVE that cannot say is taken as armed."""
    try:
        status = with_retries(p, "reading the HA manager's status", api.cluster.ha.status.manager_status.get)
    except ApiFailure:
        return None
    return ((status or {}).get("manager_status") or {}).get("disarm") or None


def disarmed_reason(disarm, guests) -> str:
    staying = ", ".join(label(g) for g in still_on_node(guests))
    state, mode = disarm.get("state", "disarmed"), disarm.get("mode", "?")
    return (
        f"the HA stack is {state} (resource mode {mode}): its CRM drops a maintenance request and moves no guest, so "
        f"{staying} stay on the node: arm it (ha-manager crm-command arm-ha) or move them yourself, then run again"
    )


def refuse_disarmed(p, api, guests):
    """Fail at once, naming the guests that stay, where the HA stack is disarmed: no wait would move them."""
    disarm = read_disarm(p, api)
    if disarm:
        raise ApiFailure(disarmed_reason(disarm, guests) + ": not rebooting")


def wait_ha_away(p, api, cluster, guests):
    """Poll until no guest HA manages runs on the node (maintenance mode migrates them), or fail after
    wait_ha_away seconds naming those that stay."""
    deadline = time.monotonic() + p["wait_ha_away"]
    if still_on_node(guests):
        refuse_disarmed(p, api, guests)
    while still_on_node(guests):
        if time.monotonic() > deadline:
            staying = ", ".join(label(g) for g in still_on_node(guests))
            raise ApiFailure(
                f"in HA maintenance mode, {staying} still running on the node after {p['wait_ha_away']}s (HA cannot "
                "move a guest bound to the node by a device, a local disk or a rule, or with no other node to take "
                "it): not rebooting"
            )
        time.sleep(POLL_S)
        guests = read_guests(p, api, cluster)
    return guests


def run(module):
    p = module.params
    if not p["api_host"]:
        raise ApiFailure(NO_API)
    api = with_retries(p, "logging in", lambda: pve_api.connect(p))
    check_visibility(p, api)
    cluster = read_cluster(p, api)
    guests = read_guests(p, api, cluster)
    if p["wait_ha_away"] and not module.check_mode:
        guests = wait_ha_away(p, api, cluster, guests)
    strangers = foreign(guests, p["owned"])
    disarm = read_disarm(p, api) if cluster and still_on_node(guests) else None
    return dict(
        changed=False,
        guests=guests,
        running=[label(g) for g in guests if g["status"] == "running"],
        foreign_running=[label(g) for g in strangers],
        cluster=cluster,
        ha_managed=[label(g) for g in guests if g["ha"]],
        refusal=refusal(
            p["node"], cluster, strangers, p["running_guests"], own_ha(guests, p["owned"]), disarm and (disarm, guests)
        ),
    )


def main():
    module = AnsibleModule(
        argument_spec=dict(
            pve_api.ARGUMENT_SPEC,
            node=dict(type="str", required=True),
            owned=dict(type="list", elements="int", default=[]),
            running_guests=dict(type="str", choices=["refuse", "allow"], default="refuse"),
            wait_ha_away=dict(type="int", default=0),
        ),
        supports_check_mode=True,
    )
    if not module.params["validate_certs"]:
        module.warn(pve_api.UNVERIFIED)
    result = pve_api.run_module(module, f"{module.params['node']}: ", run)
    if result["refusal"] and not module.check_mode:
        module.fail_json(msg=result["refusal"], **result)
    module.exit_json(**result)


if __name__ == "__main__":
    main()
