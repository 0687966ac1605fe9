"""`provision apply`, `plan` and `verify` against real sshd targets, through ansible-runner.

The targets are this machine seen through sshd (only /var/lib/provision is private to each), so
these tests run the `verify` phase only (`--tags verify`): the kernel, gpu and sglang phases
change bootloaders and services and run against the lab (tests/lab/) instead.

The tests run in file order and share two targets: check mode first (nothing may be
written), then the first apply, then the idempotent second apply.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from provision import verify as verify_mod
from provision.inventory import VaultOptions
from tests.conftest import lab_inventory, run_provision
from tests.sshtarget import start_target

pytestmark = pytest.mark.integration

SECRET = "s3cr3t-Pr0xm0x-" + "7f1c9a"
SSH_PASSWORD = "ssh-Pa55w0rd-" + "c41e07"


@pytest.fixture(scope="module")
def inv(ssh_lab, tmp_path_factory):
    return lab_inventory(
        ssh_lab,
        tmp_path_factory.mktemp("inv") / "sshlab",
        group_vars={
            "all": {
                "proxmox_api_host": "127.0.0.1",
                "proxmox_api_user": "root@pam",
                "proxmox_api_password": "{{ lookup('ansible.builtin.env', 'PROXMOX_PASSWORD') }}",
            }
        },
    )


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    return tmp_path_factory.mktemp("runs")


def _state(target, path="/var/lib/provision") -> str:
    return target.ssh(f"ls -1 {path} 2>/dev/null || true").stdout.split()


def _summary(output: str) -> dict:
    """The command's own payload in the --json envelope."""
    return json.loads(output)["result"]


def test_check_mode_changes_nothing(ssh_lab, inv, runs):
    proc = run_provision(
        "apply", "--inventory", str(inv), "--check", "--json", "--tags", "verify", "--runs-dir", str(runs)
    )
    assert proc.returncode == 0, proc.stderr
    result = _summary(proc.stdout)
    assert result["check"] is True
    assert result["hosts"]["node1"]["changed"] > 0, "check mode must report the pending changes"
    for target in ssh_lab["targets"].values():
        assert _state(target) == [], f"--check wrote files on {target.name}"


def test_plan_lists_pending_tasks_per_host(ssh_lab, inv, runs):
    proc = run_provision("plan", "--inventory", str(inv), "--tags", "verify", "--runs-dir", str(runs))
    assert proc.returncode == 4, proc.stderr  # changes pending
    assert "node1: changes pending" in proc.stdout
    assert "~ Record the converged phase in the state directory" in proc.stdout
    assert _state(ssh_lab["targets"]["node1"]) == []


def test_first_apply_converges_and_counts_match(ssh_lab, inv, runs):
    proc = run_provision(
        "apply", "--inventory", str(inv), "--yes", "--json", "--tags", "verify", "--runs-dir", str(runs),
        env={"PROXMOX_PASSWORD": SECRET},
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr + proc.stdout
    result = _summary(proc.stdout)
    assert result["succeeded"] is True
    node, ct = result["hosts"]["node1"], result["hosts"]["ct1"]
    # The state dir already exists (the target's private tmpfs is mounted there), so each host
    # gets verify.json written
    assert (node["changed"], node["failed"], node["unreachable"]) == (1, 0, 0)
    assert (ct["changed"], ct["failed"], ct["unreachable"]) == (1, 0, 0)
    assert len(result["changed_tasks"]) == node["changed"] + ct["changed"]
    # what the summary says matches what is on the hosts, and the verify phase's fingerprint (not a change)
    for target in ("node1", "ct1"):
        assert _state(ssh_lab["targets"][target]) == ["fingerprint", "verify.json"]
        mode = ssh_lab["targets"][target].ssh("stat -c %a /var/lib/provision/fingerprint/verify.json").stdout
        assert mode.strip() == "600"
    record = Path(result["record_dir"])
    summary = json.loads((record / "summary.json").read_text())
    assert summary["hosts"]["node1"]["changed"] == 1
    events = list((record / "artifacts" / "run" / "job_events").glob("*.json"))
    oks = [json.loads(e.read_text()) for e in events]
    assert sum(1 for e in oks if e["event"] == "runner_on_ok" and e["event_data"]["host"] == "node1") == node["ok"]


def test_second_apply_changes_nothing(ssh_lab, inv, runs):
    proc = run_provision(
        "apply", "--inventory", str(inv), "--yes", "--json", "--tags", "verify", "--runs-dir", str(runs)
    )
    assert proc.returncode == 0, proc.stderr
    result = _summary(proc.stdout)
    assert {h: s["changed"] for h, s in result["hosts"].items()} == {"node1": 0, "ct1": 0}


def test_tags_select_phases(ssh_lab, inv, runs):
    node = ssh_lab["targets"]["node1"]
    node.ssh("rm /var/lib/provision/verify.json")
    proc = run_provision(
        "apply", "--inventory", str(inv), "--yes", "--json", "--tags", "verify", "--runs-dir", str(runs)
    )
    assert proc.returncode == 0, proc.stderr
    result = _summary(proc.stdout)
    assert [(t["host"], t["task"]) for t in result["changed_tasks"]] == [
        ("node1", "Record the converged phase in the state directory")
    ]
    events = (Path(result["record_dir"]) / "artifacts" / "run" / "stdout").read_text()
    for other_phase_task in ("Merge the wanted arguments", "Discover the NVIDIA device nodes", "Create the SGLang"):
        assert other_phase_task not in events, f"--tags verify ran another phase: {other_phase_task}"
    assert "verify.json" in _state(node)


CHECKS = "reachable or provision_applied"


def test_verify_passes_on_converged_hosts(ssh_lab, inv, runs, tmp_path):
    junit = tmp_path / "verify.xml"
    proc = run_provision(
        "verify", "--inventory", str(inv), "--json", "--junit", str(junit), "--checks", CHECKS, "--runs-dir", str(runs)
    )
    report = _summary(proc.stdout)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert {c["host"] for c in report["checks"]} == {"node1", "ct1"}
    assert all(c["passed"] for c in report["checks"])
    assert junit.read_text().count("<testcase") == len(report["checks"])


def test_verify_fails_with_reason_when_state_is_broken(ssh_lab, inv, runs):
    node = ssh_lab["targets"]["node1"]
    node.ssh("mv /var/lib/provision/verify.json /var/lib/provision/verify.json.bak")
    try:
        proc = run_provision("verify", "--inventory", str(inv), "--json", "--checks", CHECKS, "--runs-dir", str(runs))
    finally:
        node.ssh("mv /var/lib/provision/verify.json.bak /var/lib/provision/verify.json")
    report = _summary(proc.stdout)
    assert proc.returncode == 1
    failed = [c for c in report["checks"] if not c["passed"]]
    assert [(c["host"], c["name"]) for c in failed] == [("node1", "test_provision_applied")]
    assert "verify.json is missing" in failed[0]["reason"]


def test_unreachable_host_fails_run_but_others_finish(ssh_lab, tmp_path, runs):
    dead = {
        "node2": {
            **ssh_lab["targets"]["node1"].inventory_vars(),
            "ansible_port": ssh_lab["dead_port"],
        }
    }
    inv2 = lab_inventory(ssh_lab, tmp_path / "withdead", extra_hosts={"proxmox_hosts": dead})
    proc = run_provision(
        "apply", "--inventory", str(inv2), "--yes", "--json", "--tags", "verify", "--runs-dir", str(runs)
    )
    assert proc.returncode == 1
    result = _summary(proc.stdout)
    assert result["hosts"]["node2"]["unreachable"] >= 1
    assert result["hosts"]["node1"]["failed"] == 0 and result["hosts"]["node1"]["ok"] > 0
    assert result["hosts"]["ct1"]["failed"] == 0 and result["hosts"]["ct1"]["ok"] > 0
    assert any(f["host"] == "node2" and "unreachable" in f["message"] for f in result["failures"])
    vproc = run_provision("verify", "--inventory", str(inv2), "--json", "--checks", CHECKS, "--runs-dir", str(runs))
    report = _summary(vproc.stdout)
    assert vproc.returncode == 1
    assert any(c["host"] == "node2" and not c["passed"] for c in report["checks"]), "unreachable host not reported"


def test_unknown_host_key_is_refused(ssh_lab, tmp_path, runs):
    target = ssh_lab["targets"]["node1"]
    empty_known_hosts = tmp_path / "empty_known_hosts"
    empty_known_hosts.write_text("")
    vars_ = {
        **target.inventory_vars(),
        "ansible_ssh_common_args": f"-o UserKnownHostsFile={empty_known_hosts} -o IdentitiesOnly=yes",
    }
    inv3 = lab_inventory(ssh_lab, tmp_path / "nokeys", extra_hosts={"proxmox_hosts": {"node1": vars_}})
    proc = run_provision(
        "apply", "--inventory", str(inv3), "--yes", "--json", "--tags", "verify", "--runs-dir", str(runs)
    )
    assert proc.returncode == 1
    result = _summary(proc.stdout)
    assert result["hosts"]["node1"]["unreachable"] >= 1
    vproc = run_provision("verify", "--inventory", str(inv3), "--json", "--checks", CHECKS, "--runs-dir", str(runs))
    assert vproc.returncode == 1
    failed = {c["reason"] for c in _summary(vproc.stdout)["checks"] if c["host"] == "node1" and not c["passed"]}
    assert failed and all("unreachable" in r and "host key" in r.lower() for r in failed), failed
    # the one opt-out connects, and writes the unverified key nowhere later runs would trust
    home_known_hosts = Path.home() / ".ssh" / "known_hosts"
    before = home_known_hosts.read_bytes() if home_known_hosts.exists() else None
    proc = run_provision("apply", "--inventory", str(inv3), "--yes", "--json", "--tags", "verify", "--runs-dir",
                         str(runs), "--limit", "node1", "--no-host-key-checking")  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert empty_known_hosts.read_text() == ""
    assert (home_known_hosts.read_bytes() if home_known_hosts.exists() else None) == before


def test_verify_connects_to_a_templated_ansible_host(ssh_lab, tmp_path, runs):
    """ansible_host is rendered by Ansible, as in apply (testinfra's own ssh took the template literally)."""
    t = ssh_lab["targets"]
    templated = {"ansible_host": "{{ '127.0.0.' ~ (0 + 1) }}"}
    inv = lab_inventory(
        ssh_lab,
        tmp_path / "templated",
        extra_hosts={
            "proxmox_hosts": {"node1": {**t["node1"].inventory_vars(), **templated}},
            "gpu_containers": {
                "ct1": {**t["ct1"].inventory_vars(), **templated, "proxmox_host": "node1", "proxmox_vmid": 100}
            },
        },
    )
    proc = run_provision("verify", "--inventory", str(inv), "--json", "--checks", CHECKS, "--runs-dir", str(runs))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    report = _summary(proc.stdout)
    assert {c["host"] for c in report["checks"]} == {"node1", "ct1"}
    assert all(c["passed"] for c in report["checks"]), report["checks"]


@pytest.fixture(scope="module")
def password_target(ssh_lab):
    """A third sshd that also takes root's password (only in its own namespace)."""
    node = ssh_lab["targets"]["node1"]
    target = start_target("pw1", ssh_lab["root"], node.client_key, node.known_hosts, password=SSH_PASSWORD)
    yield target
    target.stop()


def _vault_encrypt(value: str, name: str, password_file: Path) -> str:
    vault = Path(sys.executable).parent / "ansible-vault"
    out = subprocess.run(
        [str(vault), "encrypt_string", "--vault-password-file", str(password_file), "--stdin-name", name],
        input=value, capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    return out


def _argv_watch(secret: str):
    """A thread that reads every process's argv until stopped, and the argvs that carried the secret."""
    seen, stop = [], threading.Event()

    def watch():
        while not stop.is_set():
            for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
                try:
                    argv = cmdline.read_bytes()
                except OSError:
                    continue
                if secret.encode() in argv:
                    seen.append(argv.replace(b"\0", b" ").decode(errors="replace"))
            stop.wait(0.05)

    thread = threading.Thread(target=watch, daemon=True)
    thread.start()
    return seen, stop, thread


def test_apply_and_verify_log_in_with_a_vaulted_ansible_password(ssh_lab, password_target, tmp_path, runs):
    """Password login (no key offered), the password vaulted: apply and verify take it through Ansible's own
    connection, and no process ever has it on its command line (testinfra's sshpass -p did)."""
    vault_pass = tmp_path / "vault-pass"
    vault_pass.write_text("vault-" + "test-pass\n")
    key_vars = password_target.inventory_vars()
    pw_vars = {
        **{k: v for k, v in key_vars.items() if k != "ansible_ssh_private_key_file"},
        "ansible_ssh_common_args": key_vars["ansible_ssh_common_args"]
        + " -o PubkeyAuthentication=no -o PreferredAuthentications=password",
    }
    inv = lab_inventory(ssh_lab, tmp_path / "password", extra_hosts={"proxmox_hosts": {"pw1": pw_vars}})
    (inv / "host_vars").mkdir()
    (inv / "host_vars" / "pw1.yml").write_text(_vault_encrypt(SSH_PASSWORD, "ansible_password", vault_pass))
    seen, stop, watcher = _argv_watch(SSH_PASSWORD)
    try:
        proc = run_provision(
            "apply", "--inventory", str(inv), "--yes", "--json", "--tags", "verify", "--runs-dir", str(runs),
            "--vault-password-file", str(vault_pass),
        )  # fmt: skip
        assert proc.returncode == 0, proc.stdout + proc.stderr
        assert _summary(proc.stdout)["hosts"]["pw1"]["ok"] > 0
        report = verify_mod.verify(str(inv), select=CHECKS, runs_dir=runs, vault=VaultOptions((vault_pass,)))
    finally:
        stop.set()
        watcher.join()
    failed = [(c.host, c.name, c.reason) for c in report.checks if not c.passed]
    assert report.passed, failed
    assert {c.host for c in report.checks} == {"node1", "ct1", "pw1"}
    assert not seen, f"the ssh password was on a command line: {seen[0][:200]}"
    hits = subprocess.run(["grep", "-rl", SSH_PASSWORD, str(runs)], capture_output=True, text=True)
    assert hits.stdout == "", f"the ssh password is in: {hits.stdout}"


def test_no_secret_in_run_records(runs):
    assert any(runs.iterdir()), "no run records were written"
    hits = subprocess.run(["grep", "-rl", SECRET, str(runs)], capture_output=True, text=True)
    assert hits.stdout == "", f"secret found in: {hits.stdout}"
    commands = list(runs.rglob("artifacts/run/command"))
    assert commands, "runner artifacts were not kept"
    for command in commands:
        assert "env" not in json.loads(command.read_text())


def test_diag_reports_no_gpu_cleanly(ssh_lab, inv, runs):
    proc = run_provision("diag", "--inventory", str(inv), "--json", "--runs-dir", str(runs))
    assert proc.returncode == 1, "no-gpu is not healthy"
    assert "Traceback" not in proc.stderr
    report = _summary(proc.stdout)
    result = report["results"]["ct1"]
    assert result["verdict"] == "no-gpu"
    assert "PyTorch not installed" in result["reason"] or "is_available() is False" in result["reason"]
    assert set(report["results"]) == {"ct1"}, "nodes only with --hosts"
    stored = ssh_lab["targets"]["ct1"].ssh("cat /var/lib/provision/gpu-diag-last.json").stdout
    assert json.loads(stored)["verdict"] == "no-gpu"
    # a verdict that says nothing about P2P never becomes the one sglang_p2p: auto reads
    gone = ssh_lab["targets"]["ct1"].ssh("test -e /var/lib/provision/gpu-diag.json", check=False)
    assert gone.returncode == 1
    assert (Path(report["record_dir"]) / "diag-ct1.json").is_file()


def test_ini_inventory_with_host_ranges_and_a_vaulted_group_vars_file(ssh_lab, tmp_path, runs):
    """The shape an existing Ansible repository has: INI with host ranges, Ansible's vars/vault split
    (group_vars/all/vars.yml names what group_vars/all/vault.yml, encrypted whole, holds). The ssh key
    path is in the vault: the hosts are reachable only if the vault was read."""
    t = ssh_lab["targets"]
    root = tmp_path / "ini"
    (root / "group_vars" / "all").mkdir(parents=True)
    (root / "host_vars").mkdir()
    (root / "hosts").write_text(
        "[proxmox_hosts]\nnode[1:1]\n\n[gpu_containers]\nct[1:1] proxmox_host=node1 proxmox_vmid=100\n\n"
        "[all:vars]\nansible_host=127.0.0.1\nansible_user=root\nansible_python_interpreter=/usr/bin/python3\n"
    )
    for name in ("node1", "ct1"):
        (root / "host_vars" / f"{name}.yml").write_text(f"ansible_port: {t[name].port}\n")
    common = t["node1"].inventory_vars()["ansible_ssh_common_args"]
    (root / "group_vars" / "all" / "vars.yml").write_text(
        f'ansible_ssh_private_key_file: "{{{{ vault_ssh_key }}}}"\nansible_ssh_common_args: "{common}"\n'
    )
    vault = root / "group_vars" / "all" / "vault.yml"
    vault.write_text(f"vault_ssh_key: {t['node1'].client_key}\n")
    password = tmp_path / "vault-pass"
    password.write_text("pw-ini-123\n")
    ansible_vault = Path(sys.executable).parent / "ansible-vault"
    subprocess.run(
        [ansible_vault, "encrypt", "--vault-password-file", password, vault], check=True, capture_output=True
    )
    vault_args = ("--vault-password-file", str(password))
    check = run_provision("inventory", "check", "--inventory", str(root), *vault_args)
    assert check.returncode == 0 and "ok (1 proxmox_hosts, 1 gpu_containers)" in check.stdout, check.stderr
    no_vault = run_provision("inventory", "check", "--inventory", str(root))
    assert no_vault.returncode == 2 and "vault.yml: cannot decrypt" in no_vault.stderr
    proc = run_provision("apply", "--inventory", str(root), "--yes", "--json", "--tags", "verify", "--runs-dir",
                         str(runs), *vault_args)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    states = json.loads(proc.stdout)["hosts"]
    assert states.keys() == {"node1", "ct1"} and set(states.values()) <= {"changed", "ok"}, states
    vproc = run_provision("verify", "--inventory", str(root), "--json", "--checks", CHECKS, "--runs-dir", str(runs),
                          *vault_args)  # fmt: skip
    assert vproc.returncode == 0, vproc.stdout[-2000:]
