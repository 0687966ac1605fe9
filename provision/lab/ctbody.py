"""The lab's PVE drives each container's body: what pve-container does on the node around a CT.

Runs inside the fakepve process (`provision/lab/pve.py`), which calls it from every CT task and from the
devN part of a config change. What it copies, with the source in pve-container 6.x:

- **start** (vzstart, vzreboot, and `startall` when a node boots): the prestart hook `stat`s every devN
  path on the node and dies "Could not get mode or device ID of <path>" when one is missing; otherwise it
  makes each node inside the CT with the node's major and minor and the entry's mode (0660 when absent), uid
  and gid (src/lxc-pve-prestart-hook l.154-220, LXC.pm create_passthrough_device_node). The body is the
  nspawn container (`container.py`), started fresh with those nodes and, without `features: nesting=1`,
  with systemd's per-unit namespaces refused.
- **stop, shutdown**: the body stops. A reboot is a stop and a start.
- **a devN PUT**: the path must exist on the node: HTTP 500 "Device <path> does not exist"
  (LXC/Tools.pm get_device_mode_and_rdev).
- **hot-plug**: PVE 9 makes a new devN's node inside a running CT at once; edits and deletes, and on PVE 8
  every devN change, wait for the next start (LXC/Config.pm vmconfig_hotplug_pending; changelog 6.0.4). The node's
  /proc/driver, copied into the body at start (the CT shares its node's kernel), is copied again at a hot-plug: a
  driver the node loaded after the CT started shows inside from then on (on PVE, at once).
- **create** (`POST /nodes/{node}/lxc`, vzcreate): a new body from the lab's image, the one OS template the lab's
  storage holds (`TEMPLATE_VOLID`); inside it what LXC/Setup.pm post_create_hook writes: root's authorized_keys from
  `ssh-public-keys` and fresh ssh host keys (`LabContainer.post_create`). Its `net0` gets the next free lab link
  (`net_index`). Created stopped; `start=1` starts it in a task of its own once the create is done (API2/LXC.pm
  create_vm calls Status->vm_start after the create's lock, and fork_worker answers at once). The node gets a copy of
  the new CT's ssh host public keys under `/var/lib/lab/pct/<vmid>/rootfs` (`PCT_COPY`), which the nodes' `pct` stand-in
  (overlay/common/usr/sbin/pct) serves to `pct exec <vmid> -- cat ...`: on PVE the CT's root is on its node, here on
  the lab's host. The copy is the create's: a key changed inside the CT later is not in it.
- **destroy** (vzdestroy): PVE refuses a running CT ("unable to destroy CT <vmid> - container is running", API2/LXC.pm
  destroy_vm; fakepve has it); once the config is gone the body goes too (`LabContainer.destroy`).
"""

from __future__ import annotations

import asyncio
import io
import json
import re
import shlex
import tarfile
from collections.abc import Callable
from pathlib import Path

from provision.lab.container import ContainerSpec, LabContainer

DEV_KEY = re.compile(r"dev\d+")
DEFAULT_DEV_MODE = 0o660  # LXC.pm: a devN entry without mode= gets 0660
# the lab's image as the OS template on the nodes' `local` storage: the one a create may name
TEMPLATE_VOLID = "local:vztmpl/debian-12-standard_12.7-1_amd64.tar.zst"
# the bodies created through the API, for `provision lab status` and `lab down` (another process): vmid -> record
CREATED_FILE = "pve-created.json"
# a CT's link is 10.213.<index>.0/30, its address .2 (ContainerSpec): a static net0 must be one of those
LAB_ADDRESS = re.compile(r"10\.213\.(\d{1,3})\.2/30")
LAST_INDEX = 255
# where a node's `pct` stand-in finds a created CT's files (overlay/common/usr/sbin/pct COPY)
PCT_COPY = "/var/lib/lab/pct/{vmid}/rootfs"


def parse_dev(value: str) -> dict:
    """'/dev/nvidia0,mode=0666,uid=0' or 'path=/dev/...' -> {path, mode, uid, gid} (PVE's devN format)."""
    out: dict = {"mode": DEFAULT_DEV_MODE, "uid": 0, "gid": 0}
    for i, part in enumerate(str(value).split(",")):
        key, sep, val = part.partition("=")
        if not sep and i == 0:
            out["path"] = part.strip()
        elif key.strip() == "path":
            out["path"] = val.strip()
        elif key.strip() == "mode":
            out["mode"] = int(val, 8)
        elif key.strip() in ("uid", "gid"):
            out[key.strip()] = int(val)
    return out


def has_nesting(config: dict) -> bool:
    features = dict(part.partition("=")[::2] for part in str(config.get("features", "")).split(",") if part)
    return features.get("nesting") == "1"


def pve_major(version: str) -> int:
    return int(str(version).split(".")[0])


def net_index(net0: str | None, taken: set[int], in_use: Callable[[int], bool], first: int) -> int:
    """The lab link a created CT's net0 gets: with `ip=dhcp` (or none) the lowest index from `first` that neither this
    lab's bodies (`taken`) nor anything else on this machine (`in_use`: another lab's namespace or link) holds; with
    a static `ip=` the index it names, which must be one of the lab's (10.213.<n>.2/30, gw 10.213.<n>.1)."""
    props = dict(part.partition("=")[::2] for part in str(net0 or "").split(",") if "=" in part)
    ip = props.get("ip", "dhcp")
    if ip not in ("dhcp", "manual", ""):
        match = LAB_ADDRESS.fullmatch(ip)
        if match is None or not 1 <= int(match.group(1)) <= LAST_INDEX:
            raise ValueError(f"net0 ip={ip}: the lab's links are 10.213.<n>.2/30 (gw 10.213.<n>.1), or ip=dhcp")
        index = int(match.group(1))
        if index in taken or in_use(index):
            raise ValueError(f"net0 ip={ip}: the lab's link 10.213.{index}.0/30 is taken")
        return index
    for index in range(max(first, 1), LAST_INDEX + 1):
        if index not in taken and not in_use(index):
            return index
    raise ValueError("no free lab link left (10.213.<n>.0/30)")


def parse_node_read(text: str) -> tuple[dict[str, tuple[int, int] | None], str | None, str | None]:
    """`ok|<major hex>|<minor hex>|<stat %F>|<path>` or `missing|-|-|-|<path>` lines, then the version file, then
    the node's /proc/cmdline (a CT shares its node's kernel, so its /proc/cmdline is the node's)."""
    text, _, cmdline = text.partition("--- cmdline\n")
    lines, _, version = text.partition("--- version\n")
    found: dict[str, tuple[int, int] | None] = {}
    for line in lines.splitlines():
        state, major, minor, kind, path = line.split("|", 4)
        found[path] = (int(major, 16), int(minor, 16)) if state == "ok" and kind.endswith("special file") else None
    return found, (version or None), (cmdline or None)


def device(entry: dict, rdev: tuple[int, int]) -> dict:
    """The node to make inside the CT: the node's major and minor, the entry's mode, uid and gid."""
    return dict(
        name=entry["path"].removeprefix("/dev/"),
        major=rdev[0],
        minor=rdev[1],
        mode=entry["mode"],
        uid=entry["uid"],
        gid=entry["gid"],
    )


def generation(ct) -> tuple:
    """Which API start the CT is in: fakepve gives each start a new pid and start time."""
    return (ct.pid, getattr(ct, "started_at", None))


NODE_READS_AT_ONCE = 4  # the lab's ssh reads of one node in flight (Bodies.node_slots)


class StartRefused(Exception):
    """The prestart hook refused the start (PVE's task error text)."""


class Bodies:
    """vmid -> the nspawn container behind it, and the node reads that its lifecycle needs."""

    def __init__(self, seed: dict, state_dir: Path | None = None):
        self.node_ssh: dict[str, list[str]] = seed.get("node_ssh", {})
        self.bodies: dict[int, LabContainer] = {
            int(vmid): LabContainer.from_record(record) for vmid, record in seed.get("bodies", {}).items()
        }
        # what a created body is made from: the image, binds and client key of the seeded ones, a directory for it
        self.template: dict = seed.get("create", {})
        self.created_file = state_dir / CREATED_FILE if state_dir else None
        self.created: dict[int, LabContainer] = {}
        self.running_generation: dict[int, object] = {}
        self.copied_to: dict[int, str] = {}  # vmid -> the node holding its files for `pct` (PCT_COPY)
        self.locks: dict[int, asyncio.Lock] = {}
        # PVE's prestart hook reads the node locally; the lab reads it over ssh, a few at a time per node, so that
        # starting many CTs at once stays within the node's sshd MaxStartups (default 10:30:100), as a real node's
        self.node_slots: dict[str, asyncio.Semaphore] = {}

    async def node_read(self, node: str, paths: list[str]) -> tuple[dict[str, tuple[int, int] | None], str | None]:
        """Each path's (major, minor) on the node, None when missing, and the node's /proc/driver/nvidia/version."""
        script = (
            'for p in "$@"; do if s=$(stat -L -c "%t|%T|%F" -- "$p" 2>/dev/null); then echo "ok|$s|$p"; '
            'else echo "missing|-|-|-|$p"; fi; done; echo "--- version"; '
            "cat /proc/driver/nvidia/version 2>/dev/null; echo '--- cmdline'; cat /proc/cmdline; true"
        )
        argv = [*self.node_ssh[node], " ".join(shlex.quote(a) for a in ["sh", "-c", script, "sh", *paths])]
        async with self.node_slots.setdefault(node, asyncio.Semaphore(NODE_READS_AT_ONCE)):
            proc = await asyncio.create_subprocess_exec(
                *argv, stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
            )
            out, err = await asyncio.wait_for(proc.communicate(), timeout=60)
        if proc.returncode != 0:
            raise StartRefused(f"node {node} did not answer: {err.decode(errors='replace').strip()[-200:]}")
        return parse_node_read(out.decode())

    async def prestart(self, ct) -> tuple[list[dict], str | None, str | None]:
        """The devices the CT starts with, as the prestart hook makes them (StartRefused when a path is missing), and
        the node's driver version file and kernel command line."""
        entries = [parse_dev(v) for k, v in sorted(ct.config.items()) if DEV_KEY.fullmatch(k)]
        found, version, cmdline = await self.node_read(ct.node, [e["path"] for e in entries])
        devices = []
        for entry in entries:
            rdev = found.get(entry["path"])
            if rdev is None:
                raise StartRefused(f"Could not get mode or device ID of {entry['path']}")
            devices.append(device(entry, rdev))
        return devices, version, cmdline

    async def check_device(self, node: str, values: dict) -> str | None:
        """For a devN PUT: the first path that does not exist on the node, else None."""
        paths = [parse_dev(v)["path"] for k, v in values.items() if DEV_KEY.fullmatch(k) and v is not None]
        if not paths:
            return None
        found, _, _ = await self.node_read(node, paths)
        return next((p for p in paths if found.get(p) is None), None)

    async def settle(self, ct) -> None:
        """Make the body what the API says: running (a fresh start for each API start) or stopped."""
        body = self.bodies.get(ct.vmid)
        if body is None:
            return
        async with self.locks.setdefault(ct.vmid, asyncio.Lock()):
            if ct.status != "running":
                self.running_generation.pop(ct.vmid, None)
                await asyncio.to_thread(body.stop)
                return
            if self.running_generation.get(ct.vmid) == generation(ct) and body.is_running():
                return
            try:
                devices, version, cmdline = await self.prestart(ct)
            except StartRefused:
                await asyncio.to_thread(body.stop)
                self.running_generation.pop(ct.vmid, None)
                raise
            await asyncio.to_thread(body.stop)
            body.configure(devices, has_nesting(ct.config), version, cmdline)
            await asyncio.to_thread(body.start)
            self.running_generation[ct.vmid] = generation(ct)

    async def hotplug(self, ct, keys: list[str]) -> None:
        """PVE 9: the nodes of devN entries just added to a running CT's config appear inside it. The same read of the
        node refreshes the CT's copy of the node's /proc/driver: one kernel, so a module the node loaded after the CT
        started (a driver installed by the apply that created the CT) is the CT's as well."""
        body = self.bodies.get(ct.vmid)
        if body is None or ct.status != "running" or not keys:
            return
        entries = [parse_dev(ct.config[k]) for k in keys]
        found, version, _ = await self.node_read(ct.node, [e["path"] for e in entries])
        async with self.locks.setdefault(ct.vmid, asyncio.Lock()):
            await asyncio.to_thread(body.show_node_driver, version)
            for entry in entries:
                rdev = found.get(entry["path"])
                if rdev is not None:
                    await asyncio.to_thread(body.hotplug, device(entry, rdev))

    # ------------------------------------------------------------ create, destroy
    def _save_created(self) -> None:
        if self.created_file is not None:
            tmp = self.created_file.with_suffix(".tmp")
            tmp.write_text(json.dumps({str(vmid): body.record() for vmid, body in self.created.items()}))
            tmp.replace(self.created_file)

    def _new_body(self, ct) -> LabContainer:
        indexes = {body.spec.index for body in self.bodies.values()}
        index = net_index(ct.config.get("net0"), indexes, _link_in_use, self.template.get("first_index", 1))
        workdir = Path(self.template["containers_dir"]) / f"ct{ct.vmid}"
        known_hosts = workdir / "known_hosts"
        return LabContainer(
            ContainerSpec(name=ct.config.get("hostname") or f"CT{ct.vmid}", index=index, created=True),
            workdir,
            Path(self.template["rootfs"]),
            Path(self.template["client_key"]),
            known_hosts,
            read_only_binds={k: Path(v) for k, v in self.template.get("binds", {}).items()},
        )

    async def create(self, ct, ssh_public_keys: str | None) -> LabContainer:
        """The body of a CT the API just created (stopped): its rootfs with what the create writes inside, and a
        known_hosts line for its new host key, read from that rootfs on this side (never learnt over ssh)."""
        if not self.template:
            raise ValueError("this lab's API makes no container bodies (no create template in its seed)")
        body = self._new_body(ct)
        try:
            await asyncio.to_thread(_make, body, ssh_public_keys)
        except BaseException:
            await asyncio.to_thread(body.destroy)
            raise
        await self.copy_to_node(ct.node, ct.vmid, body)
        self.bodies[ct.vmid] = self.created[ct.vmid] = body
        self._save_created()
        return body

    async def copy_to_node(self, node: str, vmid: int, body: LabContainer) -> None:
        """The created CT's ssh host public keys onto its node (PCT_COPY), where the node's `pct` serves them."""
        if node not in self.node_ssh:  # a seed without nodes to reach (tests/unit/provision/lab/test_pve.py)
            return
        target = PCT_COPY.format(vmid=vmid) + "/etc/ssh"
        script = f"rm -rf {shlex.quote(target)} && mkdir -p {shlex.quote(target)} && tar -x -C {shlex.quote(target)}"
        out = await _to_node(self.node_ssh[node], script, _public_keys_tar(body))
        if out is not None:
            raise ValueError(f"copying its host keys to node {node} failed: {out}")
        self.copied_to[vmid] = node

    def address(self, vmid: int) -> str | None:
        body = self.bodies.get(vmid)
        return body.spec.address if body is not None else None

    async def destroy(self, vmid: int) -> None:
        """The CT's config is gone: so is its body (stopped first when a forced destroy stopped a running CT)."""
        body = self.bodies.pop(vmid, None)
        self.created.pop(vmid, None)
        node = self.copied_to.pop(vmid, None)
        if node is not None:  # the node's copy goes with the CT (best effort: a node that is down keeps a stale copy)
            ct_dir = PCT_COPY.format(vmid=vmid).removesuffix("/rootfs")
            await _to_node(self.node_ssh[node], f"rm -rf {shlex.quote(ct_dir)}", b"")
        self.running_generation.pop(vmid, None)
        if body is not None:
            async with self.locks.setdefault(vmid, asyncio.Lock()):
                await asyncio.to_thread(body.destroy)
        self._save_created()


def _make(body: LabContainer, ssh_public_keys: str | None) -> None:
    body.dir.mkdir(parents=True, exist_ok=True)
    body.post_create(ssh_public_keys)
    body.known_hosts.write_text(body.known_hosts_line() + "\n")


def _public_keys_tar(body: LabContainer) -> bytes:
    """A tar of the body's /etc/ssh/ssh_host_*_key.pub, as the create wrote them into its root."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        for path in sorted((body.dir / "upper" / "etc" / "ssh").glob("ssh_host_*_key.pub")):
            tar.add(path, arcname=path.name)
    return buffer.getvalue()


async def _to_node(argv: list[str], script: str, data: bytes) -> str | None:
    """Run `script` on the node with `data` on stdin: None when it succeeded, else what went wrong."""
    proc = await asyncio.create_subprocess_exec(
        *argv, script, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE
    )
    try:
        _, err = await asyncio.wait_for(proc.communicate(data), timeout=60)
    except TimeoutError:
        proc.kill()
        return "no answer in 60 s"
    return None if proc.returncode == 0 else err.decode(errors="replace").strip()[-200:]


def _link_in_use(index: int) -> bool:
    """Whether this machine already has the lab link `index`: its network namespace or its host-side interface."""
    spec = ContainerSpec(name="", index=index)
    return Path(f"/run/netns/{spec.netns}").exists() or Path(f"/sys/class/net/{spec.host_if}").exists()
