#!/usr/bin/python
"""Ansible module: create a container from the inventory's spec when its VMID does not exist; bring one that exists
to the spec where PVE can without a rebuild."""

from __future__ import annotations

DOCUMENTATION = r"""
module: proxmox_lxc_ct
short_description: Create a Proxmox LXC container from a spec, or bring an existing one to it (proxmoxer)
author: provision maintainers (!UNKNOWN)
description:
  - Looks for the VMID in the cluster (C(GET /cluster/resources)). When it is not there, makes sure the OS template
    is on its storage (C(POST /nodes/{node}/storage/{storage}/download-url) with the template's sha256 when a URL is
    given, else the appliance index C(POST /nodes/{node}/aplinfo)), creates the container (C(POST /nodes/{node}/lxc))
    and starts it, waiting for each task and checking its exitstatus.
  - An existing container is brought to the spec where PVE can do it in place - C(PUT config) for its hostname,
    cores, memory, swap, nesting, onboot, startup order and net0 (keys the spec does not name, such as net0's hwaddr,
    kept), and C(PUT resize) to grow its root disk. What PVE leaves pending on a running container (it applies the
    rest at once) is returned in I(pending), for its next start, on every run while it waits. Less memory or swap,
    or another net0, on a running container only with I(disruptive). A smaller root disk, another storage and another
    C(unprivileged) are never applied (a disk is never shrunk, a CT never rebuilt or moved); they are warned about
    and returned in I(differences). It is never deleted. A VMID that is a VM, or a CT on another node, is an error.
  - A create or start whose answer the network lost is looked for (the CT's task of that type) before it is asked
    for again. The login, retries and refusals are module_utils/pve_api.py's; the spec's rules are
    module_utils/lxc_spec.py's, shared with C(provision inventory check).
  - Runs on the controller. Supports check mode (what it would create or change is returned, nothing is asked of PVE
    but reads) and diff mode (the changed fields, before and after).
extends_documentation_fragment:
  - provision.pve_sglang.pve_api
  - provision.pve_sglang.attributes
options:
  node: {type: str, required: true, description: the PVE node the container lives on}
  vmid: {type: int, required: true, description: the container's VMID}
  spec:
    type: dict
    required: true
    description:
      - The container's fields (the inventory's proxmox_ct_spec; module_utils/lxc_spec.py lists them).
  task_timeout:
    type: int
    default: 600
    description:
      - Seconds to wait for each task (download, create, start).
  disruptive:
    type: bool
    default: false
    description:
      - Apply to a running container what PVE would apply at once and would disrupt what it serves - less memory or
        swap, another net0. Without it those are warned about and left as they are while it runs; a stopped
        container takes them.
attributes:
  check_mode: {support: full}
  diff_mode: {support: full}
"""

EXAMPLES = r"""
- name: Create CT 101 from its spec when it does not exist
  proxmox_lxc_ct:
    api_host: pve.example.net
    api_password: "{{ lookup('env', 'PROXMOX_PASSWORD') }}"
    node: pve1
    vmid: 101
    spec: "{{ proxmox_ct_spec }}"
"""

RETURN = r"""
created: {description: "whether the container was created (in check mode, would be)", type: bool, returned: always}
steps: {description: "what was done (or would be, in check mode), in order", type: list, returned: always}
status:
  description: the container's status after the run (none in check mode before a create)
  type: str
  returned: always
differences:
  description:
    - For an existing container, each field that differs from the spec and is left as it is (field, spec, actual,
      why).
  type: list
  returned: always
updated:
  description: For an existing container, each field changed to the spec (or, in check mode, to be changed).
  type: list
  returned: always
pending:
  description: The config keys PVE left pending on the running container, applied at its next start.
  type: list
  returned: always
"""

import functools
import re

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.provision.pve_sglang.plugins.module_utils import lxc_spec, pve_api
from ansible_collections.provision.pve_sglang.plugins.module_utils.pve_api import ApiFailure, connect, lost_connection

# the config keys the spec's fields write: the pending ones among them are reported
SPEC_KEYS = ("hostname", "cores", "memory", "swap", "features", "onboot", "startup", "net0", "rootfs")
CREATE_TASK = "vzcreate"  # pve-container API2/LXC.pm: the task types of a create and a start
START_TASK = "vzstart"


def with_retries(p, what, call):
    return pve_api.with_retries(p, what, call, grant_on=f"/vms/{p['vmid']}")


def find_guest(p, api):
    """The cluster's entry for the VMID ({type, node, status, ...}), or None."""
    guests = with_retries(p, "listing the cluster's guests", lambda: api.cluster.resources.get(type="vm"))
    return next((g for g in guests if int(g.get("vmid", -1)) == p["vmid"]), None)


def existing(module, api, guest):
    """An existing CT brought to the spec where PVE can without a rebuild (lxc_spec.update); what cannot be is warned
    about and returned."""
    p = module.params
    check_guest(p, guest)
    ct = api.nodes(p["node"]).lxc(p["vmid"])
    config = with_retries(p, "reading the container config", ct.config.get)
    running = guest.get("status") == "running"
    change = lxc_spec.update(p["spec"], config, running, p["disruptive"])
    if change["kept"]:
        module.warn(
            f"CT {p['vmid']} on {p['node']} differs from proxmox_ct_spec, left as it is: "
            + "; ".join(f"{text} ({why})" for text, why in _kept_lines(change["kept"]))
        )
    updated = [*change["config"], *(["rootfs"] if change["resize"] else [])]
    result = dict(
        changed=bool(updated),
        created=False,
        steps=_update_steps(p, change),
        status=guest.get("status"),
        differences=[{"field": f, "spec": w, "actual": h, "why": why} for f, w, h, why in change["kept"]],
        updated=updated,
        pending=[],
    )
    if updated and module._diff:
        result["diff"] = _update_diff(p, config, change)
    if updated and not module.check_mode:
        _apply_update(p, api, ct, config, change)
    if running and not module.check_mode:  # what waits for its next start, this run's or an earlier one's
        pending = (i["key"] for i in with_retries(p, "reading the changes pending", ct.pending.get) if _waits(i))
        result["pending"] = sorted(key for key in pending if key in SPEC_KEYS)
    return result


def check_guest(p, guest):
    """Refuse a VMID that is a VM, or a CT on another node than the inventory's."""
    if guest.get("type") != "lxc":
        kind, node = guest.get("type"), guest.get("node")
        raise ApiFailure(f"VMID {p['vmid']} is a {kind} guest on node {node}, not a container: choose another VMID")
    if guest.get("node") != p["node"]:
        raise ApiFailure(
            f"CT {p['vmid']} exists on node {guest.get('node')}, not on {p['node']}: set proxmox_host to that node's "
            "inventory name, or pick another proxmox_vmid (nothing is migrated or deleted)"
        )


def _waits(item):
    """Whether an entry of `GET .../pending` waits for the CT's next start (a new value, or a delete)."""
    return "pending" in item or "delete" in item


def _kept_lines(kept):
    for name, want, have, why in kept:
        yield lxc_spec.difference_text([(name, want, have)]), why


def _update_steps(p, change):
    steps = [f"set {key}={value}" for key, value in change["config"].items()]
    if change["resize"]:
        steps.append(f"grow the root disk to {change['resize']}")
    return [f"CT {p['vmid']}: {step}" for step in steps]


def _update_diff(p, config, change):
    header = f"CT {p['vmid']} config ({p['node']})"
    after = {**config, **change["config"]}
    if change["resize"]:
        after["rootfs"] = re.sub(r"(^|,)size=[^,]*", rf"\g<1>size={change['resize']}", str(config.get("rootfs")))
    keys = [*change["config"], *(["rootfs"] if change["resize"] else [])]
    return dict(
        before="".join(f"{k}: {config.get(k, '')}\n" for k in keys),
        after="".join(f"{k}: {after.get(k, '')}\n" for k in keys),
        before_header=header,
        after_header=header,
    )


def _apply_update(p, api, ct, config, change):
    """PUT the config change with the digest read (PVE refuses it when the config changed in between: run again),
    then grow the root disk and wait for its task."""
    if change["config"]:
        body = dict(change["config"], digest=config["digest"])
        with_retries(p, "changing the container config", lambda: ct.config.put(**body))
    if change["resize"]:
        what = f"growing CT {p['vmid']}'s root disk to {change['resize']}"
        upid = with_retries(p, what, lambda: ct.resize.put(disk="rootfs", size=change["resize"]))
        pve_api.wait_task(p, api, p["node"], upid, what, timeout_variable="proxmox_ct_task_timeout")


def template_missing(p, api):
    """Whether the spec's template is not on its storage (content listing of the node's storage)."""
    volid = p["spec"]["template"]
    storage = volid.split(":", 1)[0]
    listed = with_retries(
        p,
        f"listing the templates on storage {storage}",
        lambda: api.nodes(p["node"]).storage(storage).content.get(content="vztmpl"),
    )
    return all(item.get("volid") != volid for item in listed)


def download_template(p, api):
    """The template onto its storage: download-url with the spec's sha256 (PVE checks it and refuses a file that
    does not match), else the appliance index (aplinfo), PVE's own list of templates and their checksums."""
    spec, node = p["spec"], p["node"]
    storage, _sep, volname = spec["template"].partition(":")
    filename = volname.removeprefix("vztmpl/")
    if spec.get("template_url"):
        call = functools.partial(
            api.nodes(node).storage(storage)("download-url").post,
            content="vztmpl",
            filename=filename,
            url=spec["template_url"],
            checksum=spec["template_sha256"].lower(),
            **{"checksum-algorithm": "sha256"},
        )
        what = f"downloading {filename} from template_url to storage {storage}"
    else:
        call = functools.partial(api.nodes(node).aplinfo.post, storage=storage, template=filename)
        what = f"downloading {filename} from PVE's appliance index to storage {storage}"
    upid = with_retries(p, what, call)
    return pve_api.wait_task(p, api, node, upid, what, timeout_variable="proxmox_ct_task_timeout")


def task_of(p, api, kind):
    """After a lost answer: the UPID of the CT's newest task of `kind`, or None (PVE never started one)."""
    tasks = api.nodes(p["node"]).tasks.get(vmid=p["vmid"], typefilter=kind, source="all")
    found = [t for t in tasks if t.get("type") == kind]
    return max(found, key=lambda t: t.get("starttime", 0))["upid"] if found else None


def once(p, api, kind, what, call):
    """POST a create or start once: when the network lost PVE's answer, its task is looked for before asking again,
    so that nothing is created or started twice. Waits for the task and returns its exitstatus."""
    lost = []

    def attempt():
        upid = task_of(p, api, kind) if lost else None
        if upid:
            return upid
        try:
            return call()
        except Exception as exc:
            if lost_connection(exc):
                lost.append(exc)
            raise

    upid = with_retries(p, what, attempt)
    return pve_api.wait_task(p, api, p["node"], upid, what, timeout_variable="proxmox_ct_task_timeout")


def create(module, api):
    """Template, create, start: each a task waited for. In check mode only the reads, and the plan."""
    p = module.params
    node, vmid = p["node"], p["vmid"]
    steps = []
    if template_missing(p, api):
        steps.append(f"download template {p['spec']['template']}")
    steps += [f"create CT {vmid} on {node}", f"start CT {vmid}"]
    result = dict(changed=True, created=True, steps=steps, differences=[], updated=[], pending=[], status=None)
    if module.check_mode:
        return result
    if steps[0].startswith("download"):
        download_template(p, api)
    params = lxc_spec.create_params(p["spec"], vmid)
    once(p, api, CREATE_TASK, f"creating CT {vmid}", lambda: api.nodes(node).lxc.post(**params))
    ct = api.nodes(node).lxc(vmid)
    once(p, api, START_TASK, f"starting CT {vmid}", ct.status.start.post)
    result["status"] = with_retries(p, "reading the container status", ct.status.current.get)["status"]
    return result


def run(module):
    p = module.params
    found = lxc_spec.problems(p["spec"])
    if found:
        raise ApiFailure("; ".join(found))
    p["spec"] = lxc_spec.with_defaults(p["spec"])
    api = with_retries(p, "logging in", lambda: connect(p))
    guest = find_guest(p, api)
    return existing(module, api, guest) if guest else create(module, api)


def main():
    module = AnsibleModule(
        argument_spec=dict(
            pve_api.CT_ARGUMENT_SPEC,
            spec=dict(type="dict", required=True),
            task_timeout=dict(type="int", default=600),
            disruptive=dict(type="bool", default=False),
        ),
        supports_check_mode=True,
    )
    if not module.params["validate_certs"]:
        module.warn(pve_api.UNVERIFIED)
    where = f"CT {module.params['vmid']} on {module.params['node']}: "
    module.exit_json(**pve_api.run_module(module, where, run))


if __name__ == "__main__":
    main()
