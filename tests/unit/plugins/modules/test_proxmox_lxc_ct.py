"""plugins/modules/proxmox_lxc_ct.py and module_utils/lxc_spec.py: the container made from the inventory's spec.

The module runs as Ansible runs it (its main(), arguments through patch_module_args) against a small in-process
stand-in of the PVE API calls it makes (proxmoxer's call chain, answering as PVE's schema says: UPIDs for the
tasks, `stopped` with an exitstatus, the cluster's guest list). What is checked is what a user sees: the steps it
takes and in which order, what a create asks PVE for, the warning about an existing CT that differs (and that
nothing is written to it), check mode asking for nothing but reads, a lost answer not creating twice, and
`provision inventory check`'s lines for a wrong spec.
"""

from __future__ import annotations

import json
import textwrap

import pytest

from provision import inventory
from tests.unit import collection
from tests.unit.plugins.modules.test_proxmox_lxc_gpu_faults import Served, api_args, pki
from tests.unit.provision.lab.test_pve import pve as lab_api  # noqa: F401 (a fixture: the lab's API, alone)

__all__ = ["pki"]  # a fixture: fakepve's certificate

NODE, VMID = "pve1", 150
TEMPLATE = "local:vztmpl/debian-12-standard_12.7-1_amd64.tar.zst"
KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIKzKg6h3XvRMiPpGZ2ydPkN1nI7Fq1m0kLQyJ0G9qvPq ops@controller"
SPEC = {
    "template": TEMPLATE,
    "storage": "local-lvm",
    "rootfs_size": 32,
    "cores": 8,
    "memory": 65536,
    "swap": 0,
    "hostname": "sglang-02",
    "net0": {"bridge": "vmbr0", "ip": "192.0.2.111/24", "gw": "192.0.2.1"},
    "ssh_public_keys": [KEY],
    "startup_order": 2,
}


class LostConnectionError(ConnectionError):
    """requests' ConnectionError is one of these: the module's pve_api.lost_connection matches it by name."""


class Resource:
    """proxmoxer's ProxmoxResource: attribute and call build the path, get/post/put send it."""

    def __init__(self, api, path):
        self.api, self.path = api, path

    def __getattr__(self, name):
        return Resource(self.api, [*self.path, name])

    def __call__(self, segment):
        return Resource(self.api, [*self.path, str(segment)])

    def get(self, **kw):
        return self.api.handle("GET", "/".join(self.path), kw)

    def post(self, **kw):
        return self.api.handle("POST", "/".join(self.path), kw)

    def put(self, **kw):
        return self.api.handle("PUT", "/".join(self.path), kw)


class FakePve:
    """The calls proxmox_lxc_ct makes, answered as PVE answers them; `lose` the answer of a POST after PVE acted."""

    def __init__(self, guests=(), configs=None, templates=(TEMPLATE,)):
        self.guests = list(guests)
        self.configs = dict(configs or {})
        self.templates = set(templates)
        self.calls: list[tuple[str, str, dict]] = []
        self.tasks: dict[str, dict] = {}
        self.exitstatus: dict[str, str] = {}
        self.lose: set[str] = set()

    def root(self):
        return Resource(self, [])

    def _task(self, kind, vmid=""):
        upid = f"UPID:{NODE}:0000{len(self.tasks):04X}:00000001:6700000{len(self.tasks)}:{kind}:{vmid}:root@pam:"
        self.tasks[upid] = {
            "upid": upid,
            "type": kind,
            "starttime": len(self.tasks),
            "status": "stopped",
            "exitstatus": self.exitstatus.get(kind, "OK"),
        }
        return upid

    def handle(self, method, path, kw):
        self.calls.append((method, path, kw))
        answer = self._answer(method, path, kw)
        if method == "POST" and path.split("/")[-1] in self.lose:
            self.lose.discard(path.split("/")[-1])
            raise LostConnectionError("Connection aborted.")
        return answer

    def _answer(self, method, path, kw):
        parts = path.split("/")
        if path == "cluster/resources":
            return self.guests
        if parts[-1] == "content":
            return [{"volid": v} for v in sorted(self.templates)]
        if parts[-1] == "download-url":
            self.templates.add(f"{parts[3]}:vztmpl/{kw['filename']}")
            return self._task("download")
        if parts[-1] == "aplinfo":
            self.templates.add(f"{kw['storage']}:vztmpl/{kw['template']}")
            return self._task("download")
        if path == f"nodes/{NODE}/lxc" and method == "POST":
            # as PVE writes the new config: the root disk a volume of its own with its size, net0 with a MAC and
            # its type (pve-container API2/LXC.pm create_vm; LXC/Config.pm), the create-only keys gone
            create_only = ("vmid", "ostemplate", "storage", "ssh-public-keys")
            config = {k: v for k, v in kw.items() if k not in create_only}
            storage, size = kw["rootfs"].split(":")
            config["rootfs"] = f"{storage}:vm-{kw['vmid']}-disk-0,size={size}G"
            config["net0"] = kw["net0"].replace(",ip=", ",hwaddr=BC:24:11:5E:00:01,ip=") + ",type=veth"
            self.configs[kw["vmid"]] = config
            self.guests.append({"vmid": kw["vmid"], "type": "lxc", "node": NODE, "status": "stopped"})
            return self._task("vzcreate", kw["vmid"])
        if parts[-1] == "start":
            next(g for g in self.guests if g["vmid"] == int(parts[3]))["status"] = "running"
            return self._task("vzstart", parts[3])
        if parts[-1] == "current":
            return {"status": next(g for g in self.guests if g["vmid"] == int(parts[3]))["status"]}
        if parts[-1] == "config":
            return self.configs[int(parts[3])]
        if parts[-1] == "pending":  # a CT this fake starts takes its config at once: nothing waits
            return [{"key": k, "value": v} for k, v in self.configs[int(parts[3])].items()]
        if parts[-1] == "status" and parts[2] == "tasks":
            return self.tasks[parts[3]]
        if parts[-1] == "log":
            return [{"n": 1, "t": "TASK ERROR: " + self.tasks[parts[3]]["exitstatus"]}]
        if parts[-1] == "tasks":
            return [t for t in self.tasks.values() if t["type"] == kw.get("typefilter")]
        raise AssertionError(f"unexpected call {method} {path}")


class Clock:
    monotonic = staticmethod(__import__("time").monotonic)

    @staticmethod
    def sleep(seconds):
        pass


@pytest.fixture
def module(monkeypatch):
    mod = collection.module("proxmox_lxc_ct")
    monkeypatch.setattr(mod.pve_api, "time", Clock)
    return mod


def run(module, monkeypatch, pve, check=False, **params):
    monkeypatch.setattr(module, "connect", lambda p: pve.root())
    args = {
        "api_host": "127.0.0.1",
        "api_password": "secret",
        "node": NODE,
        "vmid": VMID,
        "spec": SPEC,
        "_ansible_check_mode": check,
        **params,
    }
    return collection.main_result(module, args)


def posts(pve):
    return [path for method, path, _ in pve.calls if method in ("POST", "PUT", "DELETE")]


def test_a_missing_ct_is_created_from_the_spec_and_started(module, monkeypatch):
    pve = FakePve()
    result = run(module, monkeypatch, pve)
    assert result["changed"] and result["created"] and result["status"] == "running", result
    assert result["steps"] == [f"create CT {VMID} on {NODE}", f"start CT {VMID}"]
    assert posts(pve) == [f"nodes/{NODE}/lxc", f"nodes/{NODE}/lxc/{VMID}/status/start"]
    create = next(kw for method, path, kw in pve.calls if path == f"nodes/{NODE}/lxc")
    assert create == {
        "vmid": VMID,
        "ostemplate": TEMPLATE,
        "hostname": "sglang-02",
        "storage": "local-lvm",
        "rootfs": "local-lvm:32",
        "memory": 65536,
        "swap": 0,
        "cores": 8,
        "net0": "name=eth0,bridge=vmbr0,ip=192.0.2.111/24,gw=192.0.2.1",
        "ssh-public-keys": KEY + "\n",
        "unprivileged": 1,
        "features": "nesting=1",
        "onboot": 1,
        "startup": "order=2",
    }
    # each task waited for: its status read after the POST that started it
    statuses = [i for i, (m, p, _) in enumerate(pve.calls) if p.endswith("/status") and "/tasks/" in p]
    assert len(statuses) == 2


def test_the_second_run_changes_nothing(module, monkeypatch, capsys):
    pve = FakePve()
    run(module, monkeypatch, pve)
    before = len(posts(pve))
    again = run(module, monkeypatch, pve)
    assert not again["changed"] and not again["created"] and again["differences"] == [], again
    assert len(posts(pve)) == before, "nothing written"
    assert "warnings" not in again and "differs" not in capsys.readouterr().err


def test_check_mode_lists_the_create_as_pending_and_asks_for_reads_only(module, monkeypatch):
    pve = FakePve(templates=())
    result = run(module, monkeypatch, pve, check=True)
    assert result["changed"] and result["created"], result
    assert result["steps"] == [f"download template {TEMPLATE}", f"create CT {VMID} on {NODE}", f"start CT {VMID}"]
    assert posts(pve) == [] and {m for m, _, _ in pve.calls} == {"GET"}


# CT 150 as PVE wrote it at its create from an older spec: 16 GiB, 2 GiB of memory, nesting off, another address
CREATED = {
    "hostname": "sglang-02",
    "rootfs": "local-lvm:vm-150-disk-0,size=16G",
    "cores": 8,
    "memory": 2048,
    "swap": 0,
    "unprivileged": 1,
    "features": "keyctl=1,nesting=0",
    "onboot": 1,
    "startup": "order=2,up=30",
    "net0": "name=eth0,bridge=vmbr0,hwaddr=BC:24:11:00:00:01,ip=192.0.2.110/24,gw=192.0.2.1,tag=20,type=veth",
}
NET0_KEPT = "another net0 re-plugs a running CT's network and drops its connections"


@pytest.fixture
def served(pki):
    """fakepve (PVE's schema, digests, pending changes, resize's rules) with CT 150 running as CREATED."""
    served = Served(*pki)
    served.pve.add_ct(VMID, "sglang-02", node=NODE, status="running", config=dict(CREATED))
    yield served
    served.stop()


def run_served(module, served, check=False, disruptive=False, **spec):
    args = {**api_args(served), "node": NODE, "vmid": VMID, "spec": {**SPEC, **spec}, "_ansible_check_mode": check}
    return collection.main_result(module, {**args, "disruptive": disruptive, "_ansible_diff": True})


def merged(ct) -> dict:
    """The config with its pending values: what the CT has once it restarts."""
    return {**ct.config, **{k: v for k, v in ct.pending.items() if v is not None}}


def test_an_existing_ct_is_planned_then_brought_to_its_spec_and_a_second_run_changes_nothing(module, served):
    """Running: more memory, nesting and a larger disk are planned in check mode, then applied (memory at once,
    nesting pending until its next start, said on every run); another net0 waits for proxmox_ct_disruptive_changes."""
    ct = served.pve.ct(VMID)
    digest = ct.digest()
    plan = run_served(module, served, check=True)
    assert plan["changed"] and not plan["created"], plan
    assert plan["updated"] == ["memory", "features", "rootfs"], plan
    assert f"CT {VMID}: grow the root disk to 32G" in plan["steps"]
    assert "memory: 2048" in plan["diff"]["before"] and "memory: 65536" in plan["diff"]["after"]
    assert "rootfs: local-lvm:vm-150-disk-0,size=32G\n" in plan["diff"]["after"]
    assert ct.digest() == digest and not served.pve.tasks, "check mode: nothing written"

    done = run_served(module, served)
    assert done["changed"] and "failed" not in done, done
    served.idle()
    assert merged(ct)["memory"] == 65536 and ct.config["memory"] == 65536  # hot: the running CT has it
    assert merged(ct)["features"] == "keyctl=1,nesting=1"  # the other flag kept
    assert "size=32G" in ct.config["rootfs"] and merged(ct)["startup"] == "order=2,up=30"
    assert done["pending"] == ["features"] and sorted(ct.pending) == ["features"], (done, ct.pending)
    assert [(d["field"], d["why"]) for d in done["differences"]] == [
        ("net0", NET0_KEPT + ": set proxmox_ct_disruptive_changes=true, or stop it")
    ]
    assert merged(ct)["net0"] == CREATED["net0"]

    again = run_served(module, served)
    assert not again["changed"] and again["updated"] == [] and again["pending"] == ["features"], again


def test_another_net0_is_applied_when_allowed_keeping_what_the_spec_does_not_name(module, served):
    ct = served.pve.ct(VMID)
    done = run_served(module, served, disruptive=True)
    assert "net0" in done["updated"], done
    net0 = dict(part.split("=", 1) for part in merged(ct)["net0"].split(","))
    assert net0 == {
        "name": "eth0",
        "bridge": "vmbr0",
        "ip": "192.0.2.111/24",
        "gw": "192.0.2.1",
        "hwaddr": "BC:24:11:00:00:01",  # the MAC kept: a new one would be a new interface
        "tag": "20",  # a VLAN the spec does not name stays
        "type": "veth",
    }
    assert not run_served(module, served, disruptive=True)["changed"]


def test_less_memory_waits_while_the_ct_runs_and_is_applied_once_it_is_stopped(module, served):
    ct = served.pve.ct(VMID)
    as_created = {"nesting": False, "net0": {**SPEC["net0"], "ip": "192.0.2.110/24"}, "rootfs_size": 16}
    running = run_served(module, served, memory=1024, **as_created)
    assert not running["changed"] and [d["field"] for d in running["differences"]] == ["memory"], running
    assert ct.config["memory"] == 2048
    ct.status = "stopped"
    next(g for g in served.pve.ct_resources(None) if g["vmid"] == VMID)  # the cluster lists it stopped now
    stopped = run_served(module, served, memory=1024, **as_created)
    assert stopped["changed"] and stopped["updated"] == ["memory"] and ct.config["memory"] == 1024, stopped


def test_a_smaller_disk_another_storage_or_privilege_is_reported_and_never_applied(module, served, capsys):
    ct = served.pve.ct(VMID)
    digest = ct.digest()
    as_created = {"memory": 2048, "nesting": False, "net0": {**SPEC["net0"], "ip": "192.0.2.110/24"}}
    result = run_served(module, served, rootfs_size=8, storage="zfs", unprivileged=False, **as_created)
    assert not result["changed"], result
    assert [(d["field"], d["why"]) for d in result["differences"]] == [
        ("storage", "moving the root disk is not a spec change"),
        ("rootfs_size", "a root disk is never shrunk"),
        ("unprivileged", "a CT is made privileged or not when it is created"),
    ]
    warned = result.get("warnings") or capsys.readouterr().err.replace("[WARNING]: ", "").splitlines()
    assert warned == [
        f"CT {VMID} on {NODE} differs from proxmox_ct_spec, left as it is: storage zfs (spec) vs local-lvm (actual) "
        "(moving the root disk is not a spec change); rootfs_size 8 (spec) vs 16 (actual) (a root disk is never "
        "shrunk); unprivileged False (spec) vs True (actual) (a CT is made privileged or not when it is created)"
    ]
    assert ct.digest() == digest and not served.pve.tasks


def test_a_missing_template_is_downloaded_with_its_sha256_before_the_create(module, monkeypatch):
    pve = FakePve(templates=())
    spec = {
        **SPEC,
        "template_url": "https://mirror.example.net/debian-12-standard_12.7-1_amd64.tar.zst",
        "template_sha256": "AB" * 32,
    }
    result = run(module, monkeypatch, pve, spec=spec)
    assert result["created"], result
    assert posts(pve)[0] == f"nodes/{NODE}/storage/local/download-url"
    download = pve.calls[[p for _, p, _ in pve.calls].index(f"nodes/{NODE}/storage/local/download-url")][2]
    assert download == {
        "content": "vztmpl",
        "filename": "debian-12-standard_12.7-1_amd64.tar.zst",
        "url": spec["template_url"],
        "checksum": "ab" * 32,
        "checksum-algorithm": "sha256",
    }


def test_without_a_url_the_template_comes_from_the_appliance_index(module, monkeypatch):
    pve = FakePve(templates=())
    run(module, monkeypatch, pve)
    aplinfo = next(kw for m, p, kw in pve.calls if p == f"nodes/{NODE}/aplinfo")
    assert aplinfo == {"storage": "local", "template": "debian-12-standard_12.7-1_amd64.tar.zst"}


def test_a_failed_task_stops_the_run_with_its_error_line_and_starts_nothing(module, monkeypatch):
    pve = FakePve()
    pve.exitstatus["vzcreate"] = "unable to create CT 150 - storage 'local-lvm' does not exist"
    result = run(module, monkeypatch, pve)
    assert result["failed"] and "\n" not in result["msg"], result
    assert result["msg"].startswith(f"CT {VMID} on {NODE}: creating CT {VMID} (task UPID:")
    assert "storage 'local-lvm' does not exist" in result["msg"]
    assert f"nodes/{NODE}/lxc/{VMID}/status/start" not in posts(pve)


def test_a_lost_answer_to_the_create_is_not_answered_with_a_second_create(module, monkeypatch):
    pve = FakePve()
    pve.lose.add("lxc")
    result = run(module, monkeypatch, pve)
    assert result["created"] and result["status"] == "running", result
    assert posts(pve).count(f"nodes/{NODE}/lxc") == 1


def test_a_vmid_on_another_node_or_of_a_vm_is_refused(module, monkeypatch):
    other = FakePve(guests=[{"vmid": VMID, "type": "lxc", "node": "pve2", "status": "running"}])
    result = run(module, monkeypatch, other)
    assert result["failed"] and f"CT {VMID} exists on node pve2, not on {NODE}" in result["msg"], result
    vm = FakePve(guests=[{"vmid": VMID, "type": "qemu", "node": NODE, "status": "running"}])
    assert f"VMID {VMID} is a qemu guest" in run(module, monkeypatch, vm)["msg"]
    assert posts(other) == posts(vm) == []


def test_a_wrong_spec_fails_before_the_api_is_called(module, monkeypatch):
    pve = FakePve()
    result = run(module, monkeypatch, pve, spec={**SPEC, "memory": "lots"})
    assert result["failed"] and "proxmox_ct_spec.memory: expected an integer" in result["msg"], result
    assert pve.calls == []


# ---------------------------------------------------------------- the spec's rules (module_utils/lxc_spec.py)
def _lxc_spec():
    from provision.paths import module_util

    return module_util("lxc_spec")


@pytest.mark.parametrize(
    ("change", "problem"),
    [
        ({"template": "debian-12.tar.zst"}, "proxmox_ct_spec.template: expected a template volume"),
        ({"rootfs_size": 0}, "proxmox_ct_spec.rootfs_size: 0 is out of range 1..131072"),
        ({"memory": True}, "proxmox_ct_spec.memory: expected an integer"),
        ({"hostname": "sglang_02"}, "proxmox_ct_spec.hostname: expected a DNS host name"),
        ({"net0": {"bridge": "vmbr0", "ip": "dhcp", "gw": "192.0.2.1"}}, "proxmox_ct_spec.net0: gw: DHCP gives"),
        ({"net0": {"bridge": "vmbr0", "ip": "192.0.2.5"}}, "proxmox_ct_spec.net0: ip: expected dhcp or an IPv4"),
        ({"net0": {"bridge": "vmbr0", "ip": "dhcp", "mtu": 9000}}, "proxmox_ct_spec.net0: unknown key(s) mtu"),
        ({"ssh_public_keys": "not a key"}, "proxmox_ct_spec.ssh_public_keys: line 1 is not an ssh public key"),
        ({"template_url": "https://example.net/t.tar.zst"}, "proxmox_ct_spec.template_sha256: missing"),
        ({"nesting": "yes"}, "proxmox_ct_spec.nesting: expected true or false"),
        ({"memroy": 4096}, "proxmox_ct_spec.memroy: unknown field"),
        ({"storage": None}, "proxmox_ct_spec.storage: missing"),
    ],
)
def test_spec_problems_name_the_field(change, problem):
    found = _lxc_spec().problems({**SPEC, **change})
    assert len(found) == 1 and found[0].startswith(problem), found


def test_a_good_spec_and_a_templated_value_have_no_problems():
    assert _lxc_spec().problems(SPEC) == []
    assert _lxc_spec().problems({**SPEC, "ssh_public_keys": "{{ lookup('file', '~/.ssh/id_ed25519.pub') }}"}) == []
    assert _lxc_spec().problems({**SPEC, "net0": {"bridge": "vmbr0", "ip": "dhcp"}}) == []
    templated_key = "{{ lookup('ansible.builtin.file', 'k.pub') }}"
    assert _lxc_spec().problems({**SPEC, "ssh_public_keys": [KEY, templated_key]}) == []


def test_inventory_check_names_file_host_and_field(tmp_path):
    (tmp_path / "hosts.yml").write_text(
        textwrap.dedent(f"""\
        all:
          children:
            proxmox_hosts:
              hosts:
                pve1: {{ansible_host: 192.0.2.10}}
            gpu_containers:
              hosts:
                sglang-02:
                  ansible_host: 192.0.2.111
                  proxmox_host: pve1
                  proxmox_vmid: {VMID}
                  proxmox_ct_spec:
                    template: {TEMPLATE}
                    storage: local-lvm
                    rootfs_size: 32
                    memory: lots
                    hostname: sglang-02
                    net0: {{bridge: vmbr0, ip: dhcp}}
                    ssh_public_keys: [{KEY}]
        """)
    )
    with pytest.raises(Exception) as refused:
        inventory.load(tmp_path)
    lines = str(refused.value).splitlines()
    mine = [line for line in lines if "proxmox_ct_spec" in line]
    assert len(mine) == 1, lines
    assert mine[0].startswith(f"{tmp_path / 'hosts.yml'}:"), mine
    assert "host sglang-02: proxmox_ct_spec.memory: expected an integer" in mine[0]


# ---------------------------------------------------------------- against the lab's API (fakepve, PVE's schema)
@pytest.mark.usefixtures("lab_api")
def test_against_the_lab_api_a_missing_ct_is_pending_and_an_existing_ones_changes_planned(tmp_path, module):
    """The same module against `python -m provision.lab.pve` (the lab's fakepve, no lab: no body is started), so the
    calls' shapes are PVE's schema's: the cluster's guest list, the storage's template listing, a CT's config. Check
    mode throughout: nothing but reads."""
    from provision.lab import pve as lab_pve
    from tests.unit.provision.lab.test_pve import NODE as LAB_NODE
    from tests.unit.provision.lab.test_pve import PASSWORD

    seed = json.loads((tmp_path / "pve-seed.json").read_text())
    args = {
        "api_host": "127.0.0.1",
        "api_port": seed["port"],
        "api_password": PASSWORD,
        "node": LAB_NODE,
        "ca_file": str(tmp_path / "pve.crt"),
        "spec": {**SPEC, "hostname": "sglang-01"},
        "_ansible_check_mode": True,
    }
    pending = collection.main_result(module, {**args, "vmid": VMID})
    assert pending["changed"] and pending["steps"] == [f"create CT {VMID} on {LAB_NODE}", f"start CT {VMID}"], pending
    missing = {**args["spec"], "template": "local:vztmpl/ubuntu-24.04-standard_24.04-2_amd64.tar.zst"}
    assert collection.main_result(module, {**args, "vmid": VMID, "spec": missing})["steps"][0].startswith("download")
    # CT 101 as the lab seeds it here: a hostname, fakepve's defaults for the rest; what would change, in check mode
    existing = collection.main_result(module, {**args, "vmid": 101})
    assert existing["changed"] and "memory" in existing["updated"], existing
    seen = lab_pve.control(tmp_path, "GET", "/requests")
    assert [p for m, p in seen if m != "GET" and not p.endswith("/access/ticket")] == [], seen
