"""sglang_serving: which containers serve before their node reboots, and the wait until they serve again.

The module runs as Ansible starts it, against a real HTTP server on loopback that answers the readiness path as
SGLang does (200 once loaded, 503 while loading), and a `systemctl` stand-in on PATH whose answer the test sets."""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from tests.unit.collection import main_result, module

serving = module("sglang_serving")


class Server:
    """Answers /health_generate with `status` (settable) and counts the requests."""

    def __init__(self):
        outer = self
        self.status, self.hits = 503, 0

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):
                outer.hits += 1
                self.send_response(outer.status if self.path == "/health_generate" else 404)
                self.end_headers()

            def log_message(self, *args):
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/health_generate"


@pytest.fixture
def server():
    s = Server()
    yield s
    s.httpd.shutdown()


@pytest.fixture
def host(tmp_path, monkeypatch, server):
    """A container's state dir holding the sglang role's service record, and systemctl saying the unit is active."""
    state = tmp_path / "state"
    state.mkdir()
    record = {"service": "sglang", "url": server.url.rsplit("/", 1)[0], "ready_url": server.url}
    (state / "sglang-service.json").write_text(json.dumps(record))
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "systemctl").write_text(f'#!/bin/sh\n[ "$(cat {tmp_path}/active)" = active ]\n')
    (bin_dir / "systemctl").chmod(0o755)
    (tmp_path / "active").write_text("active")
    monkeypatch.setenv("PATH", f"{bin_dir}:/usr/bin:/bin")
    monkeypatch.setattr(serving, "POLL_S", 0.5)
    return {"state": str(state), "root": tmp_path}


def test_a_container_without_provisions_sglang_serves_nothing(tmp_path):
    result = main_result(serving, {"state_dir": str(tmp_path)})
    assert result["serving"] is False and result["service"] is None and not result.get("failed")


def test_serving_needs_the_unit_active_and_the_readiness_url_answering(host, server):
    assert main_result(serving, {"state_dir": host["state"]})["serving"] is False, "503: still loading"
    server.status = 200
    result = main_result(serving, {"state_dir": host["state"]})
    assert result["serving"] is True and result["ready_url"] == server.url
    (host["root"] / "active").write_text("inactive")
    assert main_result(serving, {"state_dir": host["state"]})["serving"] is False


def test_the_wait_ends_when_the_server_answers(host, server):
    threading.Timer(2.0, lambda: setattr(server, "status", 200)).start()
    start = time.monotonic()
    result = main_result(serving, {"state_dir": host["state"], "wait": 30})
    assert not result.get("failed") and result["ready"] is True
    assert 1.5 <= result["waited_s"] <= 6 and time.monotonic() - start < 10
    assert server.hits >= 3, "it polled"


def test_a_server_that_never_serves_again_fails_naming_the_container_within_the_wait(host, server):
    start = time.monotonic()
    result = main_result(serving, {"state_dir": host["state"], "wait": 3, "name": "sglang-01"})
    assert result["failed"] is True and time.monotonic() - start < 6
    assert result["msg"].startswith(f"sglang-01: sglang did not serve again within 3s ({server.url} does not answer")
    assert "before the next node reboots" in result["msg"]
