"""roles/provision_common's `shared` entry point: ansible-playbook checks the shared variables once where a play
includes it, and never again in the plays of the roles that depend on provision_common for its defaults."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tests.playbooks import run_local_plays

CHECK = "Validating arguments against arg spec"
SHARED = {
    "name": "Check the variables every role shares",
    "tags": ["always"],
    "ansible.builtin.include_role": {"name": "provision.pve_sglang.provision_common", "tasks_from": "shared"},
}
# a role that depends on provision_common, included twice in a play and run in a second one, as the phase playbooks
# run provision_state; the run's --tags leaves out every task but the includes and the checks (Ansible tags those
# `always`), so nothing runs on the host
STATE = {
    "ansible.builtin.include_role": {"name": "provision.pve_sglang.provision_state", "tasks_from": "renew.yml"},
    "tags": ["always"],
}


def run(tmp_path: Path, host_vars: dict) -> subprocess.CompletedProcess:
    plays = [{"hosts": "all", "gather_facts": False, "tasks": [SHARED, STATE, STATE]}]
    plays.append({"hosts": "all", "gather_facts": False, "roles": ["provision.pve_sglang.provision_state"]})
    host = {"ansible_python_interpreter": sys.executable, **host_vars}
    return run_local_plays(tmp_path, plays, {"ct1": host}, "--tags", "no-task")


def test_the_shared_variables_are_checked_once_where_a_play_includes_them_and_a_wrong_one_stops_there(tmp_path):
    for case in ("good", "bad"):
        (tmp_path / case).mkdir()
    proc = run(tmp_path / "good", {"proxmox_api_port": 8006})
    checks = [line for line in proc.stdout.splitlines() if line.startswith("TASK") and CHECK in line]
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    # once for the shared variables, and provision_state's own `main` once, in the play that runs it as a role
    assert [c.split("] ")[0] for c in checks] == [
        "TASK [provision.pve_sglang.provision_common : Validating arguments against arg spec 'shared' - The "
        "variables every role of provision.pve_sglang shares, checked once per run.",
        "TASK [provision.pve_sglang.provision_state : Validating arguments against arg spec 'main' - Record on the "
        "host which provision release converged which phase.",
    ], checks
    proc = run(tmp_path / "bad", {"proxmox_api_port": "eighty"})
    assert proc.returncode != 0
    assert "argument 'proxmox_api_port' is of type str" in proc.stdout, proc.stdout[-3000:]
