"""The lab's PVE container bodies: devN parsing and the node read, as the prestart hook needs them."""

from provision.lab.ctbody import has_nesting, parse_dev, parse_node_read


def test_a_devn_entry_without_mode_gets_pves_default_0660():
    assert parse_dev("/dev/nvidia0") == {"path": "/dev/nvidia0", "mode": 0o660, "uid": 0, "gid": 0}
    assert parse_dev("path=/dev/nvidia-uvm,mode=0666,uid=100,gid=44") == {
        "path": "/dev/nvidia-uvm", "mode": 0o666, "uid": 100, "gid": 44}  # fmt: skip


def test_nesting_is_read_from_the_features_string():
    assert has_nesting({"features": "keyctl=1,nesting=1"})
    assert not has_nesting({"features": "nesting=0"}) and not has_nesting({})


def test_node_read_tells_device_nodes_from_missing_paths_and_files():
    found, version = parse_node_read(
        "ok|c3|0|character special file|/dev/nvidia0\n"
        "ok|1ff|1|character special file|/dev/nvidia-uvm-tools\n"
        "missing|-|-|-|/dev/nvidia7\n"
        "ok|0|0|regular file|/dev/not-a-device\n"
        "--- version\nNVRM version: NVIDIA UNIX Open Kernel Module for x86_64  580.95.05\n"
    )
    assert found == {"/dev/nvidia0": (195, 0), "/dev/nvidia-uvm-tools": (511, 1), "/dev/nvidia7": None,
                     "/dev/not-a-device": None}  # fmt: skip
    assert "580.95.05" in version
    assert parse_node_read("--- version\n") == ({}, None)
