#!/usr/bin/python
"""Ansible module: decide, in an SGLang container, whether its GPUs may talk peer to peer (read-only)."""

from __future__ import annotations

DOCUMENTATION = r"""
module: sglang_p2p
short_description: The P2P policy for SGLang's GPUs, decided per link, with its reason and the context it holds in
author: provision maintainers (!UNKNOWN)
description:
  - Read-only. Reads the container's GPUs and the links between them (C(nvidia-smi topo -m)), the stored GPU
    diagnostic verdict, and combines them with the node's context (module gpu_p2p_node, run on the node).
  - "auto: GPUs joined only by NVLink keep P2P on; PCIe peers behind a translating IOMMU turn it off, unless a
    diagnostic verdict taken in this same context (boot, command line, IOMMU mode, driver, GPU set) says they
    are healthy; a current verdict other than healthy turns it off. See plugins/module_utils/gpu_p2p.py."
  - "The decision holds for the next boot too: where a line the node may boot next (the node context's next_boot)
    translates where this boot does not, or may, that boot decides, and no verdict counts for it."
options:
  mode:
    description: sglang_p2p (auto, on or off).
    type: str
    choices: [auto, "on", "off"]
    default: auto
  node:
    description: The context returned by gpu_p2p_node on this container's node.
    type: dict
    default: {}
  verdict_file:
    description: Where the GPU diagnostic's verdict is stored in the container.
    type: path
    required: true
"""

EXAMPLES = r"""
- name: Decide the P2P policy in the container, from the node's context and the diagnostic's verdict
  provision.pve_sglang.sglang_p2p:
    mode: auto
    node: "{{ node_context.context }}"
    verdict_file: /var/lib/provision/gpu-diag.json
  register: p2p
"""

RETURN = r"""
policy: {description: "on or off", type: str, returned: always}
reason: {description: "why, in one line", type: str, returned: always}
topology: {description: "{gpus, links: [{a, b, link}]}", type: dict, returned: always}
context: {description: "{boot_id, cmdline, iommu, driver_version, gpus}: what a verdict taken now is valid for",
          type: dict, returned: always}
recorded_at: {description: the node's clock now (stored with a verdict taken now), type: float, returned: always}
guard:
  description: "for an on that holds only while the IOMMU arguments ({iommu_args}, the arguments of iommu_keys) or
    the boot are the ones decided in: what the unit's start guard compares; null otherwise. For a boot, it is the
    container's own boot id ({container_boot_id}): LXC gives each container start its own, and every node boot
    starts the container again, so a changed one covers every node reboot (and a restart of the container alone)"
  type: dict
  returned: always
next_boot: {description: "the lines the node may boot next, each {source, cmdline, iommu: {translates, source}}",
            type: list, elements: dict, returned: always}
"""

import glob
import re

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.provision.pve_sglang.plugins.module_utils.gpu_devices import is_gpu_node
from ansible_collections.provision.pve_sglang.plugins.module_utils.gpu_p2p import decide, iommu_mode, parse_topo
from ansible_collections.provision.pve_sglang.plugins.module_utils.json_record import read_json
from ansible_collections.provision.pve_sglang.plugins.module_utils.next_boot import IOMMU_KEYS, boot_iommu, iommu_args

BUS_ID = re.compile(r"^([0-9A-Fa-f]{4,8}):([0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.[0-7])$")


def bus_ids(text):
    """nvidia-smi's 00000000:41:00.0 lines -> sysfs's 0000:41:00.0; any other line (a warning) is left out."""
    found = [BUS_ID.match(line.strip()) for line in text.splitlines()]
    return sorted(f"{int(m.group(1), 16):04x}:{m.group(2).lower()}" for m in found if m)


def unknown_links(gpus, why):
    return [{"a": a, "b": b, "link": f"unknown ({why})"} for i, a in enumerate(gpus) for b in gpus[i + 1 :]]


def container_gpus(module):
    """(topology, bus ids) from nvidia-smi; without it, the /dev/nvidiaN nodes with their links unknown."""
    nodes = sorted(p for p in glob.glob("/dev/nvidia*") if is_gpu_node(p))
    smi = module.get_bin_path("nvidia-smi")
    if smi:
        rc, topo, _err = module.run_command([smi, "topo", "-m"])
        rc2, buses, _err = module.run_command([smi, "--query-gpu=pci.bus_id", "--format=csv,noheader"])
        if rc == 0 and rc2 == 0:
            parsed, found = parse_topo(topo), bus_ids(buses)
            if len(parsed["gpus"]) == len(found) == len(nodes):
                return parsed, found
            # a matrix that does not match the GPUs: its links say nothing (fail closed: unknown = PCIe)
            gpus = [f"GPU{i}" for i in range(max(len(found), len(nodes)))]
            why = f"topo -m shows {len(parsed['gpus'])} GPU(s), nvidia-smi lists {len(found)}, /dev has {len(nodes)}"
            return {"gpus": gpus, "links": unknown_links(gpus, why)}, found or nodes
    gpus = [f"GPU{i}" for i in range(len(nodes))]
    return {"gpus": gpus, "links": unknown_links(gpus, "no answer from nvidia-smi")}, nodes


def container_boot_id(path="/proc/sys/kernel/random/boot_id"):
    """This container's boot id: LXC mounts a fresh random one over the node's at each container start (lxc
    conf.c, lxc_setup_boot_id), so the node's boot id cannot be read here; None where it cannot be read."""
    try:
        with open(path) as f:
            return f.read().strip() or None
    except OSError:
        return None


def start_guard(decision, node):
    """What the unit's start guard compares with the boot it starts in, for a policy of "on" that holds only while
    the IOMMU arguments (and for a verdict, the boot) are the ones it was decided in; None where nothing is to check."""
    holds_while = decision.pop("holds_while", None)
    if holds_while is None:
        return None
    return dict(
        iommu_args=" ".join(iommu_args(node.get("cmdline"))),
        iommu_keys=list(IOMMU_KEYS),
        container_boot_id=container_boot_id() if holds_while == "boot" else None,
    )


def main():
    module = AnsibleModule(
        argument_spec=dict(
            mode=dict(type="str", default="auto", choices=["auto", "on", "off"]),
            node=dict(type="dict", default={}),
            verdict_file=dict(type="path", required=True),
        ),
        supports_check_mode=True,
    )
    p = module.params
    node = p["node"] or {}
    topo, buses = container_gpus(module)
    groups = [t for bus, t in (node.get("gpu_groups") or {}).items() if bus in buses]
    iommu = iommu_mode(groups, node.get("default_domain"))
    context = dict(
        boot_id=node.get("boot_id"),
        cmdline=node.get("cmdline"),
        iommu=iommu["source"],
        driver_version=node.get("driver_version"),
        gpus=buses,
    )
    verdict = read_json(p["verdict_file"])
    boots = [
        dict(b, iommu=boot_iommu(node.get("cmdline"), iommu, b.get("cmdline"))) for b in node.get("next_boot") or []
    ]
    decision = decide(p["mode"], topo, iommu, verdict, context, node.get("cmdline_changed_at"), boots)
    guard = start_guard(decision, node)
    module.exit_json(
        changed=False,
        topology=topo,
        context=context,
        recorded_at=node.get("now"),
        next_boot=boots,
        guard=guard,
        **decision,
    )


if __name__ == "__main__":
    main()
