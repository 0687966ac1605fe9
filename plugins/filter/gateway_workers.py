"""Jinja filter: the workers a gateway fronts, and their URLs (plugins/module_utils/gateway_workers.py)."""

from __future__ import annotations

from pathlib import Path

import yaml
from ansible.errors import AnsibleFilterError
from ansible_collections.provision.pve_sglang.plugins.module_utils.gateway_workers import (
    WORKER_VARS,
    WorkerError,
    listed,
    not_ready,
    outage,
    pairs,
    workers,
)

# the sglang role's defaults, for what a worker's inventory leaves to them (its port, its listening address)
SGLANG_DEFAULTS = Path(__file__).resolve().parents[2] / "roles" / "sglang" / "defaults" / "main.yml"
HOST_VARS = ("ansible_host", "sglang_gateway_worker_url")


def _values(hostvars, name: str, defaults: dict) -> dict:
    host = hostvars[name]
    return {key: host[key] if key in host else defaults.get(key) for key in (*WORKER_VARS, *HOST_VARS)}


def gateway_workers(names, hostvars, gateway, model=""):
    """`groups['gpu_containers'] | provision.pve_sglang.gateway_workers(hostvars, inventory_hostname, model)`
    -> [{host, url, model}]; a worker that cannot be fronted fails the task with one line naming it."""
    defaults = yaml.safe_load(SGLANG_DEFAULTS.read_text())
    try:
        return workers(gateway, {name: _values(hostvars, name, defaults) for name in names or []}, model or "")
    except WorkerError as e:
        raise AnsibleFilterError(str(e)) from None


def gateway_pairs(leaving, hostvars, groups):
    """`[container, ...] | provision.pve_sglang.gateway_pairs(hostvars, groups)` -> [{host, gateway, url}]: each of
    these hosts of gpu_containers with each host of sglang_gateways that fronts it, and the URL it reaches it at."""
    if isinstance(leaving, str):
        leaving = [leaving]
    gateways = {g: hostvars[g].get("sglang_gateway_model") or "" for g in groups.get("sglang_gateways") or []}
    if not gateways:
        return []
    defaults = yaml.safe_load(SGLANG_DEFAULTS.read_text())
    names = groups.get("gpu_containers") or []
    try:
        return pairs(list(leaving), gateways, {name: _values(hostvars, name, defaults) for name in names})
    except WorkerError as e:
        raise AnsibleFilterError(str(e)) from None


class FilterModule:
    def filters(self):
        # fronted | provision.pve_sglang.gateway_not_ready(listed) -> ["sglang-02 http://10.0.0.12:30000 (not ready)"]
        return {
            "gateway_workers": gateway_workers,
            "gateway_not_ready": not_ready,
            "gateway_pairs": gateway_pairs,
            # sglang_gateway_info's results over a worker's gateways | provision.pve_sglang.gateway_lists -> true
            "gateway_lists": listed,
            # results over gateway names | provision.pve_sglang.gateway_outage(pairs)
            #   -> ["gateway sglang-gw (model lab-standin): sglang-01"]
            "gateway_outage": outage,
        }
