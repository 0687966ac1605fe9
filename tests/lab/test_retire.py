"""`provision retire` on a container: `--check` removes nothing and says what it would; the run takes the server out
of service and removes what the sglang and gpu phases put there (the unit, its configuration, the venv, the records,
the NVIDIA devN entries, which the container then runs without), keeps the weights, and records the retirement; a
second run changes nothing; `apply` converges the container again."""

from __future__ import annotations

import json

import pytest

from provision.lab.container import MODEL_DIR
from provision.lab.lab import CONTAINER_VMID
from tests.conftest import run_provision
from tests.lab.common import apply, ensure_converged, wait_ready

LAB_CHANGES = {"gpu", "sglang", "ct"}  # tests/lab/conftest.py
LAB_NODES = "nspawn"  # no bootloader, no kernel line changed: nodes as nspawn containers (docs/lab.md)

CT = "sglang-01"
NODE = "pve-grub"
# what the sglang and gpu phases leave in the container, and the records of the phases
SERVICE_FILES = ("/etc/systemd/system/sglang.service", "/etc/sglang", "/opt/sglang/venv")
RECORDS = ("/var/lib/provision/sglang-service.json", "/var/lib/provision/sglang.json", "/var/lib/provision/gpu.json")


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    return tmp_path_factory.mktemp("retire-runs")


@pytest.fixture(scope="module")
def ct(lab, lab_inventory, runs):
    ensure_converged(lab, lab_inventory, runs, "kernel", "gpu", "sglang")
    yield lab.container()
    if apply(lab_inventory, runs, "--tags", "gpu,sglang")[0] != 0:  # the next module starts from a served lab
        lab.recreate()


def retire(inventory, runs, *extra: str) -> tuple[int, dict, str]:
    args = ("--inventory", str(inventory), "--limit", CT, "--yes", "--json", "--runs-dir", str(runs), *extra)
    proc = run_provision("retire", *args, timeout=900)
    try:
        result = json.loads(proc.stdout)["result"]
    except (ValueError, KeyError):
        result = {}
    return proc.returncode, result, proc.stderr


def present(ct, paths) -> list[str]:
    """Which of `paths` exist in the container."""
    out = ct.ssh("for p in " + " ".join(paths) + '; do test -e "$p" && echo "$p"; done; true').stdout
    return out.split()


def nvidia_entries(lab) -> list[str]:
    config = lab.pve_control("GET", f"/ct/{CONTAINER_VMID}")["config"]
    return sorted(k for k, v in config.items() if k.startswith("dev") and "/dev/nvidia" in v)


def test_check_mode_names_the_changes_and_removes_nothing(lab, ct, lab_inventory, runs):
    entries = nvidia_entries(lab)
    rc, result, err = retire(lab_inventory, runs, "--check")
    assert rc == 0, err[-3000:]
    assert result["hosts"][CT]["changed"] > 0, result["hosts"]
    said = result["reports"][CT]
    assert said[0].startswith("would remove /etc/systemd/system/sglang.service, /etc/sglang, /opt/sglang/venv"), said
    assert " to delete; the container would be rebooted to drop them" in said[1], said
    assert len(said) == 2, said  # no phase is reported skipped: retire runs none
    assert present(ct, SERVICE_FILES + RECORDS) == list(SERVICE_FILES + RECORDS)
    assert nvidia_entries(lab) == entries and entries
    assert ct.ssh("systemctl is-active sglang").stdout.strip() == "active"


def test_retire_removes_what_it_says_and_keeps_the_weights(lab, ct, lab_inventory, runs):
    model = ct.ssh(f"ls {MODEL_DIR}").stdout.split()
    rc, result, err = retire(lab_inventory, runs)
    assert rc == 0, err[-3000:]
    assert present(ct, SERVICE_FILES + RECORDS) == []
    assert ct.ssh("systemctl is-enabled sglang").returncode != 0
    assert ct.ssh("curl -s -o /dev/null localhost:30000/health").returncode != 0  # nothing serves there
    assert nvidia_entries(lab) == []
    assert ct.ssh("ls /dev/nvidia0 /dev/nvidiactl").returncode != 0  # rebooted: it runs without them
    assert ct.ssh(f"ls {MODEL_DIR}").stdout.split() == model and model
    node = lab.vm(NODE)
    assert node.ssh(f"ls /var/lib/provision/fingerprint/ | grep @{CT}").stdout == ""
    record = json.loads(ct.ssh("cat /var/lib/provision/retired.json").stdout)
    assert record["phases"] == ["gpu", "sglang"] and record["command"].startswith("provision retire")
    said = result["reports"][CT]
    assert said[0].endswith(f"; weights at {MODEL_DIR} kept (not a download of the role's)"), said
    assert said[1].endswith(" deleted; container rebooted to drop them"), said


def test_a_second_retire_changes_nothing(lab, ct, lab_inventory, runs):
    record = ct.ssh("cat /var/lib/provision/retired.json").stdout
    rc, result, err = retire(lab_inventory, runs)
    assert rc == 0, err[-3000:]
    assert result["hosts"][CT]["changed"] == 0, result["hosts"][CT]
    assert ct.ssh("cat /var/lib/provision/retired.json").stdout == record


def test_apply_converges_the_retired_container_again(lab, ct, lab_inventory, runs):
    rc, _, err = apply(lab_inventory, runs, "--tags", "gpu,sglang")
    assert rc == 0, err[-3000:]
    wait_ready(ct)
    assert ct.ssh("systemctl is-enabled sglang").stdout.strip() == "enabled"
    assert ct.ssh("curl -sf localhost:30000/health").returncode == 0
    assert nvidia_entries(lab) and ct.ssh("nvidia-smi -L").returncode == 0
