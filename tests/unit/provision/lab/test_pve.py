"""The lab's Proxmox API (`python -m provision.lab.pve`, as `provision lab up` runs it) creating and destroying CTs,
without the lab: a seed with one node that no ssh reaches and CT 101 running without a body. What is checked is what
a create and a destroy leave on this machine (the body's files, the list `lab status` reads) and PVE's refusals.
Starting a created CT needs the lab (a node to read, a network namespace): tests/lab/test_lab.py."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time

import pytest

from provision.lab.ctbody import CREATED_FILE, TEMPLATE_VOLID

NODE = "pve-grub"
PASSWORD = "lab-password"
KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIKzKg6h3XvRMiPpGZ2ydPkN1nI7Fq1m0kLQyJ0G9qvPq test@controller"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def pve(tmp_path):
    from proxmoxer import ProxmoxAPI

    port = _free_port()
    seed = {
        "port": port,
        "token_name": "provision",
        "nodes": [NODE],
        "pve_version": "9.0.11",
        "bodies": {},
        "containers": [{"vmid": 101, "name": "sglang-01", "node": NODE, "config": {"hostname": "sglang-01"}}],
        "create": {
            "rootfs": str(tmp_path / "rootfs"),
            "containers_dir": str(tmp_path / "containers"),
            "client_key": str(tmp_path / "id_ed25519"),
            "binds": {},
            "first_index": 200,
        },
    }
    (tmp_path / "pve-seed.json").write_text(json.dumps(seed))
    (tmp_path / "secrets.json").write_text(json.dumps({"pve_password": PASSWORD, "pve_token_secret": "t"}))
    log = (tmp_path / "pve.log").open("w")
    proc = subprocess.Popen(
        [sys.executable, "-m", "provision.lab.pve", str(tmp_path)],
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    deadline = time.monotonic() + 60
    while not (tmp_path / "pve-ready").exists():
        assert proc.poll() is None and time.monotonic() < deadline, (tmp_path / "pve.log").read_text()[-2000:]
        time.sleep(0.1)
    api = ProxmoxAPI(
        "127.0.0.1",
        port=port,
        user="root@pam",
        password=PASSWORD,
        service="PVE",
        verify_ssl=str(tmp_path / "pve.crt"),
        timeout=60,
    )
    try:
        yield api
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=20)
        log.close()


def _task(api, upid: str) -> str:
    deadline = time.monotonic() + 60
    while (status := api.nodes(NODE).tasks(upid).status.get())["status"] != "stopped":
        assert time.monotonic() < deadline, status
        time.sleep(0.2)
    return status["exitstatus"]


def _create(api, **extra) -> str:
    params = {
        "vmid": 150,
        "ostemplate": TEMPLATE_VOLID,
        "hostname": "ct150",
        "rootfs": "local-lvm:8",
        "net0": "name=eth0,bridge=vmbr0,ip=dhcp",
        "ssh-public-keys": KEY,
        **extra,
    }
    return _task(api, api.nodes(NODE).lxc.post(**params))


def test_the_lab_template_is_on_local_storage_and_another_is_refused(pve, tmp_path):
    from proxmoxer.core import ResourceException

    listed = pve.nodes(NODE).storage("local").content.get(content="vztmpl")
    assert [(v["volid"], v["format"]) for v in listed] == [(TEMPLATE_VOLID, "tzst")]
    other = "local:vztmpl/ubuntu-24.04-standard_24.04-2_amd64.tar.zst"
    assert _create(pve, ostemplate=other) == f"unable to create CT 150 - can't find file '{other}'"
    with pytest.raises(ResourceException, match=r"150\.conf' does not exist"):
        pve.nodes(NODE).lxc(150).config.get()
    assert not (tmp_path / "containers" / "ct150").exists()
    with pytest.raises(ResourceException, match="CT 101 already exists on node 'pve-grub'"):
        pve.nodes(NODE).lxc.post(vmid=101, ostemplate=TEMPLATE_VOLID, rootfs="local-lvm:8")


def test_create_makes_a_stopped_body_and_destroy_removes_it_unless_it_runs(pve, tmp_path, monkeypatch):
    from proxmoxer.core import ResourceException

    from provision.lab.lab import Lab

    assert _create(pve) == "OK"
    assert pve.nodes(NODE).lxc(150).status.current.get()["status"] == "stopped", "created stopped (no start=1)"
    body = tmp_path / "containers" / "ct150"
    assert KEY in (body / "upper" / "root" / ".ssh" / "authorized_keys").read_text()
    host_key = (body / "upper" / "etc" / "ssh" / "ssh_host_ed25519_key.pub").read_text().split()
    assert host_key[2] == "root@ct150"
    assert (body / "known_hosts").read_text().split() == ["10.213.200.2", *host_key[:2]]
    # what `provision lab status` and `lab down` read: the created body, by VMID
    (tmp_path / "state.json").write_text(json.dumps({"up": True, "vms": [], "containers": [], "pve_port": 0}))
    lab = Lab(dir=tmp_path)
    assert lab.status()["containers"] == [
        {"name": "ct150", "vmid": 150, "ssh": "10.213.200.2:22", "running": False, "created_through_api": True}
    ]
    with pytest.raises(ResourceException) as running:
        pve.nodes(NODE).lxc(101).delete()
    assert running.value.status_code == 500 and "unable to destroy CT 101 - container is running" in str(running.value)
    assert _task(pve, pve.nodes(NODE).lxc(150).delete()) == "OK"
    assert not body.exists() and lab.created_containers() == {}
    assert json.loads((tmp_path / CREATED_FILE).read_text()) == {}
    with pytest.raises(ResourceException, match=r"150\.conf' does not exist"):
        pve.nodes(NODE).lxc(150).status.current.get()
