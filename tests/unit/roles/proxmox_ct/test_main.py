"""A container is created (roles/proxmox_ct) under its node's host lock: playbooks/site.yml run
through ansible-playbook on this machine, which plays both the node (pve1) and the container (ct1) over local
connections, with the run's lock request as `provision apply` passes it (provision_lock). The API is fakepve (PVE's
schema, in this process), and it looks at the node's lock.json at the moment the create request arrives; the node's
`pct` is the lab's stand-in (tests/unit/roles/proxmox_ct/test_host_key.py). Both ways a run locks the node are tried:
the node in the run, and `--limit ct1` (the node locked through the container's read of it)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.unit.collection import COLLECTIONS
from tests.unit.plugins.modules.test_proxmox_lxc_ct import SPEC, TEMPLATE
from tests.unit.plugins.modules.test_proxmox_lxc_gpu_faults import (  # noqa: F401 (pki: a fixture)
    NODE,
    Served,
    faulty_pve_class,
    pki,
)
from tests.unit.roles.proxmox_ct.test_host_key import VMID, node, with_key  # noqa: F401 (node: a fixture)

RUN_ID = "20260101T000000-apply"
LOCK = {
    "run_id": RUN_ID,
    "controller": "test-controller",
    "pid": os.getpid(),
    "since": "2026-01-01T00:00:00+00:00",
    "pid_ns": "",
    "command": "provision apply",
    "break": False,
}


def recording_pve_class():
    class RecordingPve(faulty_pve_class()):
        """fakepve that notes the node's lock.json (None: no lock) when a CT create request arrives."""

        lock_file: Path
        locks_at_create: list

        async def _lxc_create(self, user, v):
            self.locks_at_create.append(json.loads(self.lock_file.read_text()) if self.lock_file.exists() else None)
            return await super()._lxc_create(user, v)

    return RecordingPve


@pytest.fixture
def served(pki, tmp_path):  # noqa: F811
    served = Served(*pki, pve_class=recording_pve_class())
    served.pve.lock_file, served.pve.locks_at_create = tmp_path / "pve1-state" / "lock.json", []
    volname = TEMPLATE.partition(":")[2]  # the template on the node's storage, as `pveam download` leaves it
    served.pve.storages["local"].setdefault("volumes", {})[volname] = {"content": "vztmpl", "format": "tzst", "size": 0}
    yield served
    served.stop()


def inventory(root: Path, served) -> Path:
    local = {"ansible_connection": "local", "ansible_python_interpreter": sys.executable}
    hosts = {
        "all": {
            "vars": {
                **local,
                "proxmox_api_host": "127.0.0.1",
                "proxmox_api_port": served.pve.port,
                "proxmox_api_user": "root@pam",
                "proxmox_api_password": "secret",
                "proxmox_api_ca_file": served.cafile,
            },
            "children": {
                "proxmox_hosts": {"hosts": {NODE: {"provision_state_dir": str(root / "pve1-state")}}},
                "gpu_containers": {
                    "hosts": {
                        "ct1": {
                            "proxmox_host": NODE,
                            "proxmox_vmid": VMID,
                            "proxmox_ct_spec": SPEC,
                            "provision_state_dir": str(root / "ct1-state"),
                            "proxmox_ct_known_hosts": str(root / "known_hosts"),
                            "proxmox_ct_ssh_timeout": 10,
                        }
                    }
                },
            },
        }
    }
    path = root / "hosts.yml"
    path.write_text(yaml.safe_dump(hosts))
    return path


@pytest.mark.parametrize("limit", [None, "ct1"], ids=["node-in-the-run", "limit-to-the-container"])
def test_a_missing_container_is_created_while_its_node_is_locked_for_the_run(served, node, limit):  # noqa: F811
    with_key(node)  # what the create leaves in the CT for the node's `pct exec ... cat`
    (node / "extra.json").write_text(json.dumps({"provision_lock": LOCK}))
    playbook = Path(sys.executable).parent / "ansible-playbook"
    argv = [
        playbook,
        "-i",
        inventory(node, served),
        "-e",
        f"@{node}/extra.json",
        "provision.pve_sglang.site",
        "--tags",
        "no-phase",
        *(["--limit", limit] if limit else []),
    ]
    env = {
        **os.environ,
        "ANSIBLE_COLLECTIONS_PATH": str(COLLECTIONS),
        "ANSIBLE_NOCOLOR": "1",
        "PATH": f"{node / 'bin'}:{os.environ['PATH']}",
    }
    ran = subprocess.run([str(a) for a in argv], capture_output=True, text=True, env=env, timeout=300)
    assert ran.returncode == 0, ran.stdout[-4000:] + ran.stderr[-2000:]
    assert served.pve.guest(VMID) is not None, "CT 150 was created"
    (lock,) = served.pve.locks_at_create
    assert lock is not None, "the create reached PVE before the run held its node's host lock"
    assert (lock["run_id"], lock["controller"]) == (RUN_ID, "test-controller")
    assert not (node / "pve1-state" / "lock.json").exists(), "unlock.yml gives the node's lock back at the end"
