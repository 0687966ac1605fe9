"""plugins/module_utils/lxc_spec.py `update`: the change that brings an existing CT to its spec, field by field."""

from __future__ import annotations

from tests.unit import collection

lxc_spec = collection.module_util("lxc_spec")
NET0 = "name=eth0,bridge=vmbr0,hwaddr=BC:24:11:00:00:01,ip=192.0.2.110/24,gw=192.0.2.1,tag=20,type=veth"
CONFIG = {
    "hostname": "ct",
    "rootfs": "local-lvm:vm-150-disk-0,size=16G",
    "memory": 2048,
    "swap": 512,
    "net0": NET0,
    "unprivileged": 1,
    "features": "nesting=1",
    "onboot": 1,
}
SPEC = {"hostname": "ct", "storage": "local-lvm", "rootfs_size": 16, "memory": 2048, "swap": 512}


def net0(body: dict) -> dict:
    return dict(part.split("=", 1) for part in body["net0"].split(","))


def test_a_switch_to_dhcp_drops_the_static_gateway_and_keeps_the_rest():
    change = lxc_spec.update({**SPEC, "net0": {"bridge": "vmbr0", "ip": "dhcp"}}, CONFIG)
    assert net0(change["config"]) == {
        "name": "eth0",
        "bridge": "vmbr0",
        "ip": "dhcp",
        "hwaddr": "BC:24:11:00:00:01",
        "tag": "20",
        "type": "veth",
    }


def test_on_a_running_ct_only_what_cuts_waits():
    spec = {**SPEC, "memory": 1024, "swap": 1024, "cores": 4, "net0": {"bridge": "vmbr1", "ip": "192.0.2.110/24"}}
    running = lxc_spec.update(spec, {**CONFIG, "cores": 2}, running=True)
    assert running["config"] == {"cores": 4, "swap": 1024}  # more swap and cores: applied at once
    assert [(name, why.split(":")[0]) for name, _, _, why in running["kept"]] == [
        ("memory", "less memory on a running CT is taken from what it runs (reclaim, the OOM killer)"),
        ("net0", "another net0 re-plugs a running CT's network and drops its connections"),
    ]
    allowed = lxc_spec.update(spec, {**CONFIG, "cores": 2}, running=True, disruptive=True)
    assert sorted(allowed["config"]) == ["cores", "memory", "net0", "swap"] and allowed["kept"] == []
    assert sorted(lxc_spec.update(spec, {**CONFIG, "cores": 2})["config"]) == ["cores", "memory", "net0", "swap"]


def test_a_larger_disk_is_a_resize_and_a_smaller_one_is_kept():
    assert lxc_spec.update({**SPEC, "rootfs_size": 32}, CONFIG)["resize"] == "32G"
    smaller = lxc_spec.update({**SPEC, "rootfs_size": 8}, CONFIG)
    assert smaller["resize"] is None and smaller["kept"] == [("rootfs_size", 8, 16, "a root disk is never shrunk")]
