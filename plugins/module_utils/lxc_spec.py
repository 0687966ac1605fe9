"""The inventory's `proxmox_ct_spec`: what a container that does not exist yet is created from, one rule for all.

Used by the proxmox_lxc_ct module (the create parameters of `POST /nodes/{node}/lxc`, the fields in which an
existing CT differs from the spec, and the change that brings it to the spec where PVE can without a rebuild) and by
`provision inventory check` (the spec's problems, one line each, before any host is contacted). Standard library
only: provision loads this file by path (provision/paths.py module_util).

The create parameters follow PVE's schema for `POST /nodes/{node}/lxc` (pve-docs api-viewer; pve-container
src/PVE/API2/LXC.pm create_vm): `ostemplate`, `rootfs` as `STORAGE:SIZE_IN_GiB` (a new volume of that size),
`memory` and `swap` in MiB, `net0` as `name=eth0,bridge=vmbr0,ip=<cidr>|dhcp[,gw=..][,tag=..]`, `ssh-public-keys`
(root's authorized_keys, written by LXC/Setup.pm), `unprivileged` (1 by default on create), `features`
(`nesting=1`: systemd needs it to sandbox units in an unprivileged CT; LXC/Config.pm), `onboot`, `startup`
(`order=N`).
"""

from __future__ import annotations

import ipaddress
import re

VAR = "proxmox_ct_spec"
TEMPLATE = re.compile(r"^[A-Za-z][A-Za-z0-9._-]*:vztmpl/[^/\s]+\.tar\.(gz|xz|zst)$")
STORAGE = re.compile(r"^[A-Za-z][A-Za-z0-9._-]*$")
LABEL = r"[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?"
HOSTNAME = re.compile(rf"^(?=.{{1,253}}$){LABEL}(\.{LABEL})*$")
BRIDGE = re.compile(r"^[A-Za-z][A-Za-z0-9_.-]{0,15}$")
SHA256 = re.compile(r"^[0-9a-fA-F]{64}$")
SSH_KEY = re.compile(r"^(ssh-(ed25519|rsa|dss)|ecdsa-sha2-nistp\d+|sk-\S+@openssh\.com) [A-Za-z0-9+/=]+( .*)?$")
SIZE = re.compile(r"(?:^|,)size=(\d+(?:\.\d+)?)([KMGT]?)(?:,|$)")
UNITS = {"K": 1 / (1024 * 1024), "M": 1 / 1024, "G": 1, "T": 1024, "": 1 / (1024**3)}

DEFAULTS = {"unprivileged": True, "nesting": True, "onboot": True}
REQUIRED = ("template", "storage", "rootfs_size", "memory", "hostname", "net0", "ssh_public_keys")
NET_KEYS = ("name", "bridge", "ip", "gw", "tag")


def _int(minimum, maximum=None):
    def check(value):
        if isinstance(value, bool) or not isinstance(value, int):
            return "expected an integer"
        if value < minimum or (maximum is not None and value > maximum):
            return f"{value} is out of range {minimum}..{maximum if maximum is not None else ''}".rstrip(".")
        return None

    return check


def _bool(value):
    return None if isinstance(value, bool) else "expected true or false"


def _matching(pattern, expected):
    def check(value):
        return None if isinstance(value, str) and pattern.match(value) else f"expected {expected}"

    return check


def _keys(value):
    lines = key_lines(value)
    if not lines:
        return "expected at least one ssh public key (a string, one key a line, or a list)"
    bad = [i for i, line in enumerate(lines) if not SSH_KEY.match(line) and not templated(line)]
    return f"line {bad[0] + 1} is not an ssh public key (type, base64, comment)" if bad else None


def _net0(value):
    if not isinstance(value, dict):
        return "expected a mapping: bridge, ip (dhcp or an address/prefix), gw, name, tag"
    unknown = sorted(set(value) - set(NET_KEYS))
    if unknown:
        return f"unknown key(s) {', '.join(unknown)}; known: {', '.join(NET_KEYS)}"
    if not isinstance(value.get("bridge"), str) or not BRIDGE.match(value["bridge"]):
        return "bridge: expected a bridge name such as vmbr0"
    ip = value.get("ip")
    if ip != "dhcp":
        try:
            ipaddress.IPv4Interface(ip if isinstance(ip, str) and "/" in ip else "-")
        except ValueError:
            return f"ip: expected dhcp or an IPv4 address with its prefix (10.0.0.5/24), got {ip!r}"
    if "gw" in value:
        if ip == "dhcp":
            return "gw: DHCP gives the gateway; set gw only with a static ip"
        try:
            ipaddress.IPv4Address(value["gw"])
        except ValueError:
            return f"gw: expected an IPv4 address, got {value['gw']!r}"
    if "tag" in value and _int(1, 4094)(value["tag"]):
        return "tag: expected a VLAN id 1..4094"
    return None


CHECKS = {
    "template": _matching(TEMPLATE, "a template volume: STORAGE:vztmpl/NAME.tar.zst (or .tar.gz, .tar.xz)"),
    "template_url": _matching(re.compile(r"^https?://\S+$"), "an http(s) URL of the template"),
    "template_sha256": _matching(SHA256, "the template's sha256 (64 hex digits)"),
    "storage": _matching(STORAGE, "a PVE storage name for the root disk, e.g. local-lvm"),
    "rootfs_size": _int(1, 131072),
    "cores": _int(1, 8192),
    "memory": _int(16),
    "swap": _int(0),
    "hostname": _matching(HOSTNAME, "a DNS host name"),
    "net0": _net0,
    "ssh_public_keys": _keys,
    "unprivileged": _bool,
    "nesting": _bool,
    "onboot": _bool,
    "startup_order": _int(0),
}


def key_lines(value) -> list[str]:
    """ssh_public_keys as a list of non-empty lines (a string with one key a line, or a list of keys)."""
    items = value if isinstance(value, list) else str(value or "").splitlines()
    return [str(line).strip() for line in items if str(line).strip()]


def templated(value) -> bool:
    """A Jinja template (in the inventory, before the run renders it): checked by the module once rendered."""
    return isinstance(value, str) and ("{{" in value or "{%" in value)


def problems(spec) -> list[str]:
    """One message per problem of the spec, each naming its field (`proxmox_ct_spec.memory: ...`); never a value
    of ssh_public_keys (not secret, but long). Templated values are left to the module, which sees them rendered."""
    if templated(spec):
        return []
    if not isinstance(spec, dict):
        return [f"{VAR}: expected a mapping of the container's fields (template, storage, rootfs_size, ...)"]
    found = [f"{VAR}.{name}: missing" for name in REQUIRED if spec.get(name) is None]
    found += [f"{VAR}.{name}: unknown field; known: {', '.join(CHECKS)}" for name in sorted(set(spec) - set(CHECKS))]
    for name, check in CHECKS.items():
        value = spec.get(name)
        message = check(value) if value is not None and not templated(value) else None
        if message:
            found.append(f"{VAR}.{name}: {message}")
    if spec.get("template_url") is not None and spec.get("template_sha256") is None:
        found.append(f"{VAR}.template_sha256: missing (template_url is downloaded only with its checksum)")
    return found


def with_defaults(spec: dict) -> dict:
    return {**DEFAULTS, **{k: v for k, v in spec.items() if v is not None}}


def net0_text(net0: dict) -> str:
    """PVE's net0 string, in PVE's key order."""
    parts = {"name": net0.get("name", "eth0"), "bridge": net0["bridge"], "ip": net0["ip"]}
    parts.update({k: net0[k] for k in ("gw", "tag") if net0.get(k) is not None})
    return ",".join(f"{k}={v}" for k, v in parts.items())


def create_params(spec: dict, vmid: int) -> dict:
    """The body of `POST /nodes/{node}/lxc` for the spec (with its defaults)."""
    s = with_defaults(spec)
    params = {
        "vmid": vmid,
        "ostemplate": s["template"],
        "hostname": s["hostname"],
        "storage": s["storage"],
        "rootfs": f"{s['storage']}:{s['rootfs_size']}",
        "memory": s["memory"],
        "net0": net0_text(s["net0"]),
        "ssh-public-keys": "\n".join(key_lines(s["ssh_public_keys"])) + "\n",
        "unprivileged": int(s["unprivileged"]),
        "onboot": int(s["onboot"]),
    }
    params.update({k: s[k] for k in ("cores", "swap") if k in s})
    if s["nesting"]:
        params["features"] = "nesting=1"
    if "startup_order" in s:
        params["startup"] = f"order={s['startup_order']}"
    return params


def _props(text) -> dict:
    return dict(part.partition("=")[::2] for part in str(text or "").split(",") if "=" in part)


def rootfs_gib(rootfs) -> float | None:
    """The size of a config's rootfs (`local-lvm:vm-101-disk-0,size=8G`) in GiB, None when it names none."""
    match = SIZE.search(str(rootfs or ""))
    return float(match.group(1)) * UNITS[match.group(2)] if match else None


def actual_fields(config: dict) -> dict:
    """The spec's fields as an existing CT's config has them (None: not set there, PVE's default applies)."""
    net = _props(config.get("net0"))
    rootfs = str(config.get("rootfs") or "")
    size = rootfs_gib(rootfs)
    order = re.search(r"(?:^|,)order=(\d+)", str(config.get("startup") or ""))
    return {
        "hostname": config.get("hostname"),
        "storage": rootfs.split(":", 1)[0] if ":" in rootfs else None,
        "rootfs_size": (int(size) if size is not None and size == int(size) else size),
        "cores": _as_int(config.get("cores")),
        "memory": _as_int(config.get("memory")),
        "swap": _as_int(config.get("swap")),
        "unprivileged": str(config.get("unprivileged", "0")) == "1",
        "nesting": _props(config.get("features")).get("nesting") == "1",
        "onboot": str(config.get("onboot", "0")) == "1",
        "startup_order": int(order.group(1)) if order else None,
        "net0": {k: net[k] for k in NET_KEYS if k in net} or None,
    }


def _as_int(value):
    try:
        return int(value)
    except (TypeError, ValueError):
        return value


def differences(spec: dict, config: dict) -> list[tuple[str, object, object]]:
    """(field, spec's value, the CT's value) for each field in which an existing CT differs from the spec. The
    template is not compared: a created CT keeps no record of it."""
    s, actual = with_defaults(spec), actual_fields(config)
    found = []
    for name in (
        "hostname",
        "storage",
        "rootfs_size",
        "cores",
        "memory",
        "swap",
        "unprivileged",
        "nesting",
        "onboot",
        "startup_order",
    ):
        if name in s and s[name] != actual[name]:
            found.append((name, s[name], actual[name]))
    if "net0" in s:
        want = {"name": "eth0", **{k: str(v) for k, v in s["net0"].items()}}
        have = actual["net0"] or {}
        if any(have.get(k) != v for k, v in want.items()):
            found.append(("net0", net0_text(s["net0"]), config.get("net0")))
    return found


def difference_text(found: list[tuple[str, object, object]]) -> str:
    """`memory 4096 (spec) vs 2048 (actual); nesting True (spec) vs False (actual)`."""
    return "; ".join(
        f"{name} {want} (spec) vs {'unset' if have is None else have} (actual)" for name, want, have in found
    )


# what an existing CT is changed in through `PUT config` (each PVE applies to a running CT, or leaves pending until it
# restarts) and `PUT resize` (the root disk grows; PVE never shrinks one); the rest needs a new CT (`KEPT`)
CONFIG_FIELDS = ("hostname", "cores", "memory", "swap", "nesting", "onboot", "startup_order", "net0")
KEPT = {
    "storage": "moving the root disk is not a spec change",
    "unprivileged": "a CT is made privileged or not when it is created",
}
# what PVE applies to a running CT at once and would cut from under what it serves: less memory or swap (reclaim, the
# OOM killer), another net0 (its veth re-plugged, its address changed): on a running CT only when allowed
DISRUPTIVE = {
    "memory": "less memory on a running CT is taken from what it runs (reclaim, the OOM killer)",
    "swap": "less swap on a running CT is taken from what it runs",
    "net0": "another net0 re-plugs a running CT's network and drops its connections",
}


def update(spec: dict, config: dict, running: bool = False, disruptive: bool = False) -> dict:
    """How an existing CT comes to the spec: `config`, the `PUT config` body (keys PVE keeps that the spec does not
    name, such as net0's hwaddr and the other `features` flags, kept); `resize`, the root disk's new size (`"16G"`)
    or None; `kept`, (field, spec, actual, why) for what is left as it is: what needs a new CT, a smaller disk, and on
    a `running` CT what would disrupt it (less memory or swap, another net0) unless `disruptive`."""
    s, found = with_defaults(spec), differences(spec, config)
    body, resize, kept = {}, None, []
    for name, want, have in found:
        if running and _cuts(name, want, have) and not disruptive:
            kept.append((name, want, have, DISRUPTIVE[name] + ": set proxmox_ct_disruptive_changes=true, or stop it"))
        elif name in CONFIG_FIELDS:
            body.update(_config_value(name, s, config))
        elif name == "rootfs_size" and have is not None and want > have:
            resize = f"{want}G"
        elif name == "rootfs_size":
            kept.append((name, want, have, "a root disk is never shrunk"))
        else:
            kept.append((name, want, have, KEPT[name]))
    return {"config": body, "resize": resize, "kept": kept}


def _cuts(name: str, want, have) -> bool:
    """Whether the change of this field would disrupt a running CT (DISRUPTIVE); PVE's default memory and swap is
    512 MiB where the config sets none."""
    if name == "net0":
        return True
    return name in DISRUPTIVE and want < (have if isinstance(have, int) else 512)


def _config_value(name: str, s: dict, config: dict) -> dict:
    """One field's `PUT config` entry."""
    if name == "nesting":
        flags = _props(config.get("features"))
        flags["nesting"] = "1" if s["nesting"] else "0"
        return {"features": ",".join(f"{k}={v}" for k, v in flags.items())}
    if name == "onboot":
        return {"onboot": int(s["onboot"])}
    if name == "startup_order":
        startup = {k: v for k, v in _props(config.get("startup")).items() if k != "order"}
        return {"startup": ",".join([f"order={s['startup_order']}", *(f"{k}={v}" for k, v in startup.items())])}
    if name == "net0":
        return {"net0": _net0_value(s["net0"], _props(config.get("net0")))}
    return {name: s[name]}


def _net0_value(want: dict, have: dict) -> str:
    """net0 as the spec says, with what the CT has that the spec does not name (hwaddr, type, a gw or tag set by
    hand) kept; a gateway goes with a static address only."""
    kept = {k: v for k, v in have.items() if k not in want and k != "name"}
    if str(want.get("ip", "")) == "dhcp":
        kept.pop("gw", None)
    return ",".join([net0_text(want), *(f"{k}={v}" for k, v in kept.items())])
