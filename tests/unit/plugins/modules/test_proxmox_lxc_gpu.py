"""proxmox_lxc_gpu's one-line answers to PVE's refusals of a devN change (plugins/modules/proxmox_lxc_gpu.py)."""

from __future__ import annotations

from proxmoxer.core import ResourceException

from tests.unit import collection
from tests.unit.plugins.modules.test_proxmox_lxc_gpu_faults import (
    NODE,
    UNRELATED,
    VMID,
    WANTED,
    api_args,
    module,
    ours,
    pki,
    run,
    served,
)

__all__ = ["module", "pki", "served"]  # the fault matrix's fixtures: fakepve served in this process

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


def test_state_absent_deletes_every_nvidia_entry_restarts_the_running_ct_and_then_changes_nothing(served, module):
    """A CT with its NVIDIA entries in effect (written, then rebooted into): state=absent deletes each of them and no
    other entry, keeps its features, reboots the running CT so that it runs without them, and a second run changes
    nothing."""
    assert run(module, served)["changed"]
    served.idle()
    assert ours(served.state()["running"]) == WANTED
    features = served.state()["merged"]["features"]

    removed = run(module, served, state="absent", nodes=None)
    served.idle()
    after = served.state()
    assert removed["changed"] and removed["restarted"] and "failed" not in removed
    assert len(removed["deleted"]) == len(WANTED)
    assert ours(after["merged"]) == ours(after["running"]) == set()
    assert {k: v for k, v in after["running"].items() if k in UNRELATED} == UNRELATED
    assert after["merged"]["features"] == features

    again = run(module, served, state="absent", nodes=None)
    assert not again["changed"] and not again["restarted"]
    assert served.state()["reboots"] == after["reboots"]


def test_state_present_without_the_host_nodes_is_refused_before_any_call(served, module):
    args = {**api_args(served), "node": NODE, "vmid": VMID}
    result = collection.main_result(module, args)
    assert result["failed"] and result["msg"] == "state is present but all of the following are missing: nodes"
    assert served.state()["digest"] == served.ct.digest() and not served.pve.tasks
