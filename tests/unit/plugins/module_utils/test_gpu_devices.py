"""The pure devN computation of the gpu_passthrough role."""

from __future__ import annotations

import re

import pytest

from provision.paths import module_util
from tests.loaders import REPO

gd = module_util("gpu_devices")


def node(path, mode="0666", kind="char"):
    return {"path": path, "type": kind, "mode": mode}


HOST = [
    node("/dev/nvidia0"),
    node("/dev/nvidia1"),
    node("/dev/nvidiactl"),
    node("/dev/nvidia-uvm"),
    node("/dev/nvidia-uvm-tools"),
    node("/dev/nvidia-modeset"),
    node("/dev/nvidia-caps/nvidia-cap1", "0400"),
    node("/dev/nvidia-caps/nvidia-cap2", "0444"),
]


def wanted(gpus="all", mode="0666", uid=None, gid=None):
    return gd.desired_entries(gd.select_nodes(HOST, gpus), mode, uid, gid)


def test_all_gpus_get_every_node_with_caps_keeping_host_modes():
    w = wanted()
    assert list(w) == [
        "/dev/nvidia0",
        "/dev/nvidia1",
        "/dev/nvidiactl",
        "/dev/nvidia-uvm",
        "/dev/nvidia-uvm-tools",
        "/dev/nvidia-modeset",
        "/dev/nvidia-caps/nvidia-cap1",
        "/dev/nvidia-caps/nvidia-cap2",
    ]
    assert gd.format_entry(w["/dev/nvidia0"]) == "/dev/nvidia0,mode=0666"
    assert gd.format_entry(w["/dev/nvidia-caps/nvidia-cap1"]) == "/dev/nvidia-caps/nvidia-cap1,mode=0400"


def test_gpu_subset_and_uid_gid():
    w = wanted(gpus=[1], uid=0, gid=44)
    assert "/dev/nvidia0" not in w and "/dev/nvidia1" in w
    assert gd.format_entry(w["/dev/nvidia1"]) == "/dev/nvidia1,gid=44,mode=0666,uid=0"


@pytest.mark.parametrize(
    ("nodes", "gpus", "message"),
    [
        (HOST, [3], "GPU(s) [3] asked for"),
        ([n for n in HOST if n["path"] != "/dev/nvidia-uvm"], "all", "/dev/nvidia-uvm is missing"),
        (
            [n for n in HOST if not n["path"].startswith("/dev/nvidia") or "-" in n["path"] or "ctl" in n["path"]],
            "all",
            "no /dev/nvidiaN",
        ),
        (
            [*[n for n in HOST if n["path"] != "/dev/nvidiactl"], node("/dev/nvidiactl", kind="link")],
            "all",
            "/dev/nvidiactl: PVE only passes device nodes, not a link",
        ),
        ([*HOST, node("/dev/../etc/passwd")], "all", "without /./ or /../"),
    ],
)
def test_refusals(nodes, gpus, message):
    with pytest.raises(gd.DeviceError, match=re.escape(message)):
        gd.select_nodes(nodes, gpus)


def test_what_is_not_a_device_node_and_not_needed_is_left_out():
    # a symlink an admin or a udev rule made beside the nodes, and the caps directory, as nvidia_device_nodes reads them
    extra = [node("/dev/nvidia-gpu-a", kind="link"), node("/dev/nvidia-caps", kind="dir")]
    assert gd.select_nodes([*HOST, *extra], "all") == gd.select_nodes(HOST, "all")


def test_fresh_container_gets_consecutive_free_slots():
    change = gd.plan({"digest": "x", "hostname": "ct"}, wanted())
    assert sorted(change["set"], key=lambda k: int(k[3:])) == [f"dev{i}" for i in range(8)]
    assert change["delete"] == []


def test_unrelated_dev_and_mp_are_kept_and_ours_go_into_free_slots():
    config = {
        "dev0": "/dev/dri/renderD128,gid=44",
        "dev2": "/dev/ttyUSB0",
        "mp0": "local:100/vm-100-disk-1.raw,mp=/data",
    }
    change = gd.plan(config, wanted(gpus=[0]))
    assert "dev0" not in change["set"] and "dev2" not in change["set"] and change["delete"] == []
    assert change["set"]["dev1"] == "/dev/nvidia0,mode=0666"
    assert "dev3" in change["set"]
    assert change["after"]["dev0"] == "/dev/dri/renderD128,gid=44" and "mp0" not in change["after"]


def test_converged_config_plans_nothing():
    first = gd.plan({}, wanted())
    second = gd.plan(first["after"], wanted())
    assert second["set"] == {} and second["delete"] == []


def test_equivalent_spelling_is_not_rewritten():
    config = {"dev5": "path=/dev/nvidia0,mode=0666"}
    change = gd.plan(config, wanted(gpus=[0]))
    assert "dev5" not in change["set"]


def test_changed_mode_is_updated_in_place_and_deselected_gpu_deleted():
    current = gd.plan({}, wanted())["after"]
    change = gd.plan(current, wanted(gpus=[0], mode="0660"))
    assert change["set"]["dev0"] == "/dev/nvidia0,mode=0660"
    assert change["delete"] == ["dev1"], "the deselected /dev/nvidia1 entry goes"
    assert not set(change["set"]) & set(change["delete"]), "never set and delete one key in a PUT"


def test_no_free_slot():
    config = {f"dev{i}": f"/dev/other{i}" for i in range(256)}
    with pytest.raises(gd.DeviceError, match="no free devN slot"):
        gd.plan(config, wanted(gpus=[0]))


def test_one_rule_says_which_device_nodes_are_gpus():
    """gpu_devices.is_gpu_node, for the modules, verify's checks and the roles (the gpu_device_node Jinja test)."""
    from ansible.parsing.dataloader import DataLoader
    from ansible.template import Templar, trust_as_template

    from provision.checks import test_container

    paths = [n["path"] for n in HOST] + ["/dev/nvidia12", "/dev/nvidia", "/dev/nvidia0x", "/tmp/nvidia0"]
    gpus = ["/dev/nvidia0", "/dev/nvidia1", "/dev/nvidia12"]
    assert [p for p in paths if gd.is_gpu_node(p)] == gpus
    assert [gd.gpu_index(p) for p in gpus] == [0, 1, 12]
    assert [p for p in paths if gd.is_cuda_node(p)] == [
        "/dev/nvidia0",
        "/dev/nvidia1",
        "/dev/nvidiactl",
        "/dev/nvidia-uvm",
        "/dev/nvidia12",
    ]
    templar = Templar(loader=DataLoader(), variables={"paths": paths})
    template = "{{ paths | select('provision.pve_sglang.gpu_device_node') | list }}"
    assert templar.template(trust_as_template(template)) == gpus
    # verify's check counts the same nodes the container shows (names under /dev)
    nodes = {p.removeprefix("/dev/"): {"char": True} for p in paths if p.startswith("/dev/")}
    test_container.test_gpu_nodes_visible(type("Target", (), {"data": {"nvidia_nodes": nodes}})())
    with pytest.raises(AssertionError, match="no /dev/nvidiaN"):
        test_container.test_gpu_nodes_visible(type("Target", (), {"data": {"nvidia_nodes": {"nvidiactl": {}}}})())


def test_no_other_file_spells_the_gpu_node_pattern():
    root = REPO
    spellings = re.compile(r"nvidia\\d\+|nvidia\[0-9\]|nvidia\(\\d")
    found = [
        str(path.relative_to(root))
        for top in ("plugins", "roles", "provision", "playbooks")
        for path in (root / top).rglob("*")
        if path.is_file()
        and path.suffix in (".py", ".yml", ".j2")
        and path.name != "gpu_devices.py"
        and spellings.search(path.read_text(errors="replace"))
    ]
    assert found == []
