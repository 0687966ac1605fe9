"""proxmox_lxc_gpu's one-line answers to PVE's refusals of a devN change (plugins/modules/proxmox_lxc_gpu.py)."""

from __future__ import annotations

from proxmoxer.core import ResourceException

from tests.unit import collection

gpu = collection.module("proxmox_lxc_gpu")
PARAMS = {"node": "pve1", "api_user": "root@pam", "api_token_id": None, "backend": "https"}
# PVE before 8.1 (pve-container before 5.0.7) has no devN in its LXC schema: JSONSchema's parameter check refuses
# the key with this text (pve-common PVE/JSONSchema.pm, "property is not defined in schema and the schema does
# not allow additional properties")
NO_DEVN = {"dev0": "property is not defined in schema and the schema does not allow additional properties"}


def test_a_pve_without_devn_is_named_with_the_release_that_has_it():
    exc = ResourceException(400, "Parameter verification failed.", "", errors=NO_DEVN)
    assert str(gpu.put_refused(PARAMS, exc)) == (
        "PVE on node pve1 does not know devN entries (they came with PVE 8.1, pve-container 5.0.7): upgrade the "
        "node to PVE 8.1 or later, then run again"
    )
    other = ResourceException(400, "Parameter verification failed.", "", errors={"dev0": "invalid format"})
    assert str(gpu.put_refused(PARAMS, other)).startswith("PVE rejected the devN entries: ")
