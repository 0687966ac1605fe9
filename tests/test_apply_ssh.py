"""`provision apply`, `plan` and `verify` against real sshd targets, through ansible-runner.

The targets are this machine seen through sshd (only /var/lib/provision is private to each), so
these tests run the `verify` phase only (`--tags verify`): the kernel, gpu and sglang phases
change bootloaders and services and run against the lab (tests/lab/) instead.

The tests run in file order and share two targets: check mode first (nothing may be
written), then the first apply, then the idempotent second apply.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import shlex
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from urllib.parse import quote

import pytest
import yaml

from provision import verify as verify_mod
from provision.inventory import VaultOptions
from tests.conftest import API_VARS, lab_inventory, run_provision, vault_encrypt, write_inventory
from tests.leaks import leaks
from tests.processes import interrupt, live, start_apply, the_runs_processes, tree
from tests.proxy import bastion_dir
from tests.sshtarget import make_client_key, start_target

# its tests build on each other (first apply, then the second): CI's `--dist loadfile` runs them on one worker, in order
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


@pytest.fixture(scope="module", autouse=True)
def controller_locks(tmp_path_factory):
    """apply's inventory locks in a directory of these tests' own, not ~/.cache (provision/locks.py)."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("XDG_CACHE_HOME", str(tmp_path_factory.mktemp("cache")))
        yield


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
        "apply",
        "--inventory",
        str(inv),
        "--yes",
        "--json",
        "--tags",
        "verify",
        "--runs-dir",
        str(runs),
        env={"PROXMOX_PASSWORD": SECRET},
    )
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


@pytest.mark.parametrize(
    "callbacks",
    [{"ANSIBLE_STDOUT_CALLBACK": "json"}, {"ANSIBLE_CALLBACKS_ENABLED": "ansible.posix.profile_tasks,timer"}],
    ids=["stdout-json", "enabled-callbacks"],
)
def test_a_users_callbacks_change_nothing_provision_reads(ssh_lab, inv, runs, callbacks):
    """More callbacks enabled (ARA, profile_tasks) stay the user's; a stdout callback of their own is replaced by
    Ansible's default in provision's runs, with one warning. Either way provision reads the run as it is (its job
    events): every host counted, nothing changed."""
    proc = run_provision(
        "apply", "--inventory", str(inv), "--yes", "--json", "--tags", "verify", "--runs-dir", str(runs), env=callbacks
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    result = _summary(proc.stdout)
    assert {h: (s["changed"], s["failed"]) for h, s in result["hosts"].items()} == {"node1": (0, 0), "ct1": (0, 0)}
    assert all(s["ok"] > 0 for s in result["hosts"].values()), result["hosts"]
    replaced = [line for line in proc.stderr.splitlines() if "stdout_callback" in line]
    assert replaced == (
        [
            "warning: env: ANSIBLE_STDOUT_CALLBACK: stdout_callback = json: provision's runs use "
            "Ansible's default stdout callback (provision shows and records each run from its events)"
        ]
        if "ANSIBLE_STDOUT_CALLBACK" in callbacks
        else []
    ), proc.stderr[-2000:]


def test_a_login_shell_that_prints_a_greeting_breaks_no_read(ssh_lab, tmp_path):
    """Two hosts whose root's ~/.bashrc prints a line, which every command sshd runs then prints first (Debian's bash
    reads it; sshtarget.py, `banner`). The raw reads (the fingerprints and the host lock, the lock's release) take
    their JSON from the last line, as Ansible's module runner skips what a module printed before its JSON: the first
    apply converges, the second changes nothing and skips on its fingerprints, and verify passes."""
    greeting = "Welcome to node9 (managed by the site's bastion)"
    root = tmp_path / "noisy"
    root.mkdir()
    key, known_hosts = make_client_key(root), root / "known_hosts"
    targets = {name: start_target(name, root, key, known_hosts, banner=greeting) for name in ("node9", "ct9")}
    try:
        assert targets["node9"].ssh("true").stdout == greeting + "\n", "the target's shell does not print"
        ct = {**targets["ct9"].inventory_vars(), "proxmox_host": "node9", "proxmox_vmid": 100}
        hosts = {"proxmox_hosts": {"node9": targets["node9"].inventory_vars()}, "gpu_containers": {"ct9": ct}}
        inv = write_inventory(tmp_path / "inv" / "noisy", hosts)
        runs = tmp_path / "runs"
        apply = ("apply", "--inventory", str(inv), "--yes", "--json", "--tags", "verify", "--runs-dir", str(runs))
        for _ in range(2):
            proc = run_provision(*apply)
            assert proc.returncode == 0, proc.stderr[-3000:] + proc.stdout[-2000:]
        result = _summary(proc.stdout)
        assert {h: s["changed"] for h, s in result["hosts"].items()} == {"node9": 0, "ct9": 0}
        # provision/locks.py read each release's answer: none left for it to give back afterwards
        summary = json.loads((Path(result["record_dir"]) / "summary.json").read_text())
        assert summary["host_locks_left"] == [], summary["host_locks_left"]
        for host in ("node9", "ct9"):
            assert any(m.startswith("up to date, skipped: verify") for m in result["reports"][host]), result["reports"]
            assert "run_id" not in _lock_on(targets[host]), f"the run did not give {host}'s lock back"
        proc = run_provision("verify", "--inventory", str(inv), "--json", "--checks", CHECKS, "--runs-dir", str(runs))
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    finally:
        for target in targets.values():
            target.stop()


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


def test_testinfra_commands_share_one_connection_through_the_users_ansible_cfg(ssh_lab, inv, runs, tmp_path):
    """A user's testinfra check (--check-dir) asks each host nine things. Its commands go through the ProxyCommand
    that only the user's ansible.cfg names, over one ssh connection per host for all of them (ControlPersist), and
    answer from the host itself, with stdout and stderr apart."""
    work, log = bastion_dir(tmp_path)
    (work / "mine").mkdir()
    (work / "mine" / "test_site.py").write_text(
        "import os\n"
        "def test_commands_answer_from_the_host(host, target):\n"
        "    for _ in range(6):\n"
        "        assert host.run('true').rc == 0\n"
        "    assert host.file('/var/lib/provision').is_directory\n"
        "    both = host.run('printf out; printf err >&2')  # no terminal: the streams apart, no carriage return\n"
        "    assert (both.stdout, both.stderr) == ('out', 'err'), both\n"
        "    seen = host.run('echo $SSH_CONNECTION').stdout.split()[3]  # the port of the sshd that ran it\n"
        "    (open(os.path.join(os.environ['SEEN'], target.name), 'w')).write(seen)\n"
    )
    proc = run_provision(
        "verify",
        "--inventory",
        str(inv),
        "--json",
        "--checks",
        "commands_answer",
        "--check-dir",
        "mine",
        "--runs-dir",
        str(runs),
        cwd=work,
        env={"SEEN": str(work)},
    )
    report = _summary(proc.stdout)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert {(c["host"], c["passed"]) for c in report["checks"]} == {("node1", True), ("ct1", True)}
    opened = log.read_text().splitlines()
    by_checks = sorted(line.split()[0] for line in opened if line.endswith(" checks"))
    ports = sorted(f"127.0.0.1:{t.port}" for t in ssh_lab["targets"].values() if t.name in ("node1", "ct1"))
    assert by_checks == ports, opened
    for name in ("node1", "ct1"):
        assert (work / name).read_text() == str(ssh_lab["targets"][name].port)


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
    proc = run_provision(
        "apply",
        "--inventory",
        str(inv3),
        "--yes",
        "--json",
        "--tags",
        "verify",
        "--runs-dir",
        str(runs),
        "--limit",
        "node1",
        "--no-host-key-checking",
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert empty_known_hosts.read_text() == ""
    assert (home_known_hosts.read_bytes() if home_known_hosts.exists() else None) == before


@pytest.mark.parametrize(
    ("connection", "strategy"), [("paramiko", "linear"), ("ssh", "linear")], ids=["paramiko", "openssh-linear"]
)
def test_an_unknown_host_key_fails_fast_on_every_connection(ssh_lab, tmp_path, runs, connection, strategy):
    """Without Mitogen (its ssh enforces the key: the test above), Ansible's own connections would ask
    "Are you sure you want to continue connecting (yes/no)?" on the run's pty, where nobody answers: the run
    hung. It fails at once, and paramiko records no key."""
    target = ssh_lab["targets"]["node1"]
    empty = tmp_path / "empty_known_hosts"
    empty.write_text("")
    unknown = {
        **target.inventory_vars(),
        "ansible_connection": connection,
        "ansible_ssh_common_args": f"-o UserKnownHostsFile={empty} -o GlobalKnownHostsFile={empty} "
        "-o IdentitiesOnly=yes",
    }
    inv = lab_inventory(ssh_lab, tmp_path / "unknown", extra_hosts={"proxmox_hosts": {"node1": unknown}})
    home_known_hosts = Path.home() / ".ssh" / "known_hosts"
    before = home_known_hosts.read_bytes() if home_known_hosts.exists() else None
    started = time.monotonic()
    argv = ("apply", "--inventory", str(inv), "--yes", "--json", "--tags", "verify", "--limit", "node1")
    proc = run_provision(*argv, "--runs-dir", str(runs), env={"PROVISION_ANSIBLE_STRATEGY": strategy}, timeout=240)
    assert proc.returncode == 1, proc.stderr[-2000:]
    assert time.monotonic() - started < 120, "an unknown key must fail fast, not wait for an answer"
    result = _summary(proc.stdout)
    assert result["hosts"]["node1"]["unreachable"] >= 1, result["failures"]
    message = " ".join(f["message"] for f in result["failures"] if f["host"] == "node1").lower()
    assert "authenticity" in message or "host key" in message, message
    assert (home_known_hosts.read_bytes() if home_known_hosts.exists() else None) == before


@pytest.mark.parametrize("strategy", ["mitogen_linear", "linear"])
def test_a_user_ssh_config_that_accepts_new_keys_does_not_make_provision_trust_them(ssh_lab, tmp_path, runs, strategy):
    """`StrictHostKeyChecking accept-new` in the user's ssh config (a -F file here; ~/.ssh/config and
    /etc/ssh/ssh_config.d/ are read the same way) would trust and record an unknown key, because Ansible tells ssh
    nothing while host key checking is on: provision says yes on ssh's command line, which beats every config file.
    apply and verify refuse the host, and the known_hosts file stays empty."""
    target = ssh_lab["targets"]["node1"]
    known = tmp_path / "known_hosts"
    known.write_text("")
    config = tmp_path / "ssh_config"
    config.write_text(
        f"Host *\n  StrictHostKeyChecking accept-new\n  UserKnownHostsFile {known}\n  GlobalKnownHostsFile {known}\n"
    )
    vars_ = {**target.inventory_vars(), "ansible_ssh_common_args": f"-F {config} -o IdentitiesOnly=yes"}
    inv = lab_inventory(ssh_lab, tmp_path / "acceptnew", extra_hosts={"proxmox_hosts": {"node1": vars_}})
    env = {"PROVISION_ANSIBLE_STRATEGY": strategy}
    argv = ("apply", "--inventory", str(inv), "--yes", "--json", "--tags", "verify", "--limit", "node1")
    proc = run_provision(*argv, "--runs-dir", str(runs), env=env, timeout=240)
    assert proc.returncode == 1, proc.stderr[-2000:]
    assert _summary(proc.stdout)["hosts"]["node1"]["unreachable"] >= 1
    assert known.read_text() == "", "apply trusted and recorded a new host key"
    argv = ("verify", "--inventory", str(inv), "--json", "--checks", CHECKS, "--limit", "node1")
    vproc = run_provision(*argv, "--runs-dir", str(runs), env=env, timeout=240)
    assert vproc.returncode == 1
    failed = {c["reason"] for c in _summary(vproc.stdout)["checks"] if c["host"] == "node1" and not c["passed"]}
    assert failed and all("unreachable" in r for r in failed), failed
    assert known.read_text() == "", "verify trusted and recorded a new host key"


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
        input=value,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
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
            "apply",
            "--inventory",
            str(inv),
            "--yes",
            "--json",
            "--tags",
            "verify",
            "--runs-dir",
            str(runs),
            "--vault-password-file",
            str(vault_pass),
        )
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


# Two keys with every character that makes an encoding differ from the text: one from a vault, one from an
# environment variable whose name does not look secret
VAULT_KEY = "sk-V4ult/k+y 'q\"x\\=" + "a1b2"
ENV_KEY = "pw-Env+k/y 'q\"x\\=" + "c3d4"
ODD_ENV = "WIDGET_COLOUR"


def _leak_inventory(ssh_lab, root: Path, vault_pass: Path) -> Path:
    """sglang_api_key from a vault, proxmox_api_password from $WIDGET_COLOUR, TLS unverified; the smoke question
    carries both keys in several spellings, so that they travel through a real flow: rendered by Ansible, sent to
    each host base64-encoded inside the probe request on argv, and back in the job events."""
    forms = "{{ k }} {{ k | b64encode }} {{ k | urlencode }} {{ k | quote }} {{ k | to_json }}"
    question = " ".join(forms.replace("k", name) for name in ("sglang_api_key", "proxmox_api_password"))
    inv = lab_inventory(
        ssh_lab,
        root,
        group_vars={
            "all": {
                "proxmox_api_host": "127.0.0.1",
                "proxmox_api_user": "root@pam",
                "proxmox_api_validate_certs": False,
                "proxmox_api_password": f"{{{{ lookup('ansible.builtin.env', '{ODD_ENV}') }}}}",
                "verify_smoke_question": question,
            }
        },
    )
    with (inv / "group_vars" / "all.yml").open("a") as group_vars:
        group_vars.write(_vault_encrypt(VAULT_KEY, "sglang_api_key", vault_pass))
    return inv


def _plant_lock(target, controller: str) -> None:
    """A host lock of another run whose controller field holds the keys: apply fails that host with a message
    built from a file on the host."""
    other = {
        "run_id": "20250101T000000-apply",
        "controller": controller,
        "pid": 4242,
        "since": "2025-01-01T00:00:00",
        "pid_ns": "elsewhere",
        "taken_at": time.time(),
        "lease_s": 3600,
    }
    target.ssh(f"umask 077 && echo {shlex.quote(json.dumps(other))} > /var/lib/provision/lock.json")


def test_no_key_in_any_record_console_or_json_whatever_its_spelling(ssh_lab, tmp_path):
    """The acceptance test of secrets: the keys reach the hosts and come back in job events, check reasons
    and a failure message; no file of any run record, no console line and no --json holds either key in any
    spelling (tests/leaks.py). Commands: apply, plan, verify (its container checks fail: no SGLang here) and an
    apply that fails on a host lock whose holder text quotes the keys, with and without --json."""
    vault_pass = tmp_path / "vault-pass"
    vault_pass.write_text("vault-" + "leak-test\n")
    inv = _leak_inventory(ssh_lab, tmp_path / "inv", vault_pass)
    runs = tmp_path / "runs"
    common = ("--inventory", str(inv), "--runs-dir", str(runs), "--vault-password-file", str(vault_pass))
    env = {ODD_ENV: ENV_KEY}
    outputs, codes = [], {}

    def run(name, *argv):
        proc = run_provision(*argv, *common, env=env)
        outputs.append((name, proc.stdout + proc.stderr))
        codes[name] = proc.returncode
        return proc

    apply = run("apply", "apply", "--yes", "--json", "--tags", "verify")
    run("plan", "plan", "--tags", "verify")
    run("verify --json", "verify", "--json")
    run("verify", "verify")
    ct = ssh_lab["targets"]["ct1"]
    b64 = base64.b64encode(ENV_KEY.encode()).decode()
    _plant_lock(ct, f"{VAULT_KEY} {b64} {quote(ENV_KEY)} {ENV_KEY}")
    try:
        failed = run("failing apply --json", "apply", "--yes", "--json", "--tags", "verify")
        run("failing apply", "apply", "--yes", "--tags", "verify")
    finally:
        ct.ssh("rm -f /var/lib/provision/lock.json")
    assert codes == {
        "apply": 0,
        "plan": 0,
        "verify --json": 1,
        "verify": 1,
        "failing apply --json": 1,
        "failing apply": 1,
    }, outputs
    # the flows the keys took, so that this test cannot pass for want of a leak to stop
    held = json.loads(failed.stdout)["errors"]
    assert held == [
        "ct1: host lock held by run 20250101T000000-apply (pid 4242 on ******** ******** ******** "
        "********, since 2025-01-01T00:00:00): wait for that run to end, or pass --break-lock if it "
        "is gone"
    ], held
    verify_record = next(p for p in runs.iterdir() if p.name.endswith("-verify"))
    events = "".join(p.read_text() for p in (verify_record / "artifacts" / "run" / "job_events").glob("*.json"))
    assert events.count("********") >= 10, "the keys never reached the probe: this test proves nothing"
    # TLS unverified: said on the console before anything ran, and in the summary
    warning = "proxmox_api_validate_certs is false: the PVE API's TLS certificate is NOT verified"
    assert warning in apply.stderr
    assert any(
        warning in w
        for w in json.loads((Path(_summary(apply.stdout)["record_dir"]) / "summary.json").read_text())["warnings"]
    )
    texts = [(str(path), path.read_text(errors="replace")) for path in runs.rglob("*") if path.is_file()]
    assert len(texts) > 50, "the records are not where this test looks"
    found = [
        (where, key[:5], spellings)
        for where, text in texts + outputs
        for key in (VAULT_KEY, ENV_KEY)
        if (spellings := leaks(text, key))
    ]
    assert found == [], found[:5]


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
        "[proxmox_hosts]\nnode[1:1]\n\n[gpu_containers]\nct[1:1] proxmox_host=node1 proxmox_vmid=100 "
        "sglang_model_path=/srv/models/test-model\n\n"
        "[all:vars]\nansible_host=127.0.0.1\nansible_user=root\nansible_python_interpreter=/usr/bin/python3\n"
    )
    for name in ("node1", "ct1"):
        (root / "host_vars" / f"{name}.yml").write_text(f"ansible_port: {t[name].port}\n")
    common = t["node1"].inventory_vars()["ansible_ssh_common_args"]
    (root / "group_vars" / "all" / "vars.yml").write_text(
        f'ansible_ssh_private_key_file: "{{{{ vault_ssh_key }}}}"\nansible_ssh_common_args: "{common}"\n'
        + yaml.safe_dump(API_VARS)
    )
    vault = root / "group_vars" / "all" / "vault.yml"
    vault.write_text(f"vault_ssh_key: {t['node1'].client_key}\n")
    password = tmp_path / "vault-pass"
    password.write_text("pw-ini-123\n")
    vault_encrypt(vault, password)
    vault_args = ("--vault-password-file", str(password))
    check = run_provision("inventory", "check", "--inventory", str(root), *vault_args)
    assert check.returncode == 0 and "ok (1 proxmox_hosts, 1 gpu_containers)" in check.stdout, check.stderr
    no_vault = run_provision("inventory", "check", "--inventory", str(root))
    assert no_vault.returncode == 2 and "vault.yml: cannot decrypt" in no_vault.stderr
    proc = run_provision(
        "apply", "--inventory", str(root), "--yes", "--json", "--tags", "verify", "--runs-dir", str(runs), *vault_args
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    states = json.loads(proc.stdout)["hosts"]
    assert states.keys() == {"node1", "ct1"} and set(states.values()) <= {"changed", "ok"}, states
    vproc = run_provision(
        "verify", "--inventory", str(root), "--json", "--checks", CHECKS, "--runs-dir", str(runs), *vault_args
    )
    assert vproc.returncode == 0, vproc.stdout[-2000:]


# Locks and interrupts. The slow inventory's python waits at a gate before the verify phase's first task
# (a Mitogen connection's interpreter); the facts script's read, lock, renewal and release pass straight through.
SLOW_PYTHON = """#!/bin/sh
case "$3" in read|lock|renew|release) exec /usr/bin/python3 "$@";; esac
touch {gate}.started
while [ -e {gate} ]; do sleep 0.2; done
exec /usr/bin/python3 "$@"
"""


def _slow_inventory(ssh_lab, root: Path, group_vars: dict | None = None) -> tuple[Path, Path]:
    gate = root / "gate"
    gate.parent.mkdir(parents=True)
    gate.touch()
    python = root / "slow-python"
    python.write_text(SLOW_PYTHON.format(gate=gate))
    python.chmod(0o755)
    t = ssh_lab["targets"]
    slow = {"ansible_python_interpreter": str(python)}
    inv = lab_inventory(
        ssh_lab,
        root / "inv",
        extra_hosts={
            "proxmox_hosts": {"node1": {**t["node1"].inventory_vars(), **slow}},
            "gpu_containers": {
                "ct1": {**t["ct1"].inventory_vars(), **slow, "proxmox_host": "node1", "proxmox_vmid": 100}
            },
        },
        group_vars=group_vars,
    )
    return inv, gate


def _start_apply(inv: Path, runs: Path, gate: Path, out: Path, *more: str) -> subprocess.Popen:
    """`provision apply --full --tags verify` in the background, once it waits at the gate (its host locks taken)."""
    proc = start_apply(inv, runs, out, "--full", "--tags", "verify", *more)
    deadline = time.monotonic() + 180
    while not Path(f"{gate}.started").exists():
        assert proc.poll() is None, out.with_suffix(".err").read_text()[-3000:]
        assert time.monotonic() < deadline, "the run never reached the verify phase"
        time.sleep(0.2)
    return proc


def _lock_on(target) -> str:
    return target.ssh("cat /var/lib/provision/lock.json 2>/dev/null || true").stdout


def test_a_second_apply_is_refused_while_the_first_holds_the_inventory_and_sigterm_stops_the_first(ssh_lab, tmp_path):
    inv, gate = _slow_inventory(ssh_lab, tmp_path / "slow")
    runs = tmp_path / "runs"
    first = _start_apply(inv, runs, gate, tmp_path / "first.json")
    try:
        run_id = next(runs.iterdir()).name
        second = run_provision(
            "apply", "--inventory", str(inv), "--yes", "--json", "--tags", "verify", "--runs-dir", str(runs)
        )
        assert second.returncode == 1, second.stderr
        errors = [line for line in second.stderr.splitlines() if line.startswith("error: ")]
        assert len(errors) == 1, second.stderr
        for part in (
            f"inventory {inv} is locked by run {run_id}",
            f"pid {first.pid} on {socket.gethostname()}",
            "since 20",
        ):
            assert part in errors[0]
        assert json.loads(second.stdout)["errors"] == [errors[0][len("error: ") :]]
        assert [p.name for p in runs.iterdir()] == [run_id], "the refused run left a record"
        assert run_id in _lock_on(ssh_lab["targets"]["node1"]), "the first run holds no host lock"
    except BaseException:
        gate.unlink(missing_ok=True)
        first.kill()
        raise
    interrupt(first, signal.SIGTERM, gate)
    summary = json.loads((runs / run_id / "summary.json").read_text())
    assert (summary["status"], summary["interrupted"]) == ("interrupted", "SIGTERM")
    for target in ssh_lab["targets"].values():
        assert _lock_on(target) == "", f"the interrupted run left its host lock on {target.name}"


def test_sigint_stops_every_process_records_where_each_host_stopped_and_a_rerun_converges(ssh_lab, tmp_path):
    inv, gate = _slow_inventory(ssh_lab, tmp_path / "slow")
    runs = tmp_path / "runs"
    proc = _start_apply(inv, runs, gate, tmp_path / "apply.json")
    interrupt(proc, signal.SIGINT, gate)
    stderr = (tmp_path / "apply.err").read_text()
    (record,) = runs.iterdir()
    assert f"error: interrupted by SIGINT: run record {record}" in stderr, stderr[-2000:]
    envelope = json.loads((tmp_path / "apply.json").read_text())
    assert envelope["exit_code"] == 130 and envelope["hosts"] == {"node1": "interrupted", "ct1": "interrupted"}
    summary = json.loads((record / "summary.json").read_text())
    assert summary["status"] == "interrupted" and summary["host_locks_left"] == []
    for host in ("node1", "ct1"):
        stopped = summary["stopped_at"][host]
        assert (stopped["task"], stopped["finished"]) == ("Record the converged phase in the state directory", False)
        assert stopped["leaves"] == "phase done, its record being written: the next run does the phase again"
    for target in ssh_lab["targets"].values():
        assert _lock_on(target) == "", f"the interrupted run left its host lock on {target.name}"
    rerun = run_provision(
        "apply", "--inventory", str(inv), "--yes", "--json", "--full", "--tags", "verify", "--runs-dir", str(runs)
    )
    assert rerun.returncode == 0, rerun.stderr[-2000:]
    states = json.loads(rerun.stdout)["hosts"]
    assert states.keys() == {"node1", "ct1"} and set(states.values()) <= {"ok", "changed"}, states
    for target in ssh_lab["targets"].values():
        assert "verify.json" in _state(target) and _lock_on(target) == ""


def test_kill_9_of_apply_stops_its_run_within_seconds_leaves_no_secret_and_a_rerun_converges_alone(ssh_lab, tmp_path):
    """provision killed without a word (SIGKILL: the OOM killer, a CI runner's hard kill) cannot stop its run: the
    run's watchdog (provision/watchdog.py) does. Within 10 s no process of the run is left (ansible-playbook, its
    workers, ssh and its ControlPersist masters), the run's private data dir (runner's environment, with the PVE
    password in it, and its events) is gone, and the next apply takes the dead run's host locks over and converges."""
    api = {"all": {"proxmox_api_password": "{{ lookup('ansible.builtin.env', 'PROXMOX_PASSWORD') }}"}}
    inv, gate = _slow_inventory(ssh_lab, tmp_path / "slow", group_vars=api)
    runs = tmp_path / "runs"
    proc = start_apply(
        inv, runs, tmp_path / "apply.json", "--full", "--tags", "verify", env={"PROXMOX_PASSWORD": SECRET}
    )
    try:
        deadline = time.monotonic() + 180
        while not Path(f"{gate}.started").exists():
            assert proc.poll() is None and time.monotonic() < deadline, (tmp_path / "apply.err").read_text()[-3000:]
            time.sleep(0.2)
        private, groups = the_runs_processes(proc)
        assert SECRET.encode() in b"".join(p.read_bytes() for p in Path(private).rglob("*") if p.is_file()), (
            "the private data dir holds no secret: the check below is blind"
        )
        proc.kill()
        proc.wait(timeout=10)
        killed = time.monotonic()
        while time.monotonic() - killed < 10:
            left = {pid: cmd for pid, (group, cmd) in live().items() if group in groups or private + "/" in cmd}
            if not left and not Path(private).exists():
                break
            time.sleep(0.2)
        assert not left, f"processes of the killed run left after 10 s: {left}"
        assert not Path(private).exists(), "the killed run's private data dir is left, with its secrets"
        tmp = Path(tempfile.gettempdir())
        for path in (p for d in tmp.glob("provision-*") for p in d.rglob("*") if p.is_file()):
            assert SECRET.encode() not in path.read_bytes(), f"{path} holds the PVE password"
    finally:
        gate.unlink(missing_ok=True)
        proc.kill()
    rerun = run_provision(
        "apply",
        "--inventory",
        str(inv),
        "--yes",
        "--json",
        "--full",
        "--tags",
        "verify",
        "--runs-dir",
        str(runs),
        env={"PROXMOX_PASSWORD": SECRET},
    )
    assert rerun.returncode == 0, rerun.stderr[-2000:]
    for target in ssh_lab["targets"].values():
        assert "verify.json" in _state(target) and _lock_on(target) == ""


def test_an_ssh_connection_dropped_mid_task_fails_its_host_only_and_a_rerun_converges(ssh_lab, tmp_path):
    """Both hosts wait in a task; node1's sshd session processes are killed, so the controller's connection to it
    drops mid-task. node1 is unreachable, ct1 finishes, node1's host lock is given back by provision afterwards."""
    node1 = ssh_lab["targets"]["node1"]
    inv, gate = _slow_inventory(ssh_lab, tmp_path / "slow")
    runs = tmp_path / "runs"
    proc = _start_apply(inv, runs, gate, tmp_path / "apply.json")
    try:
        found = tree(node1.process.pid)
        sessions = [pid for pid, cmd in found.items() if cmd.startswith("sshd")]
        assert sessions, f"no ssh session to node1 to drop: {found}"
        for pid in sessions:  # the per-connection sshd processes of this test's node1 target
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        gate.unlink()
        assert proc.wait(timeout=300) == 1
    finally:
        gate.unlink(missing_ok=True)
        proc.kill()
    envelope = json.loads((tmp_path / "apply.json").read_text())
    assert envelope["hosts"] == {"node1": "unreachable", "ct1": envelope["hosts"]["ct1"]}, envelope["hosts"]
    assert envelope["hosts"]["ct1"] in ("ok", "changed"), "the other host did not finish"
    messages = [f["message"] for f in envelope["result"]["failures"] if f["host"] == "node1"]
    assert messages and all(m.startswith("unreachable: ") for m in messages), messages
    assert any("closed by remote host" in m for m in messages), messages
    assert json.loads(next(runs.iterdir()).joinpath("summary.json").read_text())["host_locks_left"] == []
    assert _lock_on(node1) == "", "the dropped host's lock was not given back"
    rerun = run_provision(
        "apply", "--inventory", str(inv), "--yes", "--json", "--full", "--tags", "verify", "--runs-dir", str(runs)
    )
    assert rerun.returncode == 0, rerun.stderr[-2000:]
    assert set(json.loads(rerun.stdout)["hosts"].values()) <= {"ok", "changed"}


def test_a_host_lock_held_by_another_controller_stops_its_host_until_break_lock(ssh_lab, inv, tmp_path):
    node = ssh_lab["targets"]["node1"]
    other = {
        "run_id": "20250101T000000-apply",
        "controller": "other-controller",
        "pid": 4242,
        "since": "2025-01-01T00:00:00+00:00",
        "pid_ns": "elsewhere",
        "taken_at": time.time(),
        "lease_s": 3600,
    }
    node.ssh(f"umask 077 && echo {shlex.quote(json.dumps(other))} > /var/lib/provision/lock.json")
    runs = tmp_path / "runs"
    proc = run_provision(
        "apply", "--inventory", str(inv), "--yes", "--json", "--tags", "verify", "--runs-dir", str(runs)
    )
    assert proc.returncode == 1, proc.stderr[-2000:]
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error: ")]
    holder = "run 20250101T000000-apply (pid 4242 on other-controller, since 2025-01-01T00:00:00+00:00)"
    assert errors == [
        f"error: node1: host lock held by {holder}: wait for that run to end, or pass --break-lock if it is gone"
    ], proc.stderr[-2000:]
    envelope = json.loads(proc.stdout)
    assert envelope["errors"] == [errors[0][len("error: ") :]]
    assert envelope["hosts"]["node1"] == "failed"
    assert json.loads(_lock_on(node))["controller"] == "other-controller", "the other run's lock was touched"
    assert _lock_on(ssh_lab["targets"]["ct1"]) == "", "ct1's lock was not given back"

    proc = run_provision(
        "apply", "--inventory", str(inv), "--yes", "--tags", "verify", "--runs-dir", str(runs), "--break-lock"
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert f"node1: --break-lock: broke the host lock held by {holder}" in proc.stdout
    assert _lock_on(node) == "", "the run that broke the lock did not give it back"


def test_a_host_lock_is_taken_over_from_a_gone_run_of_this_controller_or_an_expired_lease(ssh_lab, inv, tmp_path):
    from provision.locks import pid_namespace

    node, runs = ssh_lab["targets"]["node1"], tmp_path / "runs"
    gone = subprocess.Popen(["true"])
    gone.wait()
    mine = {
        "run_id": "20250101T000000-apply",
        "controller": socket.gethostname(),
        "pid": os.getpid(),
        "since": "2025-01-01T00:00:00+00:00",
        "pid_ns": pid_namespace(),
        "taken_at": time.time(),
        "lease_s": 3600,
    }
    cases = [
        (mine, 1, "host lock held by run 20250101T000000-apply"),  # its process is alive: not taken
        ({**mine, "pid": gone.pid}, 0, "took over the host lock of a run of this controller that is gone: run"),
        (
            {**mine, "controller": "elsewhere", "pid_ns": "x", "taken_at": time.time() - 3601},
            0,
            "took the host lock whose lease had run out, held by run 20250101T000000-apply",
        ),
    ]
    for planted, code, said in cases:
        node.ssh(f"umask 077 && echo {shlex.quote(json.dumps(planted))} > /var/lib/provision/lock.json")
        proc = run_provision("apply", "--inventory", str(inv), "--yes", "--tags", "verify", "--runs-dir", str(runs))
        assert proc.returncode == code, proc.stdout[-2000:] + proc.stderr[-2000:]
        assert said in proc.stdout + proc.stderr
        assert json.loads(_lock_on(node) or "{}").get("pid") == (os.getpid() if code else None)
    # --break-lock does not break a live run of this controller: it would converge beside it, neither told
    node.ssh(f"umask 077 && echo {shlex.quote(json.dumps(mine))} > /var/lib/provision/lock.json")
    proc = run_provision(
        "apply", "--inventory", str(inv), "--yes", "--tags", "verify", "--runs-dir", str(runs), "--break-lock"
    )
    assert proc.returncode == 1, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert (
        f"host lock held by run 20250101T000000-apply (pid {os.getpid()} on {socket.gethostname()}, since "
        "2025-01-01T00:00:00+00:00): it is a run of this controller, still alive: --break-lock takes the lock of "
        "no live run; stop that run first"
    ) in proc.stderr, proc.stderr[-2000:]
    assert json.loads(_lock_on(node))["pid"] == os.getpid(), "the live run's lock was broken"
    node.ssh("rm -f /var/lib/provision/lock.json")


def _held_line(host: str, holder: str, node: str | None = None) -> str:
    lock = f"host lock of its node {node}" if node else "host lock"
    return f"error: {host}: {lock} held by {holder}: wait for that run to end, or pass --break-lock if it is gone"


LEASE_S = 30  # the renewal test's lease: the running apply renews its host locks every quarter of it


def test_a_run_longer_than_its_lease_keeps_its_host_locks(ssh_lab, tmp_path):
    """The first run waits at its gate for longer than its hosts' lease: the running apply renews its host locks, so
    a second run (another inventory of the same hosts: not stopped by the controller lock) is refused, naming it."""
    lease = {"all": {"provision_state_lock_lease_s": LEASE_S}}
    # held at its gate past the lease: longer than the 30 s a connection (Mitogen's interpreter start) may take
    held = {"all": {**lease["all"], "ansible_ssh_timeout": 3 * LEASE_S}}
    inv, gate = _slow_inventory(ssh_lab, tmp_path / "slow", group_vars=held)
    other = lab_inventory(ssh_lab, tmp_path / "other" / "inv", group_vars=lease)
    runs, targets = tmp_path / "runs", ssh_lab["targets"]
    first = _start_apply(inv, runs, gate, tmp_path / "first.json")
    try:
        run_id = next(runs.iterdir()).name
        locks = {name: json.loads(_lock_on(target)) for name, target in targets.items()}
        taken = {name: lock["taken_at"] for name, lock in locks.items()}
        while time.time() < max(taken.values()) + LEASE_S + 5:  # past the lease the locks were taken with
            assert first.poll() is None, (tmp_path / "first.err").read_text()[-3000:]
            time.sleep(1)
        second = run_provision(
            "apply", "--inventory", str(other), "--yes", "--tags", "verify", "--runs-dir", str(tmp_path / "runs2")
        )
        assert second.returncode == 1, second.stdout[-2000:] + second.stderr[-2000:]
        holder = f"run {run_id} (pid {first.pid} on {socket.gethostname()}, since {locks['node1']['since']})"
        errors = sorted(line for line in second.stderr.splitlines() if line.startswith("error: "))
        # the nodes are read and locked first (playbooks/facts.yml): ct1 stops on its node's held lock, unread
        assert errors == [_held_line("node1", holder)], second.stderr[-2000:]
        assert "ct1: [Stop a container whose node cannot be read] its node node1 is unreachable, or failed earlier" in (
            second.stdout + second.stderr
        ), second.stdout[-2000:] + second.stderr[-2000:]
        for name, target in targets.items():
            record = json.loads(_lock_on(target))
            assert record["run_id"] == run_id and record["taken_at"] > taken[name], f"{name}: not renewed: {record}"
    finally:
        gate.unlink(missing_ok=True)
    try:
        assert first.wait(timeout=300) == 0, (tmp_path / "first.err").read_text()[-3000:]
    finally:
        first.kill()
    for target in targets.values():
        assert _lock_on(target) == "", f"the first run did not give back its host lock on {target.name}"


def _node_files(node) -> str:
    """node1's records with their times and sizes (its lock aside): what a run touched there."""
    return node.ssh("find /var/lib/provision -mindepth 1 ! -name lock.json -printf '%P %T@ %s\\n' | sort").stdout


def test_apply_limited_to_a_container_stops_on_its_nodes_host_lock_until_break_lock(ssh_lab, inv, tmp_path):
    """`--limit ct1` takes the host lock of ct1's node too (its gpu phase changes the node): held by another run, it
    stops ct1 naming the holder; --check takes no lock; --break-lock takes it, and node1 is not otherwise touched."""
    node, ct = ssh_lab["targets"]["node1"], ssh_lab["targets"]["ct1"]
    other = {
        "run_id": "20250101T000000-apply",
        "controller": "other-controller",
        "pid": 4242,
        "since": "2025-01-01T00:00:00+00:00",
        "pid_ns": "elsewhere",
        "taken_at": time.time(),
        "lease_s": 3600,
    }
    node.ssh(f"umask 077 && echo {shlex.quote(json.dumps(other))} > /var/lib/provision/lock.json")
    holder = "run 20250101T000000-apply (pid 4242 on other-controller, since 2025-01-01T00:00:00+00:00)"
    runs, files = tmp_path / "runs", _node_files(node)
    limited = ("--inventory", str(inv), "--limit", "ct1", "--tags", "verify", "--runs-dir", str(runs))
    try:
        check = run_provision("apply", *limited, "--check")
        assert check.returncode == 0, check.stdout[-2000:] + check.stderr[-2000:]  # no lock asked for, none held
        proc = run_provision("apply", *limited, "--yes", "--json")
        assert proc.returncode == 1, proc.stdout[-2000:] + proc.stderr[-2000:]
        errors = [line for line in proc.stderr.splitlines() if line.startswith("error: ")]
        assert errors == [_held_line("ct1", holder, node="node1")], proc.stderr[-2000:]
        assert json.loads(proc.stdout)["hosts"] == {"ct1": "failed"}
        assert json.loads(_lock_on(node))["controller"] == "other-controller", "the other run's lock was touched"
        assert _lock_on(ct) == "", "ct1's lock was not given back"

        proc = run_provision("apply", *limited, "--yes", "--break-lock")
        assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
        assert f"ct1: --break-lock: broke the host lock of its node node1 held by {holder}" in proc.stdout
        assert _lock_on(node) == "" and _lock_on(ct) == "", "the run that broke the lock did not give it back"
        assert _node_files(node) == files, "a run limited to ct1 changed node1"

        # node1's lock left by a run of this controller that is gone: taken over, then given back
        from provision.locks import pid_namespace

        gone = subprocess.Popen(["true"])
        gone.wait()
        mine = {**other, "controller": socket.gethostname(), "pid": gone.pid, "pid_ns": pid_namespace()}
        node.ssh(f"umask 077 && echo {shlex.quote(json.dumps(mine))} > /var/lib/provision/lock.json")
        proc = run_provision("apply", *limited, "--yes")
        assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
        said = "ct1: took over the host lock of its node node1 of a run of this controller that is gone: run 2025"
        assert said in proc.stdout, proc.stdout[-2000:]
        assert _lock_on(node) == "", "the run that took over node1's lock did not give it back"
    finally:
        node.ssh("rm -f /var/lib/provision/lock.json")


def _task_runs(record: Path, task: str) -> list[str]:
    """The hosts on which a task ran (not skipped), from the run's ansible-runner job events."""
    found = []
    for path in (record / "artifacts" / "run" / "job_events").glob("*.json"):
        event = json.loads(path.read_text())
        data = event.get("event_data", {})
        ran = event.get("event") in ("runner_on_ok", "runner_on_failed", "runner_on_unreachable")
        if ran and data.get("task") == task:
            found.append(data.get("host"))
    return found


def test_containers_of_one_node_outside_the_run_read_and_lock_it_once(ssh_lab, tmp_path):
    """Two containers of node1 (ct1, and ct1b on the same target), `--limit gpu_containers`: node1 is read and its
    lock taken by one delegated command, for both; held by another run, both stop, each naming it; --break-lock
    breaks it once, and one release gives it back."""
    from provision.locks import NODE_READ_TASK, NODE_RELEASE_TASK

    node, ct = ssh_lab["targets"]["node1"], ssh_lab["targets"]["ct1"]
    twin = {**ct.inventory_vars(), "proxmox_host": "node1", "proxmox_vmid": 101}
    inv = lab_inventory(ssh_lab, tmp_path / "inv" / "twins", extra_hosts={"gpu_containers": {"ct1b": twin}})
    other = {
        "run_id": "20250101T000000-apply",
        "controller": "other-controller",
        "pid": 4242,
        "since": "2025-01-01T00:00:00+00:00",
        "pid_ns": "elsewhere",
        "taken_at": time.time(),
        "lease_s": 3600,
    }
    holder = "run 20250101T000000-apply (pid 4242 on other-controller, since 2025-01-01T00:00:00+00:00)"
    node.ssh(f"umask 077 && echo {shlex.quote(json.dumps(other))} > /var/lib/provision/lock.json")
    runs = tmp_path / "runs"
    limited = ("--inventory", str(inv), "--limit", "gpu_containers", "--tags", "verify", "--runs-dir", str(runs))
    try:
        proc = run_provision("apply", *limited, "--yes")
        assert proc.returncode == 1, proc.stdout[-2000:] + proc.stderr[-2000:]
        errors = sorted(line for line in proc.stderr.splitlines() if line.startswith("error: "))
        assert errors == [_held_line(h, holder, node="node1") for h in ("ct1", "ct1b")], proc.stderr[-2000:]
        (record,) = runs.iterdir()
        assert len(_task_runs(record, NODE_READ_TASK)) == 1, "node1 was not read once for both containers"

        proc = run_provision("apply", *limited, "--yes", "--break-lock")
        assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
        assert proc.stdout.count("--break-lock: broke the host lock of its node node1") == 1, proc.stdout[-2000:]
        record = max(runs.iterdir(), key=lambda p: p.stat().st_mtime)
        read, released = _task_runs(record, NODE_READ_TASK), _task_runs(record, NODE_RELEASE_TASK)
        assert len(read) == 1 and len(released) == 1, (read, released)  # by one of them, whichever was grouped first
        assert _lock_on(node) == "" and _lock_on(ct) == "", "the run did not give the locks back"
    finally:
        node.ssh("rm -f /var/lib/provision/lock.json")


def test_apply_limited_to_a_container_holds_its_nodes_host_lock_and_an_interrupt_gives_it_back(ssh_lab, tmp_path):
    """While `apply --limit ct1` runs, node1's lock is that run's: a run on node1 alone is refused, naming it.
    SIGINT leaves no Ansible behind (the unlock play never runs): provision gives back both locks afterwards."""
    inv, gate = _slow_inventory(ssh_lab, tmp_path / "slow")
    node, runs = ssh_lab["targets"]["node1"], tmp_path / "runs"
    proc = _start_apply(inv, runs, gate, tmp_path / "apply.json", "--limit", "ct1")
    try:
        (record,) = runs.iterdir()
        lock = json.loads(_lock_on(node) or "{}")
        assert (lock.get("run_id"), lock.get("pid")) == (record.name, proc.pid), f"node1's lock: {lock}"
        other = lab_inventory(ssh_lab, tmp_path / "other" / "inv")
        second = run_provision(
            "apply",
            "--inventory",
            str(other),
            "--yes",
            "--limit",
            "node1",
            "--tags",
            "verify",
            "--runs-dir",
            str(tmp_path / "runs2"),
        )
        assert second.returncode == 1, second.stdout[-2000:] + second.stderr[-2000:]
        holder = f"run {record.name} (pid {proc.pid} on {socket.gethostname()}, since "
        assert f"error: node1: host lock held by {holder}" in second.stderr, second.stderr[-2000:]
    except BaseException:
        gate.unlink(missing_ok=True)
        proc.kill()
        raise
    interrupt(proc, signal.SIGINT, gate)
    summary = json.loads((record / "summary.json").read_text())
    assert summary["status"] == "interrupted" and summary["host_locks_left"] == []
    for target in ssh_lab["targets"].values():
        assert _lock_on(target) == "", f"the interrupted run left its host lock on {target.name}"


def test_apply_limited_to_a_container_whose_node_is_unreachable_says_why_in_the_containers_line(ssh_lab, tmp_path):
    """`--limit ct1` with node1 down: the delegated read of node1 is unreachable (ignore_unreachable, so the
    container runs on to its stop), and the one failure line, ct1's, carries ssh's reason."""
    import socket as socket_mod

    closed = socket_mod.socket()
    closed.bind(("127.0.0.1", 0))  # a port that refuses: bound, never listening
    node = {**ssh_lab["targets"]["node1"].inventory_vars(), "ansible_port": closed.getsockname()[1]}
    inv = lab_inventory(ssh_lab, tmp_path / "inv" / "down", extra_hosts={"proxmox_hosts": {"node1": node}})
    try:
        proc = run_provision(
            "apply",
            "--inventory",
            str(inv),
            "--limit",
            "ct1",
            "--tags",
            "verify",
            "--yes",
            "--json",
            "--runs-dir",
            str(tmp_path / "runs"),
        )
    finally:
        closed.close()
    assert proc.returncode == 1, proc.stdout[-2000:] + proc.stderr[-2000:]
    failures = json.loads(proc.stdout)["result"]["failures"]
    assert [f["host"] for f in failures] == ["ct1"], failures
    message = failures[0]["message"]
    assert message.startswith("its node node1 is unreachable (") and "cannot be decided" in message, message
    assert "refused" in message.lower() and "\n" not in message, message
