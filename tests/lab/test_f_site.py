"""The whole site playbook against the lab: converge, a second run that changes nothing, verify."""

from __future__ import annotations

import json

from tests.conftest import run_provision


def test_apply_and_verify_against_the_lab(lab, lab_inventory, tmp_path):
    runs = tmp_path / "runs"
    first = run_provision("apply", "--inventory", str(lab_inventory), "--yes", "--json", "--runs-dir", str(runs))
    assert first.returncode == 0, first.stderr[-2000:]
    second = run_provision("apply", "--inventory", str(lab_inventory), "--yes", "--json", "--runs-dir", str(runs))
    assert second.returncode == 0
    assert all(h["changed"] == 0 for h in json.loads(second.stdout)["hosts"].values())
    verify = run_provision("verify", "--inventory", str(lab_inventory), "--json", "--runs-dir", str(runs))
    assert verify.returncode == 0, verify.stdout
    assert {c["host"] for c in json.loads(verify.stdout)["checks"]} == {"pve-grub", "pve-sdboot", "sglang-01"}
