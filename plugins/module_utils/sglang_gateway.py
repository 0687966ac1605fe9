"""A client of SGLang's gateway (smg 1.13) worker API, on the gateway's host: list, add, remove, and wait. For the
collection's modules only (it requests through Ansible's open_url).

smg's routes (its model_gateway/src/server.rs): GET /workers lists {workers: [{id, url, model_id, status, is_healthy,
load, ...}]}; POST /workers {url, api_key} queues an add (202, Location /workers/<id>); DELETE /workers/<id> queues a
removal (202): the worker is `draining` at once, gets no new request, and leaves the list after its settle time
(5 s), while the requests it is serving finish. Every change runs as a job, so the caller waits for its effect: an
added worker `ready`, a removed one gone (404). With control-plane keys configured, only a control-plane admin key
opens /workers; the data-plane API key gets 401 there.
"""

from __future__ import annotations

import json
import time
import urllib.error

from ansible.module_utils.urls import open_url

READY = "ready"
# the options of every module that talks to the gateway (their documentation: doc_fragments/sglang_gateway.py)
ARGUMENT_SPEC = {
    "url": {"type": "str"},
    "control_key_file": {"type": "path", "no_log": False},
    "record": {"type": "path"},
}


class GatewayError(Exception):
    """One line: what was asked of which gateway, and its answer."""


DEFAULT_URL = "http://127.0.0.1:30000"


def settings(url: str | None, control_key_file: str | None, record: str | None) -> dict:
    """url, control_key_file and secrets_file: as given, else from the gateway's record (the sglang_gateway role's
    sglang-gateway.json), else the default URL and no files. `recorded` says whether a record was read."""
    found: dict = {}
    if record:
        try:
            with open(record, encoding="utf-8") as f:
                found = json.load(f)
        except FileNotFoundError:
            found = {}
        except (OSError, ValueError) as e:
            raise GatewayError(f"cannot read the gateway's record {record}: {e}") from None
    return {
        "url": url or found.get("url") or DEFAULT_URL,
        "control_key_file": control_key_file or found.get("control_key_file"),
        "secrets_file": found.get("secrets_file"),
        "recorded": bool(found),
    }


def connect(url: str, control_key_file: str | None = None, timeout: float = 10.0) -> Gateway:
    """The gateway at `url`, with the key of its control-plane entry file (id:name:role:key) where one is named."""
    key = ""
    if control_key_file:
        try:
            with open(control_key_file, encoding="utf-8") as f:
                key = f.read().strip().split(":", 3)[-1]
        except OSError as e:
            said = f"cannot read the gateway's control-plane key file {control_key_file}: {e.strerror}"
            raise GatewayError(said) from None
    return Gateway(url, key, timeout)


class Gateway:
    def __init__(self, url: str, key: str = "", timeout: float = 10.0):
        self.url, self.key, self.timeout = url.rstrip("/"), key, timeout

    def call(self, method: str, path: str, body: dict | None = None) -> tuple[int, dict]:
        """(status, JSON answer) of one request; a refused connection is a GatewayError."""
        data = json.dumps(body).encode() if body is not None else None
        headers = {"Content-Type": "application/json"}
        if self.key:
            headers["Authorization"] = f"Bearer {self.key}"
        try:
            with open_url(self.url + path, data=data, method=method, headers=headers, timeout=self.timeout) as answer:
                return answer.status, _json(answer.read())
        except urllib.error.HTTPError as e:
            return e.code, _json(e.read())
        except (urllib.error.URLError, OSError) as e:
            raise GatewayError(f"{method} {self.url}{path}: {getattr(e, 'reason', e)}") from None

    def running(self) -> bool:
        try:
            return self.call("GET", "/liveness")[0] == 200
        except GatewayError:
            return False

    def readiness(self) -> dict:
        status, answer = self.call("GET", "/readiness")
        return {"ready": status == 200, **answer}

    def workers(self) -> list[dict]:
        status, answer = self.call("GET", "/workers")
        if status != 200:
            raise GatewayError(f"GET {self.url}/workers: HTTP {status} {_said(answer)}")
        return [_summary(w) for w in answer.get("workers") or []]

    def find(self, url: str) -> dict | None:
        return next((w for w in self.workers() if w["url"] == url.rstrip("/")), None)

    def add(self, url: str, api_key: str = "") -> str:
        body = {"url": url.rstrip("/"), **({"api_key": api_key} if api_key else {})}
        status, answer = self.call("POST", "/workers", body)
        if status not in (200, 201, 202):
            raise GatewayError(f"POST {self.url}/workers {url}: HTTP {status} {_said(answer)}")
        return str(answer.get("worker_id") or "")

    def remove(self, worker_id: str) -> None:
        status, answer = self.call("DELETE", f"/workers/{worker_id}")
        if status not in (200, 202, 404):
            raise GatewayError(f"DELETE {self.url}/workers/{worker_id}: HTTP {status} {_said(answer)}")

    def wait(self, url: str, present: bool, timeout: float, poll: float = 0.5) -> dict | None:
        """Wait until `url` is listed and ready (present), or gone (not present); the last view of it on time out."""
        deadline = time.monotonic() + timeout
        while True:
            seen = self.find(url)
            if (seen is None) != present and (not present or (seen["status"] == READY and seen["healthy"])):
                return seen
            if time.monotonic() >= deadline:
                state = "not listed" if seen is None else f"{seen['status']}, healthy={seen['healthy']}"
                wanted = "ready" if present else "gone"
                raise GatewayError(f"{url} is not {wanted} at {self.url} after {timeout:.0f}s (last seen: {state})")
            time.sleep(poll)


def _json(raw: bytes) -> dict:
    try:
        value = json.loads(raw or b"{}")
    except ValueError:
        return {"text": raw[:200].decode(errors="replace")}
    return value if isinstance(value, dict) else {"value": value}


def _said(answer: dict) -> str:
    error = answer.get("error")
    if isinstance(error, dict):
        return str(error.get("message") or error)
    return str(error or answer.get("message") or answer.get("text") or "")[:200]


def _summary(worker: dict) -> dict:
    return {
        "id": str(worker.get("id", "")),
        "url": str(worker.get("url", "")).rstrip("/"),
        "model": str(worker.get("model_id", "")),
        "status": str(worker.get("status", "")),
        "healthy": bool(worker.get("is_healthy")),
        "load": worker.get("load"),
    }
