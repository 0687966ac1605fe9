"""Helpers shared by the verify suites: state records on the host and calls to the SGLang API.

API calls run inside the target with its own python3, reading the API key from the service's
root-only config file, so the key never travels to the controller nor shows on any argv.
"""

from __future__ import annotations

import base64
import json
import os
import random
import time
from pathlib import Path

STATE_DIR = "/var/lib/provision"
SMOKE_QUESTION = "What is 7 * 13?"
SMOKE_EXPECT = "91"

_API_SCRIPT = r"""
import base64, json, sys, urllib.error, urllib.request
state = json.load(open("/var/lib/provision/sglang-service.json"))
host = "127.0.0.1" if state["host"] in ("0.0.0.0", "::") else state["host"]
method, path = sys.argv[1], sys.argv[2]
body = base64.b64decode(sys.argv[3]).decode() if len(sys.argv) > 3 and sys.argv[3] else None
headers = {"Content-Type": "application/json"}
if state.get("api_key_file"):
    headers["Authorization"] = "Bearer " + json.load(open(state["api_key_file"]))["api-key"]
req = urllib.request.Request("http://%s:%s%s" % (host, state["port"], path), data=body.encode() if body else None,
                             headers=headers, method=method)
try:
    with urllib.request.urlopen(req, timeout=120) as r:
        print(json.dumps({"status": r.status, "body": r.read().decode()}))
except urllib.error.HTTPError as e:
    print(json.dumps({"status": e.code, "body": e.read().decode()[:2000]}))
except OSError as e:
    print(json.dumps({"status": 0, "body": str(e)}))
"""


def read_json(host, path: str) -> dict | None:
    f = host.file(path)
    if not f.exists:
        return None
    return json.loads(f.content_string)


def sglang_state(host) -> dict:
    state = read_json(host, f"{STATE_DIR}/sglang-service.json")
    assert state is not None, f"{STATE_DIR}/sglang-service.json is missing: the sglang phase has not run here"
    return state


def api(host, method: str, path: str, body: dict | None = None) -> tuple[int, str]:
    """Call the service from inside the target; returns (HTTP status, body). Status 0: no connection."""
    payload = base64.b64encode(json.dumps(body).encode()).decode() if body is not None else ""
    cmd = host.run("python3 -c %s %s %s %s", _API_SCRIPT, method, path, payload)
    assert cmd.rc == 0, f"could not run the API probe in the target: {cmd.stderr.strip()[-300:]}"
    out = json.loads(cmd.stdout.strip().splitlines()[-1])
    return out["status"], out["body"]


def host_vars(host) -> dict:
    try:
        return host.ansible.get_variables()
    except Exception:  # not run through the ansible backend
        return {}


def node_of(host, request):
    """The testinfra host of this container's Proxmox node (from its proxmox_host variable)."""
    import testinfra

    node = host_vars(host).get("proxmox_host")
    assert node, "proxmox_host is not set for this container"
    inventory = request.config.option.ansible_inventory
    return testinfra.get_host(f"ansible://{node}?ansible_inventory={inventory}")


def run_on_node(node, command: str, attempts: int = 5):
    """Run a command on a node that every container's check reaches at once. sshd's default
    MaxStartups (10:30:100) drops some of a burst of new connections (ssh exits 255,
    "kex_exchange_identification: Connection closed"), which testinfra raises: retry those, spread out."""
    for attempt in range(attempts):
        try:
            return node.run(command)
        except RuntimeError as exc:
            if "exit_status=255" not in str(exc) or attempt == attempts - 1:
                raise
            time.sleep(1 + random.random() * 2 * (attempt + 1))
    raise AssertionError("unreachable")


def output_dir() -> Path | None:
    out = os.environ.get("PROVISION_VERIFY_OUT")
    return Path(out) if out else None


def is_char_device(host, path: str) -> bool:
    return host.run("stat -c %%F %s", path).stdout.strip() == "character special file"
