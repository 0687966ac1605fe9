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
  POST /settings  {"time_scale": float, "version": "8.4.1"}

Like pmxcfs on a real node, each node holds its containers' configurations as files: every change
through the API or the control socket is written to the node's /etc/pve/lxc/<vmid>.conf before the
answer goes out (and what a task changes later within about a second), in PVE's format, pending
changes under [pve:pending]. What a client reads there is what the
API says (the lab's copy is one way: an edit of the file on the node does not reach the API).
"""

from __future__ import annotations

import asyncio
import json
import signal
import sys
from pathlib import Path

SEED_FILE = "pve-seed.json"
MIRROR_INTERVAL_S = 0.5
CONTROL_SOCKET = "pve-control.sock"


async def serve(state_dir: Path) -> None:
    from aiohttp import web
    from fakepve import FakePve
    from fakepve.certs import make_cert

    seed = json.loads((state_dir / SEED_FILE).read_text())
    secrets = json.loads((state_dir / "secrets.json").read_text())

    class NodeBackedPve(FakePve):
        def _build_app(self):
            app = super()._build_app()
            app.middlewares.insert(0, configs.middleware())
            return app

    pve = NodeBackedPve(user="root@pam", password=secrets["pve_password"], host="127.0.0.1", port=seed["port"])
    configs = NodeConfigs(pve, seed)
    pve.time_scale = seed.get("time_scale", 0.0)
    pve.nodes = {}
    for node in seed["nodes"]:
        pve.add_node(node)
    for ct in seed["containers"]:
        pve.add_ct(ct["vmid"], ct["name"], node=ct["node"], status="running", config=ct.get("config", {}))
    pve.apitokens[f"root@pam!{seed['token_name']}"] = secrets["pve_token_secret"]
    # With any grant, fakepve checks permissions as PVE does (tokens may not set devN).
    pve.grant("audit@pve", "/", "VM.Audit")
    certfile, keyfile, _ = make_cert(str(state_dir), name="pve", hosts=("127.0.0.1",))
    await pve.start(certfile, keyfile)

    async def fail(request):
        body = await request.json()
        pve.fail(body["method"], body["suffix"], status=body.get("status"), message=body.get("message"),
                 error=body.get("error"), times=body.get("times"))  # fmt: skip
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
        if "version" in body:
            pve.version = body["version"]
            pve.release_version = ".".join(body["version"].split(".")[:2])
        return web.json_response({"ok": True})

    mirror = asyncio.create_task(configs.poll())
    app = web.Application()
    app.add_routes([
        web.post("/fail", fail), web.post("/reset", reset), web.post("/ct-config", ct_config),
        web.get("/ct/{vmid}", ct_show), web.get("/requests", requests_seen), web.post("/settings", settings),
    ])  # fmt: skip
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
        self.pve, self.seed = pve, seed
        self.written: dict[int, str] = {}
        self.lock = asyncio.Lock()

    async def sync(self) -> None:
        async with self.lock:
            for ct in self.seed["containers"]:
                guest = self.pve.guest(ct["vmid"])
                argv = self.seed.get("node_ssh", {}).get(ct["node"])
                if guest is None or argv is None:
                    continue
                text = config_text(guest.config, guest.pending)
                if self.written.get(ct["vmid"]) != text and await _write_on_node(argv, ct["vmid"], text):
                    self.written[ct["vmid"]] = text

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


async def _write_on_node(argv: list[str], vmid: int, text: str) -> bool:
    path = f"/etc/pve/lxc/{vmid}.conf"
    script = f"mkdir -p /etc/pve/lxc && cat > {path}.tmp && mv {path}.tmp {path}"
    proc = await asyncio.create_subprocess_exec(
        *argv, script, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.DEVNULL,
    )  # fmt: skip
    try:
        await asyncio.wait_for(proc.communicate(text.encode()), timeout=20)
    except TimeoutError:
        proc.kill()
        return False
    return proc.returncode == 0


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
    conn.request(method, path, body=json.dumps(body) if body is not None else None,
                 headers={"Content-Type": "application/json"})  # fmt: skip
    response = conn.getresponse()
    return json.loads(response.read() or b"null")


if __name__ == "__main__":
    asyncio.run(serve(Path(sys.argv[1])))
