"""A node directory bind-mounted read-only into an LXC container as an `mpN` entry: the entry, and the plan from
the container's config. Pure functions; plugins/modules/proxmox_lxc_mount.py writes the plan through the API.

Facts from pve-container (src/PVE, 94f5585):
- `mp[n]: [volume=]<path>,mp=<path in the CT>[,ro=<1|0>][,backup=..]...`, n in 0..255 (LXC/Config.pm
  $MAX_MOUNT_POINTS = 256, the `mp` and `ro` keys of the mount point format);
- a volume that is an absolute path is a bind mount; only root@pam may set one ("mount point type bind is only
  allowed for root@pam", LXC.pm check_ct_modify_config_perm), so an API token is refused;
- a *new* mpN on a running CT is hot-plugged (LXC/Config.pm vmconfig_hotplug_pending, since pve-container 4.2-3,
  so on PVE 8 and 9 alike); a changed one stays pending until the CT restarts ("don't try to hotplug over
  existing mp"); a bind source that is not a directory fails the hotplug ("directory '…' does not exist",
  LXC.pm mountpoint_mount) and the API writes nothing (API2/LXC/Config.pm: "don't write to config if we get any
  errors").
"""

from __future__ import annotations

import re

MP_KEY = re.compile(r"^mp(\d+)$")
MAX_MOUNT_POINTS = 256


def parse_mp(value: str) -> dict:
    """An mpN value as a dict: `volume` (the first item, `volume=` optional) and its other keys."""
    parts = [p for p in str(value or "").split(",") if p]
    out = {}
    for i, part in enumerate(parts):
        if "=" in part:
            key, val = part.split("=", 1)
            out[key] = val
        elif i == 0:
            out["volume"] = part
    return out


def bind_value(host_path: str, ct_path: str) -> str:
    return f"{host_path},mp={ct_path},ro=1"


def matches(value: str, host_path: str, ct_path: str) -> bool:
    """Whether an entry is this read-only bind mount (other keys, such as backup=0, left to the admin)."""
    mp = parse_mp(value)
    return mp.get("volume") == host_path and mp.get("mp") == ct_path and mp.get("ro") == "1"


def entries(config: dict) -> dict:
    return {k: v for k, v in config.items() if MP_KEY.match(k)}


def plan_mount(config: dict, host_path: str, ct_path: str) -> dict:
    """What to write so that `config` mounts host_path at ct_path read-only: {key, value, set}; `set` is {} when
    an entry already does. The entry that mounts something at ct_path is the one replaced (two sources at one
    place cannot both be mounted); else the first free slot."""
    mps = entries(config)
    for key, value in sorted(mps.items(), key=lambda kv: int(kv[0][2:])):
        if matches(value, host_path, ct_path):
            return {"key": key, "value": value, "set": {}}
    at_path = [k for k, v in mps.items() if parse_mp(v).get("mp", "").rstrip("/") == ct_path.rstrip("/")]
    key = at_path[0] if at_path else first_free(mps)
    value = bind_value(host_path, ct_path)
    return {"key": key, "value": value, "set": {key: value}, "replaces": mps.get(key)}


def first_free(mps: dict) -> str:
    used = {int(MP_KEY.match(k).group(1)) for k in mps}
    for n in range(MAX_MOUNT_POINTS):
        if n not in used:
            return f"mp{n}"
    raise ValueError(f"every mount point slot (mp0..mp{MAX_MOUNT_POINTS - 1}) is taken")


def in_effect(running: dict, host_path: str, ct_path: str) -> bool:
    """Whether the running config (GET config with current=1) has the mount."""
    return any(matches(v, host_path, ct_path) for v in entries(running).values())


def running_after_write(running: dict, plan: dict, ct_running: bool) -> dict:
    """The running config (GET config with current=1) that a PUT of plan["set"] leaves, by PVE's rule: a stopped CT
    takes the change into its config at once (API2/LXC/Config.pm update_vm: vmconfig_apply_pending); a running one
    hot-plugs an mpN that its running config does not hold and keeps a changed one pending (LXC/Config.pm
    vmconfig_hotplug_pending: "don't try to hotplug over existing mp"). What check mode predicts the write does."""
    if not plan["set"] or (ct_running and plan["key"] in running):
        return running
    return {**running, **plan["set"]}
