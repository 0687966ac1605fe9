"""roles/proxmox_ct tasks/host_key.yml run through ansible-playbook on this machine, which plays the CT's node: its
`pct` is the lab nodes' stand-in (provision/lab/overlay/common/usr/sbin/pct, whose messages and exit codes are
pve-container's pct.pm) with its node paths under tmp_path, and the CT's status from a local API. What is checked
is what the user sees: the key read on the node lands in the known_hosts file, and each way of reading none is one
line naming the host, the CT and the node."""

from __future__ import annotations

import http.server
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from tests.playbooks import role_outcome_playbook, run_role_playbook
from tests.unit.collection import COLLECTIONS
from tests.unit.provision.lab.overlay.test_pct import PCT, Api

VMID = 150
PLAYBOOK = role_outcome_playbook("proxmox_ct", "The host key step", tasks_from="host_key.yml")
ED25519, RSA = "/etc/ssh/ssh_host_ed25519_key.pub", "/etc/ssh/ssh_host_rsa_key.pub"


@pytest.fixture
def node(tmp_path):
    """A `pct` on PATH that is the lab's stand-in with its paths under tmp_path: CT 150's config on the node, its
    status from a local API (running), and the host keys its create copied (none yet: `with_key` adds one)."""
    server = http.server.HTTPServer(("127.0.0.1", 0), Api)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    Api.status, Api.seen = "running", []
    (tmp_path / "pve-api").write_text(f"url=http://127.0.0.1:{server.server_port}/api2/json\nnode=pve1\ntoken=t\n")
    (tmp_path / "lxc").mkdir()
    (tmp_path / "lxc" / f"{VMID}.conf").write_text("hostname: sglang-02\n")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "pct").write_text(f"""#!{sys.executable}
import importlib.machinery, importlib.util, sys
loader = importlib.machinery.SourceFileLoader("lab_pct", {str(PCT)!r})
pct = importlib.util.module_from_spec(importlib.util.spec_from_loader("lab_pct", loader))
loader.exec_module(pct)
pct.CONF, pct.CONFIG, pct.COPY = {str(tmp_path / "pve-api")!r}, {str(tmp_path / "lxc" / "{vmid}.conf")!r}, \\
    {str(tmp_path / "copy" / "{vmid}" / "rootfs")!r}
sys.exit(pct.main(sys.argv[1:]))
""")
    (bin_dir / "pct").chmod(0o755)
    yield tmp_path
    server.shutdown()


def with_key(root: Path, path: str = ED25519) -> str:
    """A host key pair made as sshd's keygen makes it; its public half where the create copies it on the node."""
    key = root / "keys" / Path(path).name.removesuffix(".pub")
    key.parent.mkdir(exist_ok=True)
    kind = "ed25519" if "ed25519" in path else "rsa"
    subprocess.run(["ssh-keygen", "-q", "-t", kind, "-N", "", "-C", "root@sglang-02", "-f", str(key)], check=True)
    copy = root / "copy" / str(VMID) / "rootfs" / path.lstrip("/")
    copy.parent.mkdir(parents=True, exist_ok=True)
    copy.write_text(Path(f"{key}.pub").read_text())
    return " ".join(copy.read_text().split()[:2])


def run(root: Path, **overrides) -> str | None:
    extra = {
        "proxmox_host": "localhost",
        "proxmox_vmid": VMID,
        "proxmox_ct_known_hosts": str(root / "known_hosts"),
        "proxmox_ct_ssh_timeout": 10,
        **overrides,
    }

    def sh(command: str, check: bool) -> subprocess.CompletedProcess:
        env = {**os.environ, "PATH": f"{root / 'bin'}:{os.environ['PATH']}"}
        return subprocess.run(["bash", "-c", command], capture_output=True, text=True, check=check, env=env)

    return run_role_playbook(sh, root, PLAYBOOK, extra, COLLECTIONS)["failed"]


def known(root: Path) -> list[str]:
    path = root / "known_hosts"
    return [" ".join(line.split()[:3]) for line in path.read_text().splitlines()] if path.exists() else []


def test_the_key_read_on_the_node_is_trusted_for_the_containers_address(node):
    key = with_key(node)
    assert run(node) is None
    assert known(node) == [f"localhost {key}"]


def test_a_missing_key_file_beside_one_that_is_there_still_trusts_the_one_read(node):
    key = with_key(node)
    assert run(node, proxmox_ct_host_key_files=[ED25519, RSA]) is None, "cat's exit 1 for the missing file"
    assert known(node) == [f"localhost {key}"]


def test_no_key_in_the_container_is_one_line_naming_the_ct_the_files_and_the_node(node):
    assert run(node) == (
        f"localhost: no ssh host key in CT {VMID} ({ED25519}, read on localhost): its template has no sshd, or its "
        "keys are elsewhere (proxmox_ct_host_key_files)"
    )
    assert known(node) == []


def test_a_ct_that_is_not_running_is_pcts_one_line(node):
    with_key(node)
    Api.status = "stopped"
    pct_said = f"container '{VMID}' not running!"
    assert run(node) == f"localhost: `pct exec {VMID} -- cat` on localhost failed (exit 255): {pct_said}"
    assert known(node) == []
