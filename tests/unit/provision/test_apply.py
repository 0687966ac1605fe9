"""provision/apply.py: what `provision retire` refuses in its scope before anything runs (retire_problems)."""

from __future__ import annotations

import pytest

from provision import inventory
from provision.apply import retire_problems
from tests.unit.provision.test_inventory import make

FLEET = """\
all:
  children:
    proxmox_hosts:
      hosts:
        pve1: {ansible_host: 192.0.2.10}
        pve2: {ansible_host: 192.0.2.11}
    gpu_containers:
      hosts:
        ct1: {proxmox_host: pve1, proxmox_vmid: 110}
        ct2: {proxmox_host: pve1, proxmox_vmid: 111}
        ct3: {proxmox_host: pve2, proxmox_vmid: 112}
    sglang_gateways:
      hosts:
        gw1: {ansible_host: 192.0.2.20}
"""
OUTSIDE = "of the inventory, outside --limit:"


@pytest.fixture(scope="module")
def fleet(tmp_path_factory):
    return inventory.load(make(tmp_path_factory.mktemp("fleet"), FLEET))


@pytest.mark.parametrize(
    ("limit", "refused"),
    [
        ("ct1", []),
        ("ct1,ct2,pve1", []),
        ("pve2,ct3", []),
        ("pve1,ct1", [f"retire: node pve1 runs ct2 {OUTSIDE} retire it with the node, or leave the node out"]),
        ("pve1", [f"retire: node pve1 runs ct1, ct2 {OUTSIDE} retire them with the node, or leave the node out"]),
        ("gw1,ct3", ["retire: gw1 is in neither gpu_containers nor proxmox_hosts: leave it out of --limit"]),
    ],
)
def test_retire_refuses_a_gateway_and_a_node_whose_containers_stay(fleet, limit, refused):
    assert retire_problems(fleet, fleet.scope(limit)) == refused
