"""Inventory values for what an apply makes in the lab, one rule each: the `proxmox_ct_spec` of a CT the lab's API
creates (`ctbody.py`), and a Hugging Face `sglang_model_source` served by the lab's hub (`hfhub.py`).

`provision lab up --bare` writes both for sglang-01 (`Lab.write_inventory`); tests/lab/test_ct_create.py and
tests/lab/test_weights.py build theirs with the same functions.
"""

from __future__ import annotations

from typing import Any

from provision.lab.container import WHEELHOUSE_IN_CONTAINER, ContainerSpec
from provision.lab.ctbody import TEMPLATE_VOLID

# where a hub model source puts the weights in the CT (sglang_model_path)
HUB_MODEL_PATH = "/opt/models/lab-tiny"
# the Hugging Face client's wheels for the service venv (which holds the SGLang stand-in, not SGLang): the bench set
BENCH_WHEELS_IN_CONTAINER = f"{WHEELHOUSE_IN_CONTAINER}/bench"


def static_net0(index: int) -> dict[str, str]:
    """net0 on the lab link `index`: the address an inventory can name before the CT exists (docs/lab.md)."""
    link = ContainerSpec(name="", index=index)
    return {"bridge": "vmbr0", "ip": f"{link.address}/30", "gw": link.host_addr}


def ct_spec(public_key: str, index: int, hostname: str, **fields: Any) -> dict[str, Any]:
    """A `proxmox_ct_spec` the lab's API can create: its one template, a static net0 on link `index`, root's
    ssh key `public_key` (the lab's client key, so the controller reaches the new CT as root). `fields` replace
    any of the defaults (memory, cores, ...)."""
    return {
        "template": TEMPLATE_VOLID,
        "storage": "local-lvm",
        "rootfs_size": 8,
        "cores": 2,
        "memory": 3072,
        "swap": 512,
        "hostname": hostname,
        "net0": static_net0(index),
        "ssh_public_keys": [public_key],
        "startup_order": 2,
        **fields,
    }


def hub_model_vars(hub: dict[str, str], token: str, model_path: str = HUB_MODEL_PATH) -> dict[str, Any]:
    """The sglang role's variables for the lab hub's repo at its commit (`hub`: what `Lab.start_hf_hub` returns,
    url, repo and commit). `token` is how the inventory reads the token (a lookup), never the token itself."""
    return {
        "sglang_model_path": model_path,
        "sglang_model_source": {"type": "huggingface", "repo": hub["repo"], "revision": hub["commit"]},
        "sglang_hf_token": token,
        "sglang_hf_endpoint": hub["url"],
        "sglang_hf_pip_find_links": BENCH_WHEELS_IN_CONTAINER,
    }
