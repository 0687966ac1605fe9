"""The lab nodes' `pct` stand-in (provision/lab/overlay/common/usr/sbin/pct) and what the lab's API copies for it
onto a node at a create (provision/lab/ctbody.py copy_to_node), without the lab: the node is this machine (its ssh
argv `sh -c`), the node's paths are under tmp_path, and the lab's API is a local HTTP server answering the CT's
status. What is checked is what pct's user sees: pct's messages and exit codes for a CT that does not exist or is
stopped (pve-container src/PVE/CLI/pct.pm), the created CT's host keys for `pct exec <vmid> -- cat`, and what the
stand-in refuses to pretend to run."""

from __future__ import annotations

import asyncio
import http.server
import importlib.machinery
import importlib.util
import json
import socket
import subprocess
import threading
import types
from pathlib import Path
from typing import ClassVar

import pytest

from provision.lab import ctbody

PCT = Path(ctbody.__file__).parent / "overlay" / "common" / "usr" / "sbin" / "pct"
NODE, VMID = "pve-grub", 150


class Api(http.server.BaseHTTPRequestHandler):
    status = "running"
    seen: ClassVar[list[tuple[str, str]]] = []

    def do_GET(self):
        Api.seen.append((self.path, self.headers.get("Authorization", "")))
        body = json.dumps({"data": {"status": Api.status, "vmid": VMID}}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


@pytest.fixture
def node(tmp_path, monkeypatch):
    """The pct stand-in loaded with its node paths under tmp_path, the lab's API at a local port."""
    server = http.server.HTTPServer(("127.0.0.1", 0), Api)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    loader = importlib.machinery.SourceFileLoader("lab_pct", str(PCT))
    pct = importlib.util.module_from_spec(importlib.util.spec_from_loader("lab_pct", loader))
    loader.exec_module(pct)
    (tmp_path / "etc-lab").mkdir()
    (tmp_path / "etc-lab" / "pve-api").write_text(
        f"url=http://127.0.0.1:{server.server_port}/api2/json\nnode={NODE}\ntoken=root@pam!provision=s3cret\n"
    )
    monkeypatch.setattr(pct, "CONF", str(tmp_path / "etc-lab" / "pve-api"))
    monkeypatch.setattr(pct, "CONFIG", str(tmp_path / "etc-pve-lxc" / "{vmid}.conf"))
    monkeypatch.setattr(pct, "COPY", str(tmp_path / "pct" / "{vmid}" / "rootfs"))
    monkeypatch.setattr(ctbody, "PCT_COPY", pct.COPY)
    Api.status, Api.seen = "running", []
    yield pct
    server.shutdown()


def pct_run(pct, capsys, *argv) -> tuple[int, str, str]:
    try:
        rc = pct.main(list(argv))
    except SystemExit as exc:
        rc = exc.code
    out = capsys.readouterr()
    return rc, out.out, out.err


def created(tmp_path, pct) -> list[str]:
    """A CT the lab's API just created: its config on the node, its host keys copied there by the create."""
    (tmp_path / "etc-pve-lxc").mkdir(exist_ok=True)
    (tmp_path / "etc-pve-lxc" / f"{VMID}.conf").write_text("hostname: ct150\n")
    ssh = tmp_path / "body" / "upper" / "etc" / "ssh"
    ssh.mkdir(parents=True)
    keys = []
    for kind in ("ed25519", "rsa"):
        key = ssh / f"ssh_host_{kind}_key"
        subprocess.run(["ssh-keygen", "-q", "-t", kind, "-N", "", "-C", "root@ct150", "-f", str(key)], check=True)
        keys.append((ssh / f"ssh_host_{kind}_key.pub").read_text())
    bodies = ctbody.Bodies({"node_ssh": {NODE: ["sh", "-c"]}})
    asyncio.run(bodies.copy_to_node(NODE, VMID, types.SimpleNamespace(dir=tmp_path / "body")))
    return keys


def test_exec_cat_reads_the_keys_the_create_copied_onto_the_node(tmp_path, node, capsys):
    keys = created(tmp_path, node)
    rc, out, err = pct_run(
        node,
        capsys,
        "exec",
        str(VMID),
        "--",
        "cat",
        "/etc/ssh/ssh_host_ed25519_key.pub",
        "/etc/ssh/ssh_host_rsa_key.pub",
    )
    assert (rc, err) == (0, ""), err
    assert out == keys[0] + keys[1]
    assert not list((tmp_path / "pct").rglob("*_key")), "only public keys reach the node"
    # the status came from the lab's API, with the node's token
    assert Api.seen[-1] == (
        f"/api2/json/nodes/{NODE}/lxc/{VMID}/status/current",
        "PVEAPIToken=root@pam!provision=s3cret",
    )


def test_a_stopped_ct_is_refused_as_pct_refuses_it(tmp_path, node, capsys):
    created(tmp_path, node)
    Api.status = "stopped"
    assert pct_run(node, capsys, "exec", str(VMID), "--", "cat", "/etc/ssh/ssh_host_ed25519_key.pub") == (
        255,
        "",
        f"container '{VMID}' not running!\n",
    )
    assert pct_run(node, capsys, "status", str(VMID)) == (0, "status: stopped\n", "")


def test_a_ct_without_a_config_on_the_node_does_not_exist_for_pct(node, capsys):
    rc, out, err = pct_run(node, capsys, "exec", "151", "--", "cat", "/etc/hostname")
    assert (rc, out) == (255, "")
    assert err == f"Configuration file 'nodes/{socket.gethostname()}/lxc/151.conf' does not exist\n"
    assert pct_run(node, capsys, "status", "151")[0] == 255
    assert Api.seen == [], "pct loads the config before it asks for the status"


def test_what_the_lab_cannot_run_in_a_ct_is_refused_not_faked(tmp_path, node, capsys):
    created(tmp_path, node)
    rc, _, err = pct_run(node, capsys, "exec", str(VMID), "--", "sh", "-c", "cat /etc/ssh/*.pub")
    assert rc == 2 and "only `cat FILE...` runs in a lab CT" in err
    rc, _, err = pct_run(node, capsys, "exec", str(VMID), "--", "cat", "/etc/shadow")
    assert rc == 1 and err == "cat: /etc/shadow: No such file or directory\n"
    assert pct_run(node, capsys, "exec", str(VMID), "--")[:3:2] == (255, "missing command\n")
    assert pct_run(node, capsys, "enter", str(VMID))[0] == 2


def test_a_destroy_takes_the_nodes_copy_with_it(tmp_path, node, capsys):
    created(tmp_path, node)
    bodies = ctbody.Bodies({"node_ssh": {NODE: ["sh", "-c"]}})
    asyncio.run(bodies.copy_to_node(NODE, VMID, types.SimpleNamespace(dir=tmp_path / "body")))
    assert (tmp_path / "pct" / str(VMID)).is_dir()
    asyncio.run(bodies.destroy(VMID))
    assert not (tmp_path / "pct" / str(VMID)).exists()
