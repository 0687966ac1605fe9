"""The inventory `provision lab up` writes (provision/lab/lab.py `write_inventory`), loaded as every command loads it
(provision.inventory.load: Ansible's loader, then the inventory checks) without a lab: for `--bare`, the container the
apply is to create and its weights from the lab's hub."""

from __future__ import annotations

from pathlib import Path
from urllib.parse import urlsplit

import pytest

from provision import inventory, secrets
from provision.lab.container import ContainerSpec
from provision.lab.ctbody import TEMPLATE_VOLID, net_index
from provision.lab.hfhub import REPO_ID, tiny_repo

KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIKzKg6h3XvRMiPpGZ2ydPkN1nI7Fq1m0kLQyJ0G9qvPq provision-lab"
TOKEN = "hf_labunittoken0123456789"
HUB = {"url": "http://10.213.1.1:40123", "repo": REPO_ID, "commit": tiny_repo().commit}


@pytest.fixture
def written(tmp_path, monkeypatch):
    """write_inventory for a lab directory with what `lab up` leaves there (client key, hub token, wheelhouse)."""
    from provision.lab.lab import DRIVER_VERSION, Lab

    monkeypatch.setenv("PROVISION_LAB_INVENTORY", str(tmp_path / "inventory" / "lab"))
    lab = Lab(dir=tmp_path / "lab", net_index=1)
    (lab.dir / "wheelhouse" / "bench").mkdir(parents=True)
    (lab.dir / "wheelhouse" / f"NVIDIA-Linux-x86_64-{DRIVER_VERSION}.run").write_text("#!/bin/sh\n")
    Path(f"{lab.client_key}.pub").write_text(KEY + "\n")
    (lab.dir / "hf-token").touch(mode=0o600)
    (lab.dir / "hf-token").write_text(TOKEN + "\n")

    def write(bare: bool) -> Path:
        vms = [
            {"name": "pve-grub", "bootloader": "grub", "port": 2201},
            {"name": "pve-sdboot", "bootloader": "sdboot", "port": 2202},
        ]
        state = {
            "bare": bare,
            "vms": vms,
            "containers": [] if bare else [{"name": "sglang-01", "index": 1}],
            "pve_port": 40000,
            **({"hub": HUB} if bare else {}),
        }
        return lab.write_inventory(state)

    return write


def test_a_bare_lab_has_sglang01_to_create_with_its_weights_from_the_hub(written):
    inv_dir = written(bare=True)
    inv = inventory.load(inv_dir)  # every check of `provision inventory check`, spec and model source included
    assert [h.name for h in inv.gpu_containers] == ["sglang-01"] and inv.warnings == []
    ct = inv.hosts["sglang-01"]
    assert (ct.value("proxmox_host"), ct.value("proxmox_vmid"), ct.value("ansible_user")) == ("pve-grub", 101, "root")
    spec = ct.value("proxmox_ct_spec")
    assert spec["template"] == TEMPLATE_VOLID and spec["ssh_public_keys"] == [KEY]
    # the address the inventory reaches is the link the lab's API gives the CT it creates from this net0
    net0 = ",".join(f"{k}={v}" for k, v in spec["net0"].items())
    link = ContainerSpec(name="sglang-01", index=net_index(net0, set(), lambda index: False, first=1))
    assert ct.value("ansible_host") == link.address
    # the hub is on that link's host side, the address the CT reaches
    assert urlsplit(ct.value("sglang_hf_endpoint")).hostname == link.host_addr == spec["net0"]["gw"]
    assert ct.value("sglang_model_source") == {"type": "huggingface", "repo": REPO_ID, "revision": HUB["commit"]}
    # the token: read from the lab's file on the controller, a secret to every command, in no file of the inventory
    assert inventory.rendered(inv, ct, "sglang_hf_token") == TOKEN
    assert TOKEN in secrets.values(inv)
    assert not [p for p in inv_dir.rglob("*") if p.is_file() and TOKEN in p.read_text()]


def test_a_normal_lab_has_sglang01_as_ct_101_that_exists_with_no_spec_and_no_source(written):
    inv = inventory.load(written(bare=False))
    ct = inv.hosts["sglang-01"]
    assert ct.value("proxmox_vmid") == 101 and ct.value("proxmox_ct_spec") is None
    assert ct.value("sglang_model_source") in (None, {}, "") and ct.value("sglang_hf_endpoint") in (None, "")
    assert ct.value("ansible_user") == "ops"


def test_only_a_bare_lab_pins_the_nodes_driver(written):
    """A normal lab's nodes keep the driver an admin installed, unmanaged; a bare lab's driver phase installs it."""
    from provision.lab.lab import DRIVER_VERSION

    for bare, wanted in ((False, None), (True, DRIVER_VERSION)):
        inv = inventory.load(written(bare=bare))
        assert {inv.hosts[n].value("nvidia_driver_version") for n in ("pve-grub", "pve-sdboot")} == {wanted}, bare
