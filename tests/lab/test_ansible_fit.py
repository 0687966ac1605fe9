"""An existing Ansible shop's setup, on the lab: the user's ansible.cfg (a bastion ProxyCommand) carries
every command's connections, and `plan` tells the truth in its exit code and on screen.

The lab inventory connects as the unprivileged user `ops` with become (lab.py), so every lab test,
these included, runs through sudo."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import yaml

from tests.conftest import run_provision
from tests.lab.common import apply, ensure_converged
from tests.proxy import bastion_dir

LAB_CHANGES = {"kernel", "gpu", "sglang", "ct"}  # tests/lab/conftest.py
LAB_NODES = "nspawn"  # no bootloader, no kernel line changed: nodes as nspawn containers (docs/lab.md)

UNIT = "/etc/systemd/system/sglang.service"


@pytest.fixture(scope="module", autouse=True)
def converged(lab, lab_inventory, tmp_path_factory):
    """Every command below starts from a converged site."""
    ensure_converged(lab, lab_inventory, tmp_path_factory.mktemp("fit-runs"), "kernel", "gpu", "sglang")


def _run(work: Path, *argv: str, timeout: int = 1200):
    proc = run_provision(*argv, "--json", cwd=work, timeout=timeout)
    return proc, json.loads(proc.stdout) if proc.stdout.strip() else {}


def test_every_command_connects_through_the_users_ansible_cfg(lab, lab_inventory, tmp_path):
    work, log = bastion_dir(tmp_path)
    runs = str(tmp_path / "runs")
    ports = {f"127.0.0.1:{vm['port']}" for vm in lab.state()["vms"]}
    container = yaml.safe_load((lab_inventory / "hosts.yml").read_text())["all"]["children"]["gpu_containers"]
    ct_address = next(iter(container["hosts"].values()))["ansible_host"]
    bench = ["--concurrency", "1", "--prompts-per-level", "1", "--input-len", "16", "--output-len", "16"]
    for argv, wanted in (
        (["plan"], ports | {f"{ct_address}:22"}),
        (["apply", "--yes", "--tags", "verify"], ports | {f"{ct_address}:22"}),
        (["verify"], ports | {f"{ct_address}:22"}),
        (["diag"], {f"{ct_address}:22"}),
        (["bench", *bench], {f"{ct_address}:22"}),
    ):
        log.unlink(missing_ok=True)
        proc, data = _run(work, argv[0], "--inventory", str(lab_inventory), "--runs-dir", runs, *argv[1:])
        assert data.get("command") == argv[0], proc.stderr[-2000:]
        if argv[0] != "diag":  # the lab's GPUs are fakes: diag's verdict is no-gpu, exit 1
            assert proc.returncode in (0, 4), (argv, proc.stderr[-2000:])
        used = set(log.read_text().split()) if log.exists() else set()
        assert wanted <= used, f"{argv[0]} did not connect through ansible.cfg's ProxyCommand: {used}"


def test_plan_exit_codes_and_diff(lab, lab_inventory, tmp_path):
    runs = str(tmp_path / "runs")
    rc, _, err = apply(lab_inventory, tmp_path / "runs")
    assert rc == 0, err[-2000:]
    proc = run_provision("plan", "--inventory", str(lab_inventory), "--runs-dir", runs, timeout=1200)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    assert "up to date" in proc.stdout

    ct = lab.containers()[0]
    ct.ssh(f"sed -i 's/^Restart=.*/Restart=no/' {UNIT}")  # a change by hand
    try:
        proc = run_provision("plan", "--inventory", str(lab_inventory), "--runs-dir", runs, timeout=1200)
        assert proc.returncode == 4, proc.stdout[-3000:] + proc.stderr[-2000:]
        assert "-Restart=no" in proc.stdout and f"{ct.spec.name}: changes pending" in proc.stdout
    finally:
        rc, _, err = apply(lab_inventory, tmp_path / "runs", "--tags", "sglang")
        assert rc == 0, err[-2000:]

    # a node that hosts no container is down: it is unreachable, every other host is up to date
    spare = lab.state()["vms"][1]["name"]
    proc, data = _plan_with_node_down(tmp_path, lab_inventory, spare, runs)
    assert proc.returncode == 1 and data["hosts"][spare] == "unreachable", proc.stderr[-2000:]
    assert set(data["hosts"].values()) == {"unreachable", "up to date"}, data["hosts"]
    # the container's node is down: the container fails naming it, the other node stays up to date
    node = lab.state()["vms"][0]["name"]
    proc, data = _plan_with_node_down(tmp_path, lab_inventory, node, runs)
    assert proc.returncode == 1, proc.stderr[-2000:]
    assert data["hosts"] == {node: "unreachable", spare: "up to date", ct.spec.name: "failed"}, data["hosts"]
    failure = next(f for f in data["result"]["failures"] if f["host"] == ct.spec.name)
    assert f"its node {node} is unreachable" in failure["message"]


def _plan_with_node_down(tmp_path: Path, inventory: Path, node: str, runs: str):
    down = tmp_path / f"down-{node}"
    shutil.copytree(inventory, down)
    hosts = yaml.safe_load((down / "hosts.yml").read_text())
    hosts["all"]["children"]["proxmox_hosts"]["hosts"][node]["ansible_port"] = 9  # nothing listens there
    (down / "hosts.yml").write_text(yaml.safe_dump(hosts))
    return _run(tmp_path, "plan", "--inventory", str(down), "--runs-dir", runs)
