"""The provision state directory is one variable, provision_state_dir, whose default is written once
(roles/provision_common/defaults/main.yml): every role that keeps or reads records there, the P2P decision
(`sglang_p2p: auto`) and `provision verify` follow an inventory that moves it."""

from __future__ import annotations

import ast
import json
import re
from pathlib import Path

import pytest
import yaml
from ansible.inventory.manager import InventoryManager
from ansible.parsing.dataloader import DataLoader
from ansible.playbook.play import Play
from ansible.template import Templar, trust_as_template
from ansible.vars.manager import VariableManager

from provision import verify
from provision.checks import support
from provision.record import RunRecord
from tests.loaders import REPO

DEFAULT = "/var/lib/provision"
MOVED = "/srv/provision-records"
USERS = ("kernel_cmdline", "gpu_diag", "sglang", "sglang_bench", "provision_state")
# each user's variables that name a place in the state directory
DERIVED = {
    "kernel_cmdline": ["_kernel_cmdline_backup_dir", "_kernel_cmdline_changed_marker"],
    "gpu_diag": ["_gpu_diag_dir"],
    "sglang": ["sglang_node_watch[3]", "sglang_node_watch[-2]", "sglang_watch[-5]", "sglang_watch[-4]"],
    "sglang_bench": ["sglang_bench_results_dir"],
    "provision_state": [],  # its tasks name provision_state_dir itself
}


def test_the_default_is_written_once():
    assert (
        yaml.safe_load((REPO / "roles/provision_common/defaults/main.yml").read_text())["provision_state_dir"]
        == DEFAULT
    )
    assert support.DEFAULT_STATE_DIR == DEFAULT  # verify reads it from there
    found = []
    the_default = REPO / "roles/provision_common/defaults/main.yml"
    for path in [*REPO.joinpath("roles").rglob("*"), *REPO.joinpath("playbooks").rglob("*")]:
        code = path.suffix in (".yml", ".j2", ".py", ".sh") and path.name != "argument_specs.yml"  # specs document it
        if code and path != the_default and DEFAULT in path.read_text():
            found.append(str(path.relative_to(REPO)))
    for path in [*REPO.joinpath("plugins").rglob("*.py"), *REPO.joinpath("provision").rglob("*.py")]:
        if any(DEFAULT in text for text in _code_strings(path)):
            found.append(str(path.relative_to(REPO)))
    assert found == []


def _code_strings(path: Path) -> list[str]:
    """The string constants of a Python file, less its docstrings and a module's DOCUMENTATION/EXAMPLES/RETURN."""
    tree = ast.parse(path.read_text())
    skip = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and {getattr(t, "id", "") for t in node.targets} & {
            "DOCUMENTATION",
            "EXAMPLES",
            "RETURN",
        }:
            skip.add(id(node.value))
        body = getattr(node, "body", None)
        if isinstance(body, list) and body and isinstance(body[0], ast.Expr):
            skip.add(id(body[0].value))
    return [
        n.value
        for n in ast.walk(tree)
        if isinstance(n, ast.Constant) and isinstance(n.value, str) and id(n) not in skip
    ]


def test_no_role_has_its_own_state_directory_variable():
    defined = set()
    for path in REPO.joinpath("roles").glob("*/*/main.yml"):
        if path.parent.name in ("defaults", "vars"):
            defined |= set(yaml.safe_load(path.read_text()) or {})
    for path in REPO.joinpath("roles").glob("*/meta/argument_specs.yml"):
        for entry in yaml.safe_load(path.read_text())["argument_specs"].values():
            defined |= set(entry.get("options") or {})
    assert {name for name in defined if name.endswith("state_dir")} == {"provision_state_dir"}
    old = re.compile(r"\b(kernel_cmdline|gpu_diag|sglang|sglang_bench)_state_dir\b")
    users = [
        p
        for top in ("roles", "playbooks", "plugins", "provision")
        for p in REPO.joinpath(top).rglob("*")
        if p.is_file() and p.suffix in (".yml", ".j2", ".py", ".md") and old.search(p.read_text())
    ]
    # the one place that still names them: the inventory check that warns when an inventory sets one
    from provision import inventory

    assert users == [REPO / "provision" / "inventory.py"]
    roles = ("kernel_cmdline", "gpu_diag", "sglang", "sglang_bench")
    assert set(inventory.REMOVED_VARIABLES) == {f"{role}_state_dir" for role in roles}


@pytest.fixture(scope="module")
def resolved(tmp_path_factory):
    """Per role, per host, Ansible's own variables for a play of that role: host `moved` sets provision_state_dir
    in the inventory (group_vars/all would do the same), host `plain` does not."""
    root = tmp_path_factory.mktemp("inv")
    hosts = {"moved": {"provision_state_dir": MOVED}, "plain": {}}
    (root / "hosts.yml").write_text(yaml.safe_dump({"all": {"hosts": hosts}}))
    loader = DataLoader()
    manager = InventoryManager(loader=loader, sources=[str(root / "hosts.yml")])
    variables = VariableManager(loader=loader, inventory=manager)
    found = {}
    for role in USERS:
        play = Play.load(
            {"hosts": "all", "gather_facts": False, "roles": [f"provision.pve_sglang.{role}"]},
            variable_manager=variables,
            loader=loader,
        )
        for host in ("moved", "plain"):
            facts = variables.get_vars(play=play, host=manager.get_host(host))
            found[role, host] = Templar(loader=loader, variables=facts)
    return found


@pytest.mark.parametrize("role", USERS)
def test_every_role_keeps_its_records_where_the_inventory_says(resolved, role):
    for host, where in (("moved", MOVED), ("plain", DEFAULT)):
        templar = resolved[role, host]
        assert templar.template(trust_as_template("{{ provision_state_dir }}")) == where
        for name in DERIVED[role]:
            value = templar.template(trust_as_template("{{ " + name + " }}"))
            assert value.startswith(where + "/"), f"{role}: {name} is {value} on {host}"


def test_sglang_p2p_auto_reads_the_verdict_and_the_marker_there(resolved):
    """The P2P decision's two inputs in the state directory (roles/sglang/tasks/p2p.yml)."""
    tasks = yaml.safe_load((REPO / "roles/sglang/tasks/p2p.yml").read_text())
    node = next(t["provision.pve_sglang.gpu_p2p_node"] for t in tasks if "provision.pve_sglang.gpu_p2p_node" in t)
    decide = next(t["provision.pve_sglang.sglang_p2p"] for t in tasks if "provision.pve_sglang.sglang_p2p" in t)
    templar = resolved["sglang", "moved"]
    assert templar.template(trust_as_template(node["state_dir"])) == MOVED
    assert templar.template(trust_as_template(decide["verdict_file"])) == f"{MOVED}/gpu-diag.json"


def test_verify_reads_each_hosts_records_where_its_inventory_says(tmp_path, monkeypatch):
    """Through the real probe playbook on this machine: a node whose provision_state_dir is moved is read there, a
    container without one at the default."""
    monkeypatch.setenv("PROVISION_ANSIBLE_STRATEGY", "linear")
    moved = tmp_path / "records"
    moved.mkdir()
    (moved / "verify.json").write_text('{"moved": true}')
    # the probe runs on this machine: the refusal of a local connection is a row of
    # tests/unit/provision/test_cli_bad_inputs.py
    monkeypatch.setattr(verify.inventory_mod, "_check_connection", lambda host: [])
    local = {"ansible_connection": "local", "ansible_python_interpreter": "/usr/bin/python3"}
    doc = {
        "all": {
            "children": {
                "proxmox_hosts": {"hosts": {"node1": {**local, "provision_state_dir": str(moved)}}},
                "gpu_containers": {"hosts": {"ct1": {**local, "proxmox_host": "node1", "proxmox_vmid": 100}}},
            }
        }
    }
    (tmp_path / "inv").mkdir()
    (tmp_path / "inv" / "hosts.yml").write_text(yaml.safe_dump(doc))
    inv = verify.inventory_mod.load(str(tmp_path / "inv"))
    with RunRecord(tmp_path / "runs", "verify", inv) as rec:
        spec, run = verify.read_hosts(inv, list(inv.hosts.values()), rec)
    assert run.succeeded, run.failures
    node, ct = spec["readings"]["node1"]["probe"], spec["readings"]["ct1"]["probe"]
    assert node["state_dir"] == str(moved) and json.loads(node["files"]["verify.json"]) == {"moved": True}
    assert ct["state_dir"] == DEFAULT
