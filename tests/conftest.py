"""Shared fixtures: real sshd targets and inventories written for them."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.sshtarget import free_port, make_client_key, start_target

REPO = Path(__file__).resolve().parent.parent
# the files outside the lab that take minutes on one worker (docs/lab.md, Test durations)
LONG_FILES = tuple(
    REPO / "tests" / "unit" / path
    for path in (
        "roles/nvidia_driver/test_main.py",
        "plugins/modules/test_kernel_cmdline_trial.py",
        "roles/gpu_passthrough/test_userspace.py",
    )
)
# the lab module that takes longest on one worker, started before the others
LONGEST_LAB_FILE = REPO / "tests" / "lab" / "test_gateway.py"


@pytest.hookimpl(trylast=True)  # after `-m` has deselected: the order is of the files that run
def pytest_collection_modifyitems(items):
    """Under pytest-xdist (`--dist loadfile --no-loadscope-reorder`) the workers take whole files in collection order:
    the longest first, so that the many short files fill the end. Two lab modules start (each minutes long, each on a
    lab of its worker's own; LONGEST_LAB_FILE one of them), then the sshd integration file, then the other lab
    modules, then the longest files outside them (LONG_FILES), then everything else."""
    if not os.environ.get("PYTEST_XDIST_WORKER"):
        return
    files = list(dict.fromkeys(item.path for item in items))
    lab = list(dict.fromkeys(item.path for item in items if item.get_closest_marker("lab")))  # tests/lab/conftest.py
    lab.sort(key=lambda f: f != LONGEST_LAB_FILE)
    sshd = [f for f in files if f.name == "test_apply_ssh.py"]
    long = [f for f in files if f in LONG_FILES]
    order = [*lab[:2], *sshd, *lab[2:], *long, *(f for f in files if f not in {*lab, *sshd, *long})]
    rank = {f: i for i, f in enumerate(order)}
    items.sort(key=lambda item: rank[item.path])


# the one variable the roles require of every container (roles/sglang/meta/argument_specs.yml)
CONTAINER_VARS = {"sglang_model_path": "/srv/models/test-model"}
# what a run needs to reach the PVE API from the hosts whose phases use it (provision/inventory.py _api_use): an
# address in TEST-NET-1, the password from the environment
API_VARS = {
    "proxmox_api_host": "192.0.2.1",
    "proxmox_api_password": "{{ lookup('ansible.builtin.env', 'PROXMOX_PASSWORD') }}",
}
API_GROUPS = ("gpu_containers", "proxmox_hosts")


def write_inventory(path: Path, hosts: dict, group_vars: dict | None = None) -> Path:
    """hosts: {group: {host: vars}}; gpu_containers get CONTAINER_VARS, and both groups API_VARS, in their group_vars
    unless the test sets them (any proxmox_api_ variable, for API_VARS)."""
    path.mkdir(parents=True, exist_ok=True)
    doc = {"all": {"children": {g: {"hosts": h} for g, h in hosts.items()}}}
    (path / "hosts.yml").write_text(yaml.safe_dump(doc, sort_keys=False))
    group_vars = {**(group_vars or {})}
    if "gpu_containers" in hosts:
        group_vars["gpu_containers"] = {**CONTAINER_VARS, **group_vars.get("gpu_containers", {})}
    own_api = any(k.startswith("proxmox_api_") for values in group_vars.values() for k in values)
    for group in (g for g in API_GROUPS if g in hosts and not own_api):  # the test's own API settings stand alone
        group_vars[group] = {**API_VARS, **group_vars.get(group, {})}
    if group_vars:
        (path / "group_vars").mkdir(exist_ok=True)
        for group, values in group_vars.items():
            (path / "group_vars" / f"{group}.yml").write_text(yaml.safe_dump(values, sort_keys=False))
    return path


def vault_encrypt(path: Path, password_file: Path) -> None:
    """Encrypt a whole file with this virtualenv's ansible-vault, as a site encrypts group_vars/all/vault.yml."""
    vault = Path(sys.executable).parent / "ansible-vault"
    subprocess.run([vault, "encrypt", "--vault-password-file", password_file, path], check=True, capture_output=True)


def vault_encrypt_string(name: str, value: str, password_file: Path | str) -> str:
    """`name: !vault |` with `value` encrypted by this virtualenv's ansible-vault, as `encrypt_string` prints it."""
    vault = Path(sys.executable).parent / "ansible-vault"
    argv = [vault, "encrypt_string", "--vault-password-file", password_file, "--name", name, value]
    return subprocess.run(argv, check=True, capture_output=True, text=True).stdout


def run_provision(*args: str, env: dict | None = None, cwd: Path | None = None, timeout: int = 600):
    """Run provision; past `timeout`, interrupt it as a user would (SIGINT: it stops every process of its run,
    provision/interrupts.py) before TimeoutExpired, so that no ansible-playbook of a timed-out test runs on."""
    with subprocess.Popen(
        [sys.executable, "-m", "provision", *args],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, **(env or {})},
        cwd=cwd,
    ) as proc:
        try:
            out, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired as timed_out:
            proc.send_signal(signal.SIGINT)
            try:  # what it printed, its interrupted record's line included, goes with the exception
                timed_out.stdout, timed_out.stderr = proc.communicate(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()
                timed_out.stdout, timed_out.stderr = proc.communicate()
            raise
        except BaseException:
            proc.kill()
            raise
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


@pytest.fixture(scope="session")
def ssh_lab(tmp_path_factory):
    """Two real sshd targets: a 'node' and a 'container'."""
    if os.geteuid() != 0 or not shutil.which("unshare") or not Path("/usr/sbin/sshd").exists():
        pytest.skip("needs root, unshare and openssh-server (installed by .ci/setup)")
    root = tmp_path_factory.mktemp("sshlab")
    key = make_client_key(root)
    known_hosts = root / "known_hosts"
    targets = {}
    try:
        for name in ("node1", "ct1"):
            targets[name] = start_target(name, root, key, known_hosts)
        yield {"root": root, "targets": targets, "dead_port": free_port()}
    finally:
        for t in targets.values():
            t.stop()


def lab_inventory(ssh_lab, path: Path, extra_hosts: dict | None = None, group_vars: dict | None = None) -> Path:
    t = ssh_lab["targets"]
    hosts = {
        "proxmox_hosts": {"node1": t["node1"].inventory_vars()},
        "gpu_containers": {
            "ct1": {**t["ct1"].inventory_vars(), "proxmox_host": "node1", "proxmox_vmid": 100},
        },
    }
    for group, more in (extra_hosts or {}).items():
        hosts[group].update(more)
    return write_inventory(path, hosts, group_vars)
