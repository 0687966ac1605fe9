"""proxmox_lxc_mount and module_utils/lxc_mounts.py: a node directory bind-mounted read-only into a CT as mpN.

The plan is tested alone; the module runs as Ansible starts it against fakepve (PVE's schema, digests, pending
changes and tasks) served in this process, as the devN module's fault matrix does."""

from __future__ import annotations

import pytest

from tests.unit import collection
from tests.unit.plugins.modules.test_proxmox_lxc_gpu_faults import (  # noqa: F401
    NODE,
    VMID,
    Clock,
    Served,
    api_args,
    clocked,
    pki,
)

lm = __import__("ansible_collections.provision.pve_sglang.plugins.module_utils.lxc_mounts", fromlist=["x"])

HOST, CT = "/srv/models/tiny", "/models/tiny"


def test_a_new_mount_takes_the_first_free_slot():
    plan = lm.plan_mount({"mp0": "/srv/a,mp=/a", "mp2": "local:5/vm-1-disk-1.raw,mp=/b"}, HOST, CT)
    assert plan["set"] == {"mp1": f"{HOST},mp={CT},ro=1"}


def test_an_entry_already_there_is_kept_with_the_admins_other_keys():
    plan = lm.plan_mount({"mp3": f"{HOST},mp={CT},backup=0,ro=1"}, HOST, CT)
    assert plan["set"] == {} and plan["key"] == "mp3"


def test_another_source_at_the_same_place_is_replaced_in_its_slot():
    plan = lm.plan_mount({"mp0": "/srv/a,mp=/a", "mp5": f"/srv/old,mp={CT}/"}, HOST, CT)
    assert plan["set"] == {"mp5": f"{HOST},mp={CT},ro=1"} and plan["replaces"] == f"/srv/old,mp={CT}/"


def test_a_writable_mount_of_the_same_directory_is_made_read_only():
    assert lm.plan_mount({"mp0": f"volume={HOST},mp={CT}"}, HOST, CT)["set"] == {"mp0": f"{HOST},mp={CT},ro=1"}


def test_no_free_slot_is_an_error():
    full = {f"mp{n}": f"/srv/{n},mp=/m{n}" for n in range(lm.MAX_MOUNT_POINTS)}
    with pytest.raises(ValueError, match="every mount point slot"):
        lm.plan_mount(full, HOST, CT)


@pytest.fixture
def served(pki):  # noqa: F811
    served = Served(*pki)
    yield served
    served.stop()


@pytest.fixture
def module(monkeypatch):
    return clocked(monkeypatch, "proxmox_lxc_mount", Clock())


def run(module, served, **params):
    return collection.main_result(
        module, {**api_args(served), "node": NODE, "vmid": VMID, "host_path": HOST, "ct_path": CT, **params}
    )


def test_the_mount_is_written_and_a_second_run_changes_nothing(module, served):
    first = run(module, served)
    assert first["changed"] is True and not first.get("failed"), first
    config = served.ct.config
    assert [v for k, v in config.items() if k.startswith("mp") and CT in v] == [f"{HOST},mp={CT},ro=1"]
    assert config["mp0"] == "/srv/models,mp=/models", "the entry that was there is kept"
    again = run(module, served)
    assert again["changed"] is False and again["pending"] is False, again


def test_check_mode_writes_nothing(module, served):
    before = dict(served.ct.config)
    result = run(module, served, _ansible_check_mode=True)
    assert result["changed"] is True and served.ct.config == before


# ---------------------------------------------------------------- check mode predicts what apply does


def outcome(result: dict) -> dict:
    """What a run did, or in check mode would do: the change, the reboot, and the mount left pending."""
    assert not result.get("failed"), result
    return {
        "changed": result["changed"],
        "restart": result.get("restarted") or result.get("would_restart", False),
        "pending": result["pending"],
    }


@pytest.mark.parametrize(
    ("config", "status", "apply_does"),
    [
        # a new mpN on a running CT: PVE hot-plugs it
        ({}, "running", {"changed": True, "restart": False, "pending": False}),
        # an mpN the running CT already holds, changed: it stays pending, and the module reboots the CT
        ({"mp1": f"/srv/old,mp={CT}"}, "running", {"changed": True, "restart": True, "pending": False}),
        # a stopped CT takes the change at once
        ({"mp1": f"/srv/old,mp={CT}"}, "stopped", {"changed": True, "restart": False, "pending": False}),
        # nothing to write, but an earlier change of the entry still pending on the running CT
        (
            {"mp1": f"/srv/old,mp={CT}", "pending": {"mp1": f"{HOST},mp={CT},ro=1"}},
            "running",
            {"changed": True, "restart": True, "pending": False},
        ),
    ],
    ids=["new-entry-hot-plugged", "changed-entry-rebooted", "stopped-ct", "left-pending-earlier"],
)
def test_check_mode_predicts_exactly_what_apply_does(module, served, config, status, apply_does):
    served.ct.config.update({k: v for k, v in config.items() if k != "pending"})
    served.ct.pending.update(config.get("pending", {}))
    served.ct.status = status
    predicted = outcome(run(module, served, _ansible_check_mode=True))
    assert served.reboots() == 0
    done = outcome(run(module, served))
    served.idle()
    assert done == apply_does, "what PVE does (fakepve: LXC/Config.pm vmconfig_hotplug_pending)"
    assert predicted == done, (predicted, done)
    assert served.reboots() == int(apply_does["restart"])


def test_an_empty_api_host_is_one_line_naming_the_variable_and_the_container_is_untouched(module, served):
    """An inventory without proxmox_api_host, run by plain ansible-playbook (the CLI's check is not there to stop it):
    the module names the variable, and the container's config is as it was."""
    before = dict(served.ct.config)
    result = run(module, served, api_host="")
    assert result.get("failed") and "proxmox_api_host is empty or not set" in result["msg"], result
    assert served.ct.config == before
