"""The check before a Proxmox node reboots: plugins/modules/pve_node_guests.py, and the role's
tasks/before_reboot.yml around it, against fakepve served in this process.

fakepve answers the calls the module makes from PVE's schema and its own state: the node's VMs and containers
(GET /nodes/{node}/qemu and /lxc, each listing only what the user may audit), the cluster's quorum
(GET /cluster/status, `lose_quorum()`), HA state per guest (`hastate` in GET /cluster/resources) and the user's
privileges (GET /access/permissions). A node in no cluster is modelled here (`NodePve.standalone`): PVE then answers
/cluster/status with the node's own entry only (pve-manager PVE/API2/Cluster.pm get_status, "fake entry for local
node if no cluster defined"). The CRM that moves HA services off a node in maintenance mode is not modelled: a test
moves the guest where the CRM would.

The module runs as Ansible runs it (main(), its arguments through patch_module_args), one fault at a time (the same
injection as tests/unit/plugins/modules/test_proxmox_lxc_gpu_faults.py); each case checks the one line the user sees,
that nothing but reads reached PVE, and that the run with the fault gone passes. The role's task file runs through
ansible-playbook on this machine, with a stand-in `ha-manager` that records what it was asked.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.faults import Row
from tests.unit import collection
from tests.unit.plugins.modules.test_proxmox_lxc_gpu_faults import (
    LOGIN,
    NODE,
    VMID,
    Call,
    Clock,
    Fault,
    Served,
    api_args,
    clocked,
    faulty_pve_class,
)

OTHER_NODE = "pve2"
TENANT = 105  # a VM the inventory does not own: the SNP tenant the profile exists for
PERMISSIONS = Call("GET access/permissions", "GET", "/access/permissions")
CLUSTER_STATUS = Call("GET cluster/status", "GET", "/cluster/status")
QEMU_LIST = Call("GET nodes/{node}/qemu", "GET", f"/nodes/{NODE}/qemu")
LXC_LIST = Call("GET nodes/{node}/lxc", "GET", f"/nodes/{NODE}/lxc")
RESOURCES = Call("GET cluster/resources", "GET", "/cluster/resources")
CALLS = [LOGIN, PERMISSIONS, CLUSTER_STATUS, QEMU_LIST, LXC_LIST, RESOURCES]
WHAT = {
    PERMISSIONS: "reading the API user's privileges",
    CLUSTER_STATUS: "reading the cluster status",
    QEMU_LIST: "listing the node's VMs",
    LXC_LIST: "listing the node's containers",
    RESOURCES: "reading the cluster's HA resources",
}
REFUSED = f"{NODE}: not rebooting: "
NOT_OURS = "; stop or migrate them, or set kernel_cmdline_reboot_running_guests: allow"


def node_pve_class():
    from aiohttp import web
    from fakepve.server import ok

    class NodePve(faulty_pve_class()):
        """FaultyPve whose node may be in no cluster, and whose HA stack may be disarmed (`disarm`, as
        pve-ha-manager's manager status holds it: {"mode": "freeze"|"ignore", "state": "disarming"|"disarmed"})."""

        standalone = False
        disarm: dict | None = None

        def _build_app(self):
            app = super()._build_app()
            app.middlewares.insert(0, self._manager_status)
            return app

        @web.middleware
        async def _manager_status(self, request, handler):
            """GET /cluster/ha/status/manager_status as pve-ha-manager's API2/HA/Status.pm answers it."""
            if not request.path.endswith("/cluster/ha/status/manager_status"):
                return await handler(request)
            status = {
                "master_node": NODE,
                "timestamp": int(time.time()),
                "node_status": {NODE: "online"},
                "service_status": {},
                **({"disarm": self.disarm} if self.disarm else {}),
            }
            return ok({"manager_status": status, "quorum": {"node": NODE, "quorate": "1"}, "lrm_status": {}})

        async def _cluster_status(self, request):
            if not self.standalone:
                return await super()._cluster_status(request)
            return ok(
                [
                    {
                        "type": "node",
                        "id": f"node/{NODE}",
                        "name": NODE,
                        "ip": "192.0.2.11",
                        "local": 1,
                        "nodeid": 0,
                        "online": 1,
                        "level": "",
                    }
                ]
            )

    return NodePve


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    from fakepve.certs import make_cert

    return make_cert(str(tmp_path_factory.mktemp("pve-pki")), hosts=("127.0.0.1",))[:2]


@pytest.fixture
def served(pki):
    """CT 101 (the inventory's own) running on pve1, a second node pve2 in the cluster."""
    served = Served(*pki, pve_class=node_pve_class())
    served.pve.add_node(OTHER_NODE)
    yield served
    served.stop()


class MovingClock(Clock):
    """The module's clock; after `after` sleeps, `then()` runs (what PVE's CRM does meanwhile)."""

    def __init__(self, after: int | None = None, then=None):
        super().__init__()
        self.after, self.then = after, then

    def sleep(self, seconds: float) -> None:
        super().sleep(seconds)
        if self.then is not None and len(self.sleeps) == self.after:
            self.then()


@pytest.fixture
def module(monkeypatch):
    return clocked(monkeypatch, "pve_node_guests", MovingClock())


def run(module, served: Served, check: bool = False, **params) -> dict:
    """One run of the module, as Ansible starts it: its result (msg and failed on a failure)."""
    args = {**api_args(served), "node": NODE, "owned": [VMID], "_ansible_check_mode": check, **params}
    return collection.main_result(module, args)


def only_read(served: Served) -> None:
    """Nothing but the login and GETs reached PVE."""
    writes = [(m, p) for m, p, _ in served.pve.requests if m != "GET" and not p.endswith("/access/ticket")]
    assert writes == [], writes


def tenant(served: Served, status: str = "running", ha: str | None = None):
    vm = served.pve.add_vm(TENANT, "snp-tenant", node=NODE, status=status)
    vm.ha_state = ha
    return vm


# ----------------------------------------------------------------------------------------------- the decision


def test_a_running_guest_the_inventory_does_not_own_is_refused_by_name(served, module):
    tenant(served)
    served.pve.add_ct(120, "web", node=NODE, status="running")
    served.pve.add_vm(106, "stopped-vm", node=NODE, status="stopped")
    served.pve.add_vm(107, "elsewhere", node=OTHER_NODE, status="running")
    result = run(module, served)
    assert result.get("failed") and "\n" not in result["msg"], result
    assert result["msg"] == (
        f"{REFUSED}guests running that the inventory does not own: VM {TENANT} (snp-tenant), CT 120 (web){NOT_OURS}"
    )
    assert "exception" not in result
    only_read(served)


def test_the_inventorys_own_containers_do_not_stop_a_reboot(served, module):
    served.pve.add_vm(106, "stopped-vm", node=NODE, status="stopped")
    result = run(module, served)
    assert not result.get("failed"), result.get("msg")
    assert result["running"] == [f"CT {VMID} (sglang)"] and result["foreign_running"] == []
    assert result["refusal"] == "" and result["cluster"]["quorate"] is True and result["ha_managed"] == []
    assert not result["changed"]


def test_a_container_of_the_same_vmid_on_another_inventory_node_is_not_ours(served, module):
    """Ownership is this node's containers in the inventory: the same VMID named for another node is not."""
    result = run(module, served, owned=[])
    assert result.get("failed") and result["msg"] == f"{REFUSED}guests running that the inventory does not own: " + (
        f"CT {VMID} (sglang){NOT_OURS}"
    )


def test_allow_reboots_with_the_guests_running_and_says_which(served, module):
    tenant(served)
    result = run(module, served, running_guests="allow")
    assert not result.get("failed"), result.get("msg")
    assert result["foreign_running"] == [f"VM {TENANT} (snp-tenant)"] and result["refusal"] == ""


def test_check_mode_reports_the_refusal_without_failing(served, module):
    tenant(served)
    result = run(module, served, check=True)
    assert not result.get("failed") and not result["changed"]
    assert result["refusal"].startswith(f"{REFUSED}guests running that the inventory does not own: VM {TENANT}")
    only_read(served)


def test_a_cluster_without_quorum_is_refused_whatever_the_guests(served, module):
    served.pve.lose_quorum()
    result = run(module, served, running_guests="allow")
    assert result.get("failed") and result["msg"] == (
        f"{REFUSED}its cluster fakecluster has no quorum (GET /cluster/status: quorate 0): bring the cluster's "
        "nodes back first"
    )
    served.pve.regain_quorum()
    assert not run(module, served).get("failed")


def test_a_node_in_no_cluster_needs_no_quorum_and_has_no_ha(served, module):
    served.pve.standalone = True
    tenant(served, ha="started")  # a standalone node has no HA; /cluster/resources is not even read
    result = run(module, served, running_guests="allow")
    assert not result.get("failed"), result.get("msg")
    assert result["cluster"] is None and result["ha_managed"] == []
    assert not [p for m, p, _ in served.pve.requests if p.endswith("/cluster/resources")]


def test_guests_ha_manages_on_the_node_are_named_for_maintenance_mode(served, module):
    tenant(served, ha="started")
    served.pve.add_vm(108, "ignored-by-ha", node=NODE, status="stopped").ha_state = "ignored"
    served.pve.add_vm(109, "ha-elsewhere", node=OTHER_NODE, status="running").ha_state = "started"
    result = run(module, served, running_guests="allow")
    assert not result.get("failed"), result.get("msg")
    assert result["ha_managed"] == [f"VM {TENANT} (snp-tenant)"]


def test_the_wait_ends_when_ha_has_moved_its_guests_off_the_node(served, module):
    vm = tenant(served, ha="started")
    module.time.after, module.time.then = 2, lambda: setattr(vm, "node", OTHER_NODE)  # the CRM migrates it
    result = run(module, served, running_guests="allow", wait_ha_away=60)
    assert not result.get("failed"), result.get("msg")
    assert module.time.sleeps == [5, 5] and result["ha_managed"] == [] and result["foreign_running"] == []


@pytest.mark.parametrize("mode", ["freeze", "ignore"])
def test_a_disarmed_ha_stack_is_named_at_once_instead_of_waiting_for_a_move_it_never_makes(served, module, mode):
    """pve-ha-manager drops a maintenance request while disarmed (PVE/HA/Manager.pm): waiting cannot help."""
    tenant(served, ha="started")
    served.pve.disarm = {"mode": mode, "state": "disarmed"}
    result = run(module, served, running_guests="allow", wait_ha_away=60)
    assert result.get("failed") and result["msg"] == (
        f"{NODE}: the HA stack is disarmed (resource mode {mode}): its CRM drops a maintenance request and moves no "
        f"guest, so VM {TENANT} (snp-tenant) stay on the node: arm it (ha-manager crm-command arm-ha) or move them "
        "yourself, then run again: not rebooting"
    )
    assert module.time.sleeps == [], "no wait"
    planned = run(module, served, check=True, running_guests="allow", wait_ha_away=60)
    assert planned["refusal"] == f"{NODE}: not rebooting: " + result["msg"][len(f"{NODE}: ") : -len(": not rebooting")]
    served.pve.disarm = None
    assert run(module, served, running_guests="allow", wait_ha_away=1)["msg"].startswith(f"{NODE}: in HA maintenance")


def test_a_user_that_cannot_audit_every_guest_is_refused(served, module):
    """PVE leaves out of the lists the guests a user may not audit: such a user must not pass the check."""
    served.pve.users["ops@pve"] = "ops-password"
    served.pve.grant("ops@pve", "/", "Sys.Audit")
    served.pve.grant("ops@pve", "/vms/101", "VM.Audit")
    tenant(served)
    result = run(module, served, api_user="ops@pve", api_password="ops-password")
    assert result.get("failed") and result["msg"] == (
        f"{NODE}: ops@pve cannot see every guest: PVE lists only the guests a user may audit, and ops@pve holds no "
        "VM.Audit on /vms (propagated): grant it (e.g. the PVEAuditor role on /vms), then run again"
    )
    served.pve.grant("ops@pve", "/vms", "VM.Audit")
    result = run(module, served, api_user="ops@pve", api_password="ops-password")
    assert result.get("failed") and f"VM {TENANT} (snp-tenant)" in result["msg"], "with VM.Audit it sees the tenant"


def test_no_api_host_is_one_line_naming_the_variable(served, module):
    result = run(module, served, api_host="")
    assert result.get("failed") and result["msg"].startswith(f"{NODE}: proxmox_api_host is not set: ")


# --------------------------------------------------------------------------------------------- the fault matrix

PREFIX = f"{NODE}: "
CHECK_LOGIN = "check proxmox_api_user and proxmox_api_password (or the API token), then run again"
RETRIED = "{what} failed 3 times; the PVE API at 127.0.0.1:… keeps failing ({answer}): run again once it answers"
BROKEN_PIPE = "596 Errors during TLS negotiation, request sending and header processing: Broken pipe"
AFTER = "nothing changed in PVE: only the login and GETs reached it"


@dataclass(frozen=True)
class Case:
    """One row: the fault or state (`fault` for Fault, else `setup(served)`), what the user sees (the whole
    message, `…` for what varies; None: the check passes, `note` says how), and how the test clears it."""

    id: str
    label: str
    sees: str | None
    fault: dict | None = None
    setup: object = None
    clear: object = None
    note: str = ""
    params: tuple = ()

    def row(self) -> Row:
        if self.sees is None:
            sees, converges = f"no failure: {self.note}", "yes, in the same run"
        else:
            sees, converges = f"`{PREFIX}{self.sees}`", "yes: " + (self.note or "the next run passes the check")
        return Row(
            self.label,
            "kernel",
            sees,
            AFTER,
            converges,
            f"tests/unit/plugins/modules/test_pve_node_guests.py::test_reboot_check_fault[{self.id}]",
            True,
            True,
        )


def _slug(call: Call) -> str:
    return re.sub(r"[^a-z0-9]+", "-", call.name.lower().replace("{node}", "node")).strip("-")


def _stop_tenant(served: Served) -> None:
    served.pve.guest(TENANT).status = "stopped"


def _move_tenant(served: Served) -> None:
    served.pve.guest(TENANT).node = OTHER_NODE


def _disarm(served: Served) -> None:
    tenant(served, ha="started")
    served.pve.disarm = {"mode": "freeze", "state": "disarmed"}


def _arm_and_move(served: Served) -> None:
    served.pve.disarm = None
    _move_tenant(served)


def _api_cases() -> list[Case]:
    """401 and 596 on every call, the 403 PVE checks (/cluster/status: Sys.Audit), an offline node (595) and a
    connection reset."""
    cases = [
        Case(
            "login-401",
            "401 on the login before a reboot (`authentication failure`)",
            f"authentication failed for root@pam at https://127.0.0.1:…: {CHECK_LOGIN} (…code: 401)",
            {"call": LOGIN, "error": "authentication_failure"},
        ),
        Case(
            "login-596",
            "596 on the login before a reboot",
            RETRIED.format(what="logging in", answer="596 …code: 596"),
            {"call": LOGIN, "status": 596, "message": "Broken pipe"},
        ),
    ]
    for call in CALLS[1:]:
        cases.append(
            Case(
                f"{_slug(call)}-401",
                f"401 on {call.name} before a reboot (`invalid PVE ticket`)",
                f"{WHAT[call]} was refused (401 Unauthorized: permission denied - invalid PVE ticket): "
                f"the login is no longer valid: {CHECK_LOGIN}",
                {"call": call, "error": "invalid_ticket"},
            )
        )
        cases.append(
            Case(
                f"{_slug(call)}-596",
                f"596 on {call.name} before a reboot, every attempt",
                RETRIED.format(what=WHAT[call], answer=BROKEN_PIPE),
                {"call": call, "status": 596, "message": "Broken pipe"},
            )
        )
    return [
        *cases,
        Case(
            "cluster-status-403",
            "403 on GET cluster/status (no Sys.Audit on /)",
            "reading the cluster status was refused (403 Forbidden: Permission check failed (/, Sys.Audit)): root@pam "
            "lacks the privilege PVE names: grant it on /, then run again",
            {"call": CLUSTER_STATUS, "error": "permission_denied"},
        ),
        Case(
            "qemu-list-595",
            "595 on GET nodes/{node}/qemu (the node is offline), every attempt",
            RETRIED.format(what=WHAT[QEMU_LIST], answer="595 …No route to host"),
            {"call": QEMU_LIST, "error": "no_route_to_host"},
        ),
        Case(
            "qemu-list-reset",
            "connection reset on GET nodes/{node}/qemu, once",
            None,
            {"call": QEMU_LIST, "reset": "before", "times": 1},
            note="the list is read again after 1 s",
        ),
    ]


def _state_cases() -> list[Case]:
    """What the check is for: a guest the inventory does not own, no quorum, HA services that stay."""
    return [
        Case(
            "foreign-guest",
            "a VM the inventory does not own running on the node",
            f"not rebooting: guests running that the inventory does not own: VM {TENANT} (snp-tenant){NOT_OURS}",
            setup=tenant,
            clear=_stop_tenant,
            note="with the VM stopped, the next run passes the check",
        ),
        Case(
            "no-quorum",
            "the node's cluster without quorum",
            "not rebooting: its cluster fakecluster has no quorum (GET /cluster/status: quorate 0): bring the "
            "cluster's nodes back first",
            setup=lambda s: s.pve.lose_quorum(),
            clear=lambda s: s.pve.regain_quorum(),
            note="with quorum back, the next run passes the check",
        ),
        Case(
            "own-gpu-ct-ha",
            "HA manages the inventory's own GPU container on the node (maintenance mode would "
            "relocate it away from its GPUs: pve-ha-manager)",
            f"not rebooting: the inventory's GPU containers are managed by HA: CT {VMID} (sglang) (HA resource "
            f"ct:{VMID}, started); HA maintenance mode would relocate them to another node, which may not have their "
            "GPUs: take them out of HA (ha-manager remove ct:<vmid>, or set their state to ignored) before the reboot",
            setup=lambda s: setattr(s.ct, "ha_state", "started"),
            clear=lambda s: setattr(s.ct, "ha_state", "ignored"),
            note="with the container's HA state ignored, the next run passes the check",
        ),
        Case(
            "ha-stays",
            "an HA-managed VM that maintenance mode does not move off the node (1 s wait)",
            f"in HA maintenance mode, VM {TENANT} (snp-tenant) still running on the node after 1s (HA cannot move a "
            "guest bound to the node by a device, a local disk or a rule, or with no other node to take it): not "
            "rebooting",
            setup=lambda s: tenant(s, ha="started"),
            clear=_move_tenant,
            note="once HA has moved it, the next run passes the check",
            params=(("running_guests", "allow"), ("wait_ha_away", 1)),
        ),
        Case(
            "ha-disarmed",
            "the HA stack disarmed (`ha-manager crm-command disarm-ha freeze`), an HA-managed VM on the node",
            f"the HA stack is disarmed (resource mode freeze): its CRM drops a maintenance request and "
            f"moves no guest, so VM {TENANT} (snp-tenant) stay on the node: arm it (ha-manager crm-command arm-ha) or "
            "move them yourself, then run again: not rebooting",
            setup=_disarm,
            clear=_arm_and_move,
            note="armed again, HA moves it and the next run passes the check",
            params=(("running_guests", "allow"), ("wait_ha_away", 60)),
        ),
    ]


CASES = _api_cases() + _state_cases()
FAULT_ROWS = [c.row() for c in CASES]


def pattern(sees: str) -> re.Pattern:
    return re.compile(".+?".join(re.escape(part) for part in (PREFIX + sees).split("…")))


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_reboot_check_fault(case, served, module):
    fault = Fault(**case.fault) if case.fault else None
    if case.setup:
        case.setup(served)
    served.pve.fault = fault
    result = run(module, served, **dict(case.params))
    served.pve.fault = None
    only_read(served)
    if case.sees is None:
        assert not result.get("failed"), result.get("msg")
    else:
        assert result.get("failed") and "\n" not in result["msg"], result
        assert pattern(case.sees).fullmatch(result["msg"]), result["msg"]
        assert "exception" not in result, "a fault the module knows is no traceback"
    if fault and "keeps failing" in (case.sees or ""):
        assert fault.hits == 3 and module.time.sleeps == [1.0, 2.0], "a bounded retry with backoff"
    elif fault and "was refused" in (case.sees or ""):
        assert fault.hits == 1, "no retry of what no retry changes"
    if case.clear:
        case.clear(served)
    again = run(module, served, **dict(case.params))
    assert not again.get("failed") and again["refusal"] == "", again.get("msg")


# ------------------------------------------------------------------------ the role's tasks, through Ansible

PLAYBOOK = """- hosts: pve1
  gather_facts: false
  tasks:
    - name: What reboot.yml does where a reboot is due, the reboot a stand-in
      block:
        - name: Check the node before it reboots
          ansible.builtin.include_role:
            name: provision.pve_sglang.kernel_cmdline
            tasks_from: before_reboot.yml
        - name: Stand in for the reboot
          ansible.builtin.shell: echo reboot >> {{ log }}
          when: not ansible_check_mode
        - name: Write the outcome for the test
          ansible.builtin.copy:
            dest: "{{ outcome }}"
            content: "{{ {'failed': None, 'checked': _kernel_cmdline_before_reboot} | to_json }}"
            mode: "0600"
          check_mode: false
      rescue:
        - name: Write the failure the user sees for the test
          ansible.builtin.copy:
            dest: "{{ outcome }}"
            content: "{{ {'failed': ansible_failed_result.msg} | to_json }}"
            mode: "0600"
          check_mode: false
        - name: Fail the host again, as the play without this rescue does (so that no handler runs)
          ansible.builtin.fail:
            msg: "{{ ansible_failed_result.msg }}"
"""

HA_MANAGER = """#!/bin/sh
# stand-in for PVE's ha-manager: records what it was asked
echo "$*" >> "$HA_LOG"
"""


class Playbook:
    """before_reboot.yml through ansible-playbook against `served`: the node is this machine (connection local),
    its inventory has CT 101 on it; `ha-manager` is a stand-in whose calls, and the stand-in reboot, go to a log."""

    def __init__(self, root: Path, served: Served):
        self.root, self.served = root, served
        self.log, self.outcome = root / "ha.log", root / "outcome.json"
        (root / "bin").mkdir()
        (root / "bin" / "ha-manager").write_text(HA_MANAGER)
        (root / "bin" / "ha-manager").chmod(0o755)
        (root / "site.yml").write_text(PLAYBOOK)
        self.log.write_text("")
        node = {"ansible_connection": "local", "ansible_python_interpreter": sys.executable}
        hosts = {
            "all": {
                "children": {
                    "proxmox_hosts": {"hosts": {NODE: node}},
                    "gpu_containers": {"hosts": {"sglang-01": {"proxmox_host": NODE, "proxmox_vmid": VMID}}},
                },
                "vars": {
                    "proxmox_api_host": "127.0.0.1",
                    "proxmox_api_port": served.pve.port,
                    "proxmox_api_password": "secret",
                    "proxmox_api_ca_file": served.cafile,
                    "log": str(self.log),
                    "outcome": str(self.outcome),
                },
            }
        }
        (root / "hosts.yml").write_text(json.dumps(hosts))

    def run(self, *extra: str) -> dict:
        self.outcome.unlink(missing_ok=True)
        env = {
            **os.environ,
            "ANSIBLE_COLLECTIONS_PATH": str(collection.COLLECTIONS),
            "ANSIBLE_NOCOLOR": "1",
            "HA_LOG": str(self.log),
            "PATH": f"{self.root / 'bin'}:{os.environ['PATH']}",
        }
        playbook = Path(sys.executable).parent / "ansible-playbook"
        argv = [str(playbook), "-i", str(self.root / "hosts.yml"), str(self.root / "site.yml"), *extra]
        proc = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=300)
        assert self.outcome.exists(), proc.stdout[-3000:] + proc.stderr[-3000:]
        outcome = json.loads(self.outcome.read_text())
        assert (proc.returncode == 0) == (outcome["failed"] is None), proc.stdout[-3000:]
        return dict(outcome, stdout=proc.stdout)

    def calls(self) -> list[str]:
        return self.log.read_text().splitlines()


@pytest.fixture
def playbook(tmp_path, served):
    return Playbook(tmp_path, served)


def test_the_role_refuses_with_the_modules_one_line_and_runs_nothing_on_the_node(playbook, served):
    tenant(served, ha="started")
    outcome = playbook.run()
    assert outcome["failed"] == (
        f"{REFUSED}guests running that the inventory does not own: VM {TENANT} (snp-tenant){NOT_OURS}"
    )
    assert playbook.calls() == [], "no maintenance mode, no reboot"


def test_the_role_puts_the_node_in_ha_maintenance_waits_reboots_then_takes_it_out(playbook, served):
    vm = tenant(served, ha="started")

    def crm():  # PVE's CRM: once maintenance mode is asked for, the HA service migrates to the other node
        deadline = time.monotonic() + 120
        while "enable" not in playbook.log.read_text() and time.monotonic() < deadline:
            time.sleep(0.05)
        vm.node = OTHER_NODE

    mover = threading.Thread(target=crm, daemon=True)
    mover.start()
    outcome = playbook.run("-e", "kernel_cmdline_reboot_running_guests=allow")
    mover.join(1)
    assert outcome["failed"] is None, outcome
    assert playbook.calls() == [
        f"crm-command node-maintenance enable {NODE}",
        "reboot",
        f"crm-command node-maintenance disable {NODE}",
    ]


def test_the_role_takes_maintenance_off_again_when_ha_services_stay(playbook, served):
    tenant(served, ha="started")
    outcome = playbook.run(
        "-e", "kernel_cmdline_reboot_running_guests=allow", "-e", "kernel_cmdline_ha_maintenance_timeout=1"
    )
    assert outcome["failed"] == (
        f"{NODE}: in HA maintenance mode, VM {TENANT} (snp-tenant) still running on the node after 1s (HA cannot move "
        "a guest bound to the node by a device, a local disk or a rule, or with no other node to take it): not "
        "rebooting; HA maintenance mode was taken off again; the node was not rebooted"
    )
    assert playbook.calls() == [
        f"crm-command node-maintenance enable {NODE}",
        f"crm-command node-maintenance disable {NODE}",
    ]


def test_check_mode_reads_and_reports_what_the_reboot_would_meet(playbook, served):
    tenant(served, ha="started")
    outcome = playbook.run("--check")
    assert outcome["failed"] is None, outcome
    report = next(line for line in outcome["stdout"].splitlines() if "would refuse the reboot" in line)
    assert "\\n" not in report, "one line"
    assert f"{REFUSED}guests running that the inventory does not own: VM {TENANT} (snp-tenant)" in report, report
    assert f"would put the node in HA maintenance mode for VM {TENANT} (snp-tenant)" in report, report
    assert playbook.calls() == []
    only_read(served)
