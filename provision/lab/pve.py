"""The lab's Proxmox VE API: fakepve on loopback with TLS, seeded with the lab's nodes and
container, plus a small control socket so tests can inject faults.

Run as its own process (`python -m provision.lab.pve STATE_DIR`), reading its seed from
STATE_DIR/pve-seed.json. fakepve (AGPL-3.0) is used as a separate test tool, never
imported by product code.

Control socket (HTTP over the unix socket STATE_DIR/pve-control.sock):
  POST /fail      {"method", "suffix", "status", "message", "times"} or {"method", "suffix", "error"}
  POST /reset     drop every injected failure
  POST /ct-config {"vmid", "set": {...}, "delete": [...]}  change a config underneath clients
  GET  /ct/VMID   the container's config, pending changes, digest and status
  GET  /requests  every request seen so far as [method, path] (bodies left out)
  POST /settings  {"time_scale": float, "version": "8.4.1", "totp_secrets": {"root@pam": BASE32}}: a user named in
                  totp_secrets logs in with PVE's TOTP second factor (pve_tfa.py); {} turns it off

Like pmxcfs on a real node, each node holds its containers' configurations as files: every change
through the API or the control socket is written to the node's /etc/pve/lxc/<vmid>.conf before the
answer goes out (and what a task changes later within about a second), in PVE's format, pending
changes under [pve:pending]. What a client reads there is what the
API says (the lab's copy is one way: an edit of the file on the node does not reach the API).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import signal
import sys
from dataclasses import dataclass
from pathlib import Path

from provision.lab.ctbody import DEV_KEY, TEMPLATE_VOLID, Bodies, StartRefused, pve_major
from provision.lab.pve_tfa import totp_pve

SEED_FILE = "pve-seed.json"
MIRROR_INTERVAL_S = 0.5
CONTROL_SOCKET = "pve-control.sock"


async def serve(state_dir: Path) -> None:
    from aiohttp import web
    from fakepve import FakePve
    from fakepve.certs import make_cert
    from fakepve.model import PveError, TaskError

    seed = json.loads((state_dir / SEED_FILE).read_text())
    secrets = json.loads((state_dir / "secrets.json").read_text())
    token = f"root@pam!{seed['token_name']}"
    bodies = Bodies(seed, state_dir)
    creating: dict[int, CreateRequest] = {}  # vmid -> what the create's task needs of its request
    starts: set[asyncio.Future] = set()  # the starts that follow a create with start=1

    class NodeBackedPve(totp_pve(FakePve)):
        """fakepve whose containers are the lab's nspawn containers (`ctbody.py`)."""

        def _build_app(self):
            app = super()._build_app()
            app.middlewares.insert(0, configs.middleware())
            app.middlewares.insert(0, guests_middleware(self, token, secrets["pve_token_secret"]))
            return app

        async def _ct_task(self, ct, ttype, user, body, **kwargs):
            async def and_the_body():
                note = await body()
                if self.ct(ct.vmid) is not ct:  # destroyed: its config is gone, and so goes its body
                    await bodies.destroy(ct.vmid)
                    return note
                try:
                    await bodies.settle(ct)
                except StartRefused as exc:  # the prestart hook died: the CT stays stopped
                    ct.status, ct.pid = "stopped", None
                    raise TaskError(f"{exc}\nstartup for container '{ct.vmid}' failed") from exc
                return note

            return await super()._ct_task(ct, ttype, user, and_the_body, **kwargs)

        async def _lxc_create(self, user, v):
            # fakepve starts a CT inside its create task; PVE starts it in a task of its own afterwards
            v = dict(v)
            vmid, start = int(v["vmid"]), bool(v.pop("start", False))
            if start:
                self._vm_perm(user, vmid, v.get("pool"), "VM.PowerMgmt")
            creating[vmid] = CreateRequest(v["ostemplate"], v.get("ssh-public-keys"), start, user)
            try:
                return await super()._lxc_create(user, v)
            finally:
                creating.pop(vmid, None)

        async def task(self, node, ttype, tid, user, body, vm=None, **kwargs):
            request = creating.get(int(tid)) if ttype == "vzcreate" and vm is not None else None
            if request is None:
                return await super().task(node, ttype, tid, user, body, vm=vm, **kwargs)

            async def and_a_body():
                if self.volume_exists(request.ostemplate) is False:  # PVE::Storage abs_filesystem_path
                    self._drop(vm)
                    raise TaskError(f"unable to create CT {vm.vmid} - can't find file '{request.ostemplate}'")
                note = await body()
                try:
                    await bodies.create(vm, request.ssh_public_keys)
                except Exception as exc:  # create_vm removes the config of a create that failed
                    self._drop(vm)
                    raise TaskError(f"unable to create CT {vm.vmid} - {exc}") from exc
                return note

            upid = await super().task(node, ttype, tid, user, and_a_body, vm=vm, **kwargs)
            if request.start:
                starts.add(start := asyncio.ensure_future(self._start_after_create(node, vm.vmid, upid, user)))
                start.add_done_callback(starts.discard)
            return upid

        async def _start_after_create(self, node, vmid, upid, user):
            if await _wait_task(self, upid) == "OK":
                with contextlib.suppress(PveError):  # e.g. started by a client in between
                    await self._lxc_start(user, {"node": node, "vmid": vmid})

        async def _lxc_interfaces(self, user, v):
            """PVE reads a running CT's addresses from inside it: the lab's link address, whatever net0's ip= says."""
            out = await super()._lxc_interfaces(user, v)
            address = bodies.address(int(v["vmid"]))
            for item in out or []:
                if item["name"] != "lo" and address and "inet" not in item:
                    item["inet"] = f"{address}/30"
                    item["ip-addresses"].append({"ip-address-type": "inet", "ip-address": address, "prefix": "30"})
            return out

        async def _update_config(self, ct, user, values, deletes, reverts):
            missing = await bodies.check_device(ct.node, values)
            if missing:
                raise PveError(500, f"Device {missing} does not exist")
            before = set(ct.config)
            await super()._update_config(ct, user, values, deletes, reverts)
            added = sorted(k for k in set(ct.config) - before if DEV_KEY.fullmatch(k))
            await bodies.hotplug(ct, added)

        def _apply(self, ct, selection=None, running=False):
            if running and pve_major(self.version) < 9:  # PVE 8 hot-plugs no devN
                selection = [k for k in (ct.pending if selection is None else selection) if not DEV_KEY.fullmatch(k)]
            return super()._apply(ct, selection, running)

    pve = NodeBackedPve(user="root@pam", password=secrets["pve_password"], host="127.0.0.1", port=seed["port"])
    configs = NodeConfigs(pve, seed)
    pve.time_scale = seed.get("time_scale", 0.0)
    pve.version = seed.get("pve_version", pve.version)
    pve.release_version = ".".join(pve.version.split(".")[:2])
    pve.nodes = {}
    for node in seed["nodes"]:
        pve.add_node(node)
    for ct in seed["containers"]:
        pve.add_ct(ct["vmid"], ct["name"], node=ct["node"], status="running", config=ct.get("config", {}))
    pve.apitokens[token] = secrets["pve_token_secret"]
    # the one OS template on the nodes' storage, as `pveam download local <template>` leaves it (size not modelled)
    volname = TEMPLATE_VOLID.partition(":")[2]
    pve.storages["local"].setdefault("volumes", {})[volname] = {"content": "vztmpl", "format": "tzst", "size": 0}
    # With any grant, fakepve checks permissions as PVE does (tokens may not set devN).
    pve.grant("audit@pve", "/", "VM.Audit")
    certfile, keyfile, _ = make_cert(str(state_dir), name="pve", hosts=("127.0.0.1",))
    await pve.start(certfile, keyfile)
    # the seeded CTs run: start their bodies the way a start does (prestart checks against their node)
    await asyncio.gather(*(bodies.settle(pve.guest(ct["vmid"])) for ct in seed["containers"]))

    async def fail(request):
        body = await request.json()
        pve.fail(
            body["method"],
            body["suffix"],
            status=body.get("status"),
            message=body.get("message"),
            error=body.get("error"),
            times=body.get("times"),
        )
        return web.json_response({"ok": True})

    async def reset(request):
        pve.failures.clear()
        return web.json_response({"ok": True})

    async def ct_config(request):
        body = await request.json()
        ct = pve.guest(int(body["vmid"]))
        ct.config.update(body.get("set", {}))
        for key in body.get("delete", []):
            ct.config.pop(key, None)
        await configs.sync()
        return web.json_response({"digest": ct.digest()})

    async def ct_show(request):
        ct = pve.guest(int(request.match_info["vmid"]))
        if ct is None:
            return web.json_response({"error": "no such guest"}, status=404)
        return web.json_response(
            {"config": ct.config, "pending": ct.pending, "digest": ct.digest(), "status": ct.status}
        )

    async def requests_seen(request):
        return web.json_response([[m, p] for m, p, _ in pve.requests])

    async def settings(request):
        body = await request.json()
        if "time_scale" in body:
            pve.time_scale = float(body["time_scale"])
        if "totp_secrets" in body:
            pve.totp_secrets = dict(body["totp_secrets"])
        if "version" in body:
            pve.version = body["version"]
            pve.release_version = ".".join(body["version"].split(".")[:2])
        return web.json_response({"ok": True})

    mirror = asyncio.create_task(configs.poll())
    app = web.Application()
    app.add_routes(
        [
            web.post("/fail", fail),
            web.post("/reset", reset),
            web.post("/ct-config", ct_config),
            web.get("/ct/{vmid}", ct_show),
            web.get("/requests", requests_seen),
            web.post("/settings", settings),
        ]
    )
    runner = web.AppRunner(app)
    await runner.setup()
    sock = state_dir / CONTROL_SOCKET
    sock.unlink(missing_ok=True)
    await web.UnixSite(runner, str(sock)).start()
    (state_dir / "pve-ready").write_text(str(pve.port))
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    mirror.cancel()
    await runner.cleanup()
    await pve.stop()
    sock.unlink(missing_ok=True)


def config_text(config: dict, pending: dict) -> str:
    """A container's configuration as PVE writes /etc/pve/lxc/<vmid>.conf (PVE::LXC::Config
    write_pct_config): `key: value` lines, then pending changes in a [pve:pending] section, a pending
    delete as one `delete:` line."""
    lines = [f"{key}: {value}" for key, value in sorted(config.items())]
    if pending:
        deletes = sorted(key for key, value in pending.items() if value is None)
        lines += ["", "[pve:pending]", *(f"{k}: {v}" for k, v in sorted(pending.items()) if v is not None)]
        lines += [f"delete: {','.join(deletes)}"] if deletes else []
    return "\n".join(lines) + "\n"


class NodeConfigs:
    """Each node's /etc/pve/lxc/<vmid>.conf, kept equal to the API's view. `sync` runs before every API
    answer (so a client that reads the file after a PUT returned sees it, as pmxcfs writes it before the
    API answers) and every MIRROR_INTERVAL_S for what tasks change later; a node that is down is retried."""

    def __init__(self, pve, seed: dict):
        self.pve, self.node_ssh = pve, seed.get("node_ssh", {})
        self.written: dict[int, tuple[str, str]] = {}  # vmid -> (node, text) as last written there
        self.lock = asyncio.Lock()

    async def sync(self) -> None:
        async with self.lock:
            # a CT being created holds only its create lock until the task writes its config
            live = {ct.vmid: ct for ct in self.pve.cts if ct.node in self.node_ssh and ct.lock != "create"}
            for vmid, ct in live.items():
                wanted = (ct.node, config_text(ct.config, ct.pending))
                if self.written.get(vmid) != wanted and await _write_on_node(self.node_ssh[ct.node], vmid, wanted[1]):
                    self.written[vmid] = wanted
            for vmid in set(self.written) - set(live):  # destroyed: PVE removes the file (destroy_config)
                if await _remove_on_node(self.node_ssh[self.written[vmid][0]], vmid):
                    del self.written[vmid]

    async def poll(self) -> None:
        while True:
            await asyncio.sleep(MIRROR_INTERVAL_S)
            await self.sync()

    def middleware(self):
        from aiohttp import web

        @web.middleware
        async def sync_before_answer(request, handler):
            response = await handler(request)
            await self.sync()
            return response

        return sync_before_answer


def guests_middleware(pve, token: str, secret: str):
    """`POST /api2/json/nodes/{node}/startall|stopall`, which a node's pve-guests.service calls at boot and at
    shutdown (`pvesh create /nodes/localhost/startall`): start the node's `onboot` CTs in `startup` order, each
    through the start task (so the prestart checks run against the node's /dev), or stop its running ones.
    Answers when all are done, as pvesh does; the lab's node stub authenticates with the lab's API token."""
    from aiohttp import web

    route = re.compile(r"/api2/json/nodes/([^/]+)/(startall|stopall)")

    @web.middleware
    async def node_guests(request, handler):
        match = route.fullmatch(request.path)
        if match is None or request.method != "POST":
            return await handler(request)
        pve.requests.append((request.method, request.path, None))
        if request.headers.get("Authorization") != f"PVEAPIToken={token}={secret}":
            return web.json_response({"data": None}, status=401)
        node, action = match.groups()
        results = await (start_all(pve, node) if action == "startall" else stop_all(pve, node))
        return web.json_response({"data": results})

    return node_guests


def _startup_order(ct) -> int:
    order = re.search(r"order=(\d+)", str(ct.config.get("startup", "")))
    return int(order.group(1)) if order else 1 << 30


async def _wait_task(pve, upid: str) -> str:
    while pve.tasks[upid]["status"] != "stopped":
        await asyncio.sleep(0.2)
    return pve.tasks[upid]["exitstatus"]


async def start_all(pve, node: str) -> dict:
    results = {}
    for ct in sorted((c for c in pve.cts if c.node == node), key=lambda c: (_startup_order(c), c.vmid)):
        if str(ct.config.get("onboot", "0")) == "1" and ct.status != "running":
            upid = await pve._lxc_start("root@pam", {"node": node, "vmid": ct.vmid})
            results[ct.vmid] = await _wait_task(pve, upid)
    return results


async def stop_all(pve, node: str) -> dict:
    results = {}
    for ct in sorted((c for c in pve.cts if c.node == node), key=lambda c: -_startup_order(c)):
        if ct.status == "running":
            upid = await pve._lxc_stop("root@pam", {"node": node, "vmid": ct.vmid})
            results[ct.vmid] = await _wait_task(pve, upid)
    return results


async def _write_on_node(argv: list[str], vmid: int, text: str) -> bool:
    path = f"/etc/pve/lxc/{vmid}.conf"
    return await _on_node(argv, f"mkdir -p /etc/pve/lxc && cat > {path}.tmp && mv {path}.tmp {path}", text)


async def _remove_on_node(argv: list[str], vmid: int) -> bool:
    return await _on_node(argv, f"rm -f /etc/pve/lxc/{vmid}.conf", "")


async def _on_node(argv: list[str], script: str, text: str) -> bool:
    proc = await asyncio.create_subprocess_exec(
        *argv,
        script,
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.DEVNULL,
    )
    try:
        await asyncio.wait_for(proc.communicate(text.encode()), timeout=20)
    except TimeoutError:
        proc.kill()
        return False
    return proc.returncode == 0


@dataclass
class CreateRequest:
    """What a create's task needs of the request that fakepve does not keep in the config."""

    ostemplate: str
    ssh_public_keys: str | None
    start: bool
    user: str


def control(state_dir: Path, method: str, path: str, body: dict | None = None) -> object:
    """Call the control socket (used by tests and `provision lab status`)."""
    import http.client
    import socket

    class _Conn(http.client.HTTPConnection):
        def connect(self):
            self.sock = socket.socket(socket.AF_UNIX)
            self.sock.settimeout(10)
            self.sock.connect(str(state_dir / CONTROL_SOCKET))

    conn = _Conn("localhost")
    conn.request(
        method, path, body=json.dumps(body) if body is not None else None, headers={"Content-Type": "application/json"}
    )
    response = conn.getresponse()
    return json.loads(response.read() or b"null")


if __name__ == "__main__":
    asyncio.run(serve(Path(sys.argv[1])))
