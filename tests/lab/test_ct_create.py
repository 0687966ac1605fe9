"""The container: `provision apply` creates a CT that does not exist from its `proxmox_ct_spec`, through the
lab's API (fakepve drives a real nspawn body, provision/lab/ctbody.py), learns its ssh host key on its node (the
nodes' `pct` stand-in), converges it, and a second apply changes nothing; an existing CT that differs from its spec
is planned, then brought to it where PVE can in place (a root disk is never shrunk); a CT that serves another host
key than the one its node reads is refused.

Each test works on a copy of the lab inventory with a second container, sglang-02 (CT 150 on pve-grub, on the lab's
next free link, reached as root with the lab's client key, which its spec gives `ssh-public-keys`), and runs
`--limit` to its container and `--tags gpu` (the create runs before every phase). CT 150 is deleted at the end, and
its line in the lab's known_hosts with it; CT 101's config is put back.
"""

from __future__ import annotations

import contextlib
import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from provision import locks
from provision.lab.ctbody import _link_in_use, net_index
from provision.lab.specs import ct_spec
from provision.paths import module_util
from tests.conftest import run_provision
from tests.lab.common import apply, as_root, pve_api, wait_task

LAB_CHANGES = {"gpu", "ct"}  # tests/lab/conftest.py
LAB_NODES = "nspawn"  # no bootloader, no kernel line changed: nodes as nspawn containers (docs/lab.md)

NODE, VMID, NAME = "pve-grub", 150, "sglang-02"
CREATE_TASK = "Create the container from proxmox_ct_spec when its VMID does not exist"  # roles/proxmox_ct
SPEC_MEMORY = 3072


def spec(lab, address_index: int) -> dict:
    public_key = Path(f"{lab.client_key}.pub").read_text().strip()
    return ct_spec(public_key, address_index, NAME, memory=SPEC_MEMORY, startup_order=2)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    return tmp_path_factory.mktemp("ct-runs")


@pytest.fixture(scope="module")
def new_ct(lab, lab_inventory, tmp_path_factory):
    """A copy of the lab inventory with sglang-02 (CT 150, not created yet) on the lab's next free link; CT 150
    and its known_hosts line are removed afterwards."""
    assert VMID not in lab.created_containers(), "CT 150 left behind by an earlier module"
    index = net_index(None, {c.spec.index for c in lab.containers()}, _link_in_use, lab.net_index)
    inv = tmp_path_factory.mktemp("ct-inventory") / "lab"
    shutil.copytree(lab_inventory, inv)
    hosts = yaml.safe_load((inv / "hosts.yml").read_text())
    hosts["all"]["children"]["gpu_containers"]["hosts"][NAME] = {
        "ansible_host": f"10.213.{index}.2",
        "ansible_user": "root",
        "proxmox_host": NODE,
        "proxmox_vmid": VMID,
        "proxmox_ct_spec": spec(lab, index),
        "proxmox_ct_ssh_timeout": 30,
    }
    (inv / "hosts.yml").write_text(yaml.safe_dump(hosts, sort_keys=False))
    yield inv, f"10.213.{index}.2"
    api = pve_api(lab)
    with contextlib.suppress(Exception):
        wait_task(api, NODE, api.nodes(NODE).lxc(VMID).delete(force=1))
    subprocess.run(["ssh-keygen", "-R", f"10.213.{index}.2", "-f", str(lab.known_hosts)], capture_output=True)


def known_keys(lab, address: str) -> list[str]:
    """The keys the lab's known_hosts holds for `address`, as `type base64`."""
    lines = lab.known_hosts.read_text().splitlines()
    return [" ".join(line.split()[1:3]) for line in lines if line.split()[:1] == [address]]


def body_key(body) -> str:
    """The ed25519 host key the create wrote into the body's root, read on this side."""
    return " ".join((body.dir / "upper" / "etc" / "ssh" / "ssh_host_ed25519_key.pub").read_text().split()[:2])


def created_under_node_lock(record: Path) -> bool:
    """Whether, in the run's job events (runner's order), the read that took the host lock of NAME's node (under
    --limit, the container's delegated read of its node) answered `taken` before the create task started on NAME."""
    events = sorted(
        (json.loads(p.read_text()) for p in (record / "artifacts" / "run" / "job_events").glob("*.json")),
        key=lambda e: e.get("counter", 0),
    )
    for event in events:
        data = event.get("event_data") or {}
        if data.get("host") != NAME:
            continue
        if event["event"] == "runner_on_ok" and data.get("task") == locks.NODE_READ_TASK:
            lock = json.loads((data.get("res") or {}).get("stdout") or "{}").get("lock") or {}
            if lock.get("taken"):
                return True
        if event["event"] == "runner_on_start" and data.get("task") == CREATE_TASK:
            return False
    return False


def test_a_missing_ct_is_pending_in_the_plan_then_created_from_its_spec_and_converged(lab, new_ct, runs):
    inv, address = new_ct
    proc = run_provision(
        "plan",
        "--inventory",
        str(inv),
        "--limit",
        NAME,
        "--tags",
        "gpu",
        "--json",
        "--runs-dir",
        str(runs),
        timeout=1200,
    )
    plan = json.loads(proc.stdout)
    assert proc.returncode == 4 and plan["hosts"][NAME] == "changes pending", proc.stderr[-3000:]
    said = " ".join(plan["result"]["reports"][NAME])
    assert f"create CT {VMID} on {NODE}" in said and "pending" in said, said
    assert VMID not in lab.created_containers() and known_keys(lab, address) == [], "check mode created nothing"

    records = set(runs.iterdir())
    rc, result, err = apply(inv, runs, "--limit", NAME, "--tags", "gpu")
    assert rc == 0, err[-3000:]
    (record,) = set(runs.iterdir()) - records
    assert created_under_node_lock(record), "the create reached PVE before the run held its node's host lock"
    ct = lab.pve_control("GET", f"/ct/{VMID}")
    assert ct["status"] == "running"
    config = ct["config"]
    assert (config["memory"], config["features"], str(config["onboot"]), config["startup"]) == (
        SPEC_MEMORY,
        "nesting=1",
        "1",
        "order=2",
    )
    assert config["hostname"] == NAME and f"ip={address}/30" in config["net0"]
    body = lab.created_containers()[VMID]
    # the key in known_hosts is the one the create wrote into the CT's root: read on the node, never learnt over ssh
    assert known_keys(lab, address) == [body_key(body)]
    # converged like any other container: the gpu phase ran in it
    assert as_root(lab, body).ssh("nvidia-smi --version").stdout.count("DRIVER version") == 1

    requests = lab.pve_control("GET", "/requests")
    rc, result, err = apply(inv, runs, "--limit", NAME, "--tags", "gpu")
    assert rc == 0, err[-3000:]
    assert result["hosts"][NAME]["changed"] == 0, result["hosts"][NAME]
    again = lab.pve_control("GET", "/requests")[len(requests) :]
    assert not [r for r in again if r[0] in ("POST", "PUT", "DELETE") and r[1] != "/api2/json/access/ticket"], again
    assert known_keys(lab, address) == [body_key(body)]


def test_an_existing_ct_that_differs_from_its_spec_is_planned_then_brought_to_it(lab, new_ct, runs):
    """CT 101 with less memory than its spec, nesting off and a root disk larger than the spec's: `plan` names the
    memory and nesting changes and makes none; `apply` makes them through the API (the running CT has the memory at
    once; nesting waits for its next start, and the report says so), warns that the disk is never shrunk, and a
    second apply changes nothing."""
    inv, _ = new_ct
    before = lab.pve_control("GET", "/ct/101")["config"]
    lab.pve_control("POST", "/ct-config", {"vmid": 101, "set": {"memory": 1024, "features": "nesting=0"}})
    hosts = yaml.safe_load((inv / "hosts.yml").read_text())
    sglang01 = hosts["all"]["children"]["gpu_containers"]["hosts"]["sglang-01"]
    index = int(sglang01["ansible_host"].split(".")[2])
    differs = inv.parent / "differs"
    shutil.copytree(inv, differs)
    disk = int(float(re.search(r"size=(\d+(?:\.\d+)?)G", before["rootfs"]).group(1)))
    # the spec of CT 101 as it runs (its address, cores, startup order...), but for more memory and a smaller disk;
    # nesting is the spec's default. The gpu phase sets nesting=1 itself unless told not to: that is its own
    # convergence, not the spec's
    actual = module_util("lxc_spec").actual_fields(before)
    base = {k: v for k, v in spec(lab, index).items() if actual.get(k, "") is not None}  # none it does not set
    as_it_runs = {k: v for k, v in actual.items() if v is not None and k != "nesting"}
    sglang01.update(
        proxmox_ct_spec={**base, **as_it_runs, "memory": 4096, "rootfs_size": disk - 1},
        gpu_passthrough_nesting=False,
    )
    (differs / "hosts.yml").write_text(yaml.safe_dump(hosts, sort_keys=False))
    try:
        seen = len(lab.pve_control("GET", "/requests"))
        proc = run_provision("plan", "--inventory", str(differs), "--limit", "sglang-01", "--tags", "gpu", "--json")
        planned = json.loads(proc.stdout)["result"]
        said = next(m for m in planned["reports"]["sglang-01"] if m.startswith("CT 101 on pve-grub: exists"))
        assert "would change memory, features to proxmox_ct_spec" in said, said
        calls = lab.pve_control("GET", "/requests")[seen:]
        assert not [c for c in calls if c[0] != "GET" and not c[1].endswith("/access/ticket")], calls

        rc, result, err = apply(differs, runs, "--limit", "sglang-01", "--tags", "gpu")
        assert rc == 0, err[-3000:]
        said = next(m for m in result["reports"]["sglang-01"] if m.startswith("CT 101 on pve-grub: exists"))
        assert said.startswith(
            "CT 101 on pve-grub: exists; changed memory, features to proxmox_ct_spec (pending until "
            "it restarts: features); differs from proxmox_ct_spec, left as it is: rootfs_size"
        ), said
        warning = next(w for w in result["warnings"] if "differs from proxmox_ct_spec" in w)
        assert f"rootfs_size {disk - 1} (spec) vs {disk} (actual) (a root disk is never shrunk)" in warning, warning
        after = lab.pve_control("GET", "/ct/101")
        assert after["config"]["memory"] == 4096 and f"size={disk}G" in after["config"]["rootfs"], after
        assert after["pending"].get("features") == "nesting=1", after

        rc, again, err = apply(differs, runs, "--limit", "sglang-01", "--tags", "gpu")
        assert rc == 0, err[-3000:]
        said = next(m for m in again["reports"]["sglang-01"] if m.startswith("CT 101 on pve-grub: exists"))
        # what waits for the CT's next start is said on every run until then
        assert said == (
            "CT 101 on pve-grub: exists (pending until it restarts: features); differs from proxmox_ct_spec, left as "
            "it is: rootfs_size"
        ), said
    finally:
        keys = ("memory", "features")
        lab.pve_control(
            "POST",
            "/ct-config",
            {
                "vmid": 101,
                "set": {k: before[k] for k in keys if k in before},
                "delete": [k for k in keys if k not in before],
            },
        )


def test_a_ct_that_serves_another_host_key_than_its_node_reads_is_refused(lab, new_ct, runs):
    inv, address = new_ct
    if VMID not in lab.created_containers():  # this test alone: make CT 150 first
        assert apply(inv, runs, "--limit", NAME, "--tags", "gpu")[0] == 0
    body = lab.created_containers()[VMID]
    trusted = known_keys(lab, address)
    assert trusted == [body_key(body)]
    # the CT now serves a new key; its node still reads the create's (the lab's pct copy, docs/lab.md)
    swap = (
        "rm -f /etc/ssh/ssh_host_ed25519_key /etc/ssh/ssh_host_ed25519_key.pub && "
        "ssh-keygen -q -t ed25519 -N '' -f /etc/ssh/ssh_host_ed25519_key && systemctl restart ssh"
    )
    assert as_root(lab, body).ssh(swap).returncode == 0
    served = body_key(body)
    assert served != trusted[0]

    # with the node's key known: ssh itself refuses the container, and nothing replaces the known key
    rc, result, err = apply(inv, runs, "--limit", NAME, "--tags", "gpu")
    assert rc == 1 and result["hosts"][NAME]["unreachable"], err[-3000:]
    assert known_keys(lab, address) == trusted

    # with no key known for its address: the node's read is trusted and the container that serves another is refused
    subprocess.run(["ssh-keygen", "-R", address, "-f", str(lab.known_hosts)], check=True, capture_output=True)
    proc = run_provision(
        "apply",
        "--inventory",
        str(inv),
        "--limit",
        NAME,
        "--tags",
        "gpu",
        "--yes",
        "--json",
        "--runs-dir",
        str(runs),
        timeout=1800,
    )
    data = json.loads(proc.stdout)
    assert proc.returncode == 1 and data["hosts"][NAME] == "failed", proc.stderr[-3000:]
    refusal = (
        f"{NAME}: {address} serves an ssh host key that is not the one its node {NODE} reads in CT {VMID}: "
        "refusing to connect"
    )
    said = [f["message"] for f in data["result"]["failures"]]
    assert [line for line in said if refusal in line], said
    assert all("\n" not in line for line in said)
    assert known_keys(lab, address) == trusted, "the node's key, never the one served"


def _systemd_cgroup(pid: int) -> str:
    """The cgroup a process is in, in the hierarchy its systemd manages (cgroup v1's name=systemd, else v2's)."""
    lines = Path(f"/proc/{pid}/cgroup").read_text().splitlines()
    line = next((x for x in lines if ":name=systemd:" in x), None) or next(x for x in lines if x.startswith("0::"))
    return line.split(":", 2)[2]


def test_every_ct_and_nspawn_node_runs_in_a_cgroup_of_its_own(lab):
    """Each nspawn machine of the lab (nodes, CTs, CTs created through the API) in a cgroup of its own, as LXC gives
    each CT its own: started from one shared cgroup, their systemds managed the same `payload/system.slice/<unit>`
    directories, and at 16 CTs one CT's unit failed with 219/CGROUP (docs/lab.md)."""
    machines = [*lab.vms(), *lab.containers(), *lab.created_containers().values()]
    cgroups = {}
    for machine in machines:
        leader = machine.leader()
        assert leader, f"{machine.spec.name}: its init is not running"
        cgroups[machine.spec.name] = _systemd_cgroup(leader)
    assert len(machines) >= 3 and len(set(cgroups.values())) == len(cgroups), cgroups
    assert all(f"/provision-lab/{name}-" in path for name, path in cgroups.items()), cgroups
