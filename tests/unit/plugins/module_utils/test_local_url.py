"""The URL a client on the same host calls SGLang at, written once (plugins/module_utils/local_url.py) with IPv6
bracketed: the sglang role's readiness wait and its service record, the sglang_bench role, and provision verify's
probe, which calls the URL the record holds."""

from __future__ import annotations

import http.server
import socket
import threading
from pathlib import Path

import pytest
from ansible.parsing.dataloader import DataLoader
from ansible.template import Templar, trust_as_template

from provision.checks import probe
from provision.paths import module_util
from tests.loaders import REPO

rule = module_util("local_url")


@pytest.mark.parametrize(
    ("listen", "url"),
    [
        ("0.0.0.0", "http://127.0.0.1:30000/health"),
        ("::", "http://[::1]:30000/health"),
        ("::1", "http://[::1]:30000/health"),
        ("127.0.0.1", "http://127.0.0.1:30000/health"),
        ("sglang-01.example.org", "http://sglang-01.example.org:30000/health"),
        ("fd00:10::5", "http://[fd00:10::5]:30000/health"),
        ("[fd00:10::5]", "http://[fd00:10::5]:30000/health"),
        ("fe80::1%eth0", "http://[fe80::1%25eth0]:30000/health"),
        ("", "http://127.0.0.1:30000/health"),
    ],
)
def test_a_listen_address_becomes_the_url_a_local_client_calls(listen, url):
    assert rule.local_url(listen, 30000, "/health") == url
    assert rule.local_url(listen, "30000") + "/health" == url  # the port as the inventory may give it


def test_the_roles_reach_the_rule_through_the_collections_filter():
    templar = Templar(loader=DataLoader(), variables={"listen": "::", "port": 30000})
    template = trust_as_template("{{ listen | provision.pve_sglang.local_url(port, '/health') }}")
    assert templar.template(template) == "http://[::1]:30000/health"


def test_every_caller_uses_the_one_rule():
    users = ("roles/sglang/tasks/ready.yml", "roles/sglang/tasks/configure.yml", "roles/sglang_bench/tasks/main.yml")
    for path in users:
        text = (REPO / path).read_text()
        assert "provision.pve_sglang.local_url" in text, f"{path} does not use the local_url filter"
        assert "127.0.0.1" not in text and "'::'" not in text, f"{path} maps a listen address itself"
    source = Path(probe.__file__).read_text()
    assert 'state["url"]' in source and "127.0.0.1" not in source, "verify's probe must call the recorded URL"


def test_verify_calls_a_server_listening_on_ipv6_at_the_recorded_url():
    class Health(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200 if self.path == "/health" else 404)
            self.end_headers()

        def log_message(self, *args):
            pass

    class Server6(http.server.HTTPServer):
        address_family = socket.AF_INET6

    server = Server6(("::1", 0), Health)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        state = {"url": rule.local_url("::1", server.server_address[1])}
        assert probe.api_call(state, "GET", "/health")["status"] == 200
    finally:
        server.shutdown()
        server.server_close()


def test_a_service_record_without_a_url_asks_for_the_sglang_phase_again(tmp_path):
    """An older provision recorded no url: the probe calls nothing, and every SGLang check says what to run."""
    from provision.checks import test_container
    from provision.checks.plugin import Target

    state = {"service": "sglang-test-absent", "host": "::1", "port": 1, "p2p_policy": "on", "tp_size": 1}
    read = probe.sglang(state, "What is 7 * 13?")
    assert read["health"]["status"] == 0 and "stale" in read
    target = Target("ct1", probe={"state_dir": "/var/lib/provision", "files": {}, "sglang": read})
    with pytest.raises(AssertionError, match=r"sglang-service.json has no url .*provision apply --tags sglang"):
        test_container.test_health_answers(target)
