"""Pure logic for passing NVIDIA device nodes into an LXC container as PVE devN entries.

PVE's format: `devN: [path=]<path>[,deny-write=<1|0>][,gid=<int>][,mode=<0NNN>][,uid=<int>]`, N in
0..255; the path must be a char or block device under /dev (no directories, no /./ or /../).
"""

from __future__ import annotations

import re

MAX_DEVICES = 256
_GPU = re.compile(r"^/dev/nvidia(\d+)$")
# the nodes every CUDA process opens besides its GPUs'
CUDA_NODES = ("/dev/nvidiactl", "/dev/nvidia-uvm")
# the nvidia-modprobe call that makes each (nvidia-modprobe.c: nvidiactl is minor 255; -u -c 0 makes the uvm nodes)
MAKES = {"/dev/nvidiactl": "nvidia-modprobe -c 255", "/dev/nvidia-uvm": "nvidia-modprobe -u -c 0"}
SHARED_NODES = (*CUDA_NODES, "/dev/nvidia-uvm-tools", "/dev/nvidia-modeset")


class DeviceError(ValueError):
    pass


def gpu_index(path: str) -> int | None:
    """N of a GPU's device node, /dev/nvidiaN; None for any other path (nvidiactl, nvidia-uvm, nvidia-caps/...)."""
    m = _GPU.match(str(path))
    return int(m.group(1)) if m else None


def is_gpu_node(path: str) -> bool:
    """The one rule for "is a GPU's device node" (the gpu_device_node Jinja test, verify, the modules)."""
    return gpu_index(path) is not None


def is_cuda_node(path: str) -> bool:
    """A node a CUDA process opens: a GPU's, nvidiactl or nvidia-uvm."""
    return is_gpu_node(path) or str(path) in CUDA_NODES


def parse_entry(value: str) -> dict:
    """'/dev/nvidia0,mode=0666' or 'path=/dev/nvidia0,mode=0666' -> {'path': ..., 'mode': ...}."""
    out: dict = {}
    for i, part in enumerate(value.split(",")):
        if "=" in part:
            k, v = part.split("=", 1)
            out[k.strip()] = v.strip()
        elif i == 0:
            out["path"] = part.strip()
    return out


def format_entry(entry: dict) -> str:
    parts = [entry["path"]]
    for k in ("deny-write", "gid", "mode", "uid"):
        if entry.get(k) not in (None, ""):
            parts.append(f"{k}={entry[k]}")
    return ",".join(parts)


def validate_path(path: str) -> None:
    # PVE's verify_lxc_dev_string; fakepve misses the /../ case, so check here as well
    if not path.startswith("/dev/") or "/./" in path or "/../" in path or path.endswith(("/.", "/..")):
        raise DeviceError(f"{path}: a device path must be under /dev/ without /./ or /../")


def device_nodes(nodes: list[dict]) -> list[dict]:
    """The device nodes among the host's /dev/nvidia* entries (each path checked); an entry a GPU or CUDA needs
    that is not one is refused."""
    for n in nodes:
        validate_path(n["path"])
        if n.get("type") not in ("char", "block") and (is_gpu_node(n["path"]) or n["path"] in CUDA_NODES):
            raise DeviceError(f"{n['path']}: PVE only passes device nodes, not a {n.get('type') or 'this'}")
    return [n for n in nodes if n.get("type") in ("char", "block")]


def select_nodes(nodes: list[dict], gpus) -> list[dict]:
    """The host's NVIDIA nodes this container gets: the chosen GPUs plus every shared node and cap.

    nodes: [{'path', 'type': 'char'|'block'|'dir'|'link'|..., 'mode': '0666'}] from the host. What is not a
    device node (a symlink udev or an admin made, a directory) is not passed, unless a GPU or CUDA needs its
    path: PVE passes only device nodes (LXC/Tools.pm get_device_mode_and_rdev).
    gpus: 'all' or a list of GPU indices (the N of /dev/nvidiaN).
    """
    by_path = {n["path"]: n for n in device_nodes(nodes)}
    present = sorted(gpu_index(p) for p in by_path if is_gpu_node(p))
    chosen = _chosen_gpus(present, gpus)
    for required in CUDA_NODES:
        if required not in by_path:
            raise DeviceError(f"{required} is missing on the host; CUDA needs it ({MAKES[required]} makes it)")
    selected = [by_path[f"/dev/nvidia{g}"] for g in chosen]
    selected += [by_path[p] for p in SHARED_NODES if p in by_path]
    selected += sorted((n for p, n in by_path.items() if p.startswith("/dev/nvidia-caps/")), key=lambda n: n["path"])
    return selected


def _chosen_gpus(present: list[int], gpus) -> list[int]:
    """The GPU indices `gpus` ('all' or a list) names, each of them on the host."""
    if not present:
        raise DeviceError("no /dev/nvidiaN GPU node on the host: is the NVIDIA driver loaded?")
    if gpus == "all":
        return present
    chosen = sorted({int(g) for g in gpus})
    missing = [g for g in chosen if g not in present]
    if missing:
        raise DeviceError(f"GPU(s) {missing} asked for, but the host has /dev/nvidia{present}")
    return chosen


def desired_entries(selected: list[dict], mode: str | None, uid: int | None, gid: int | None) -> dict[str, dict]:
    """path -> entry. GPU and shared nodes get `mode`; nvidia-caps nodes keep the host's mode
    (cap1, MIG config, is root-only on the host and stays so)."""
    out = {}
    for node in selected:
        node_mode = node.get("mode") if node["path"].startswith("/dev/nvidia-caps/") else mode
        out[node["path"]] = {
            "path": node["path"],
            "mode": node_mode,
            "uid": None if uid is None else str(uid),
            "gid": None if gid is None else str(gid),
        }
    return out


def is_ours(path: str) -> bool:
    return path.startswith("/dev/nvidia")


def plan(config: dict, wanted: dict[str, dict]) -> dict:
    """Compare a container config with the wanted entries.

    Returns {'set': {devN: value}, 'delete': [devN], 'before': {devN: value}, 'after': {devN: value}}.
    Entries for other paths (and every mpN, netN ...) are left alone; ours keep their slot when present,
    new ones take the lowest free slots; NVIDIA GPU entries no longer wanted are deleted.
    """
    current = {k: v for k, v in config.items() if re.fullmatch(r"dev\d+", k)}
    by_path: dict[str, str] = {}
    for key, value in sorted(current.items(), key=lambda kv: int(kv[0][3:])):
        by_path.setdefault(parse_entry(value).get("path", ""), key)
    to_delete: list[str] = []
    for key, value in current.items():
        path = parse_entry(value).get("path", "")
        if is_ours(path) and (path not in wanted or by_path.get(path) != key):
            to_delete.append(key)  # deselected GPU, or a duplicate entry for the same node
    to_set = _entries_to_set(current, wanted, by_path, to_delete)
    after = {k: v for k, v in current.items() if k not in to_delete}
    after.update(to_set)
    return {"set": to_set, "delete": sorted(to_delete, key=lambda k: int(k[3:])), "before": current, "after": after}


def _entries_to_set(current: dict, wanted: dict[str, dict], by_path: dict[str, str], to_delete: list[str]) -> dict:
    """devN -> value for the wanted entries that are missing or differ: in their own slot when they have one that
    stays, else in the lowest free slot."""
    to_set: dict[str, str] = {}
    used = set(current)  # never reuse a slot deleted in the same PUT: PVE refuses set+delete of one key
    free = (f"dev{i}" for i in range(MAX_DEVICES) if f"dev{i}" not in used)
    for path, entry in wanted.items():
        value = format_entry(entry)
        key = by_path.get(path)
        if key is not None and key not in to_delete:
            if current[key] != value and parse_entry(current[key]) != parse_entry(value):
                to_set[key] = value
            continue
        try:
            key = next(free)
        except StopIteration:
            raise DeviceError("no free devN slot left (PVE allows dev0..dev255)") from None
        to_set[key] = value
    return to_set
