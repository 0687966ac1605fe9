"""The journal tails shown on failure lose the API key on the host: the role's service_probe.py
(readiness failure) and verify's probe (a unit that is not running)."""

from __future__ import annotations

import base64
import json

import pytest

from provision.checks import probe
from tests.loaders import repo_file

service_probe = repo_file("roles/sglang/files/service_probe.py")

KEY = 'sk-"odd"/key+=\\1'
# What SGLang 0.5.23 writes (engine.py l.1185: the resolved dict's repr) and what a client might
TAIL = "\n".join(
    [
        f"[2026-01-01 00:00:00] server_args={{'api_key': {KEY!r}, 'port': 30000}}",
        f"launch_command: --api-key {KEY} --model-path /m",
        f'{{"api_key": {json.dumps(KEY)}}}',
        "GET /v1/models?key=" + "sk-%22odd%22%2Fkey%2B%3D%5C1",
        "Basic " + base64.b64encode(KEY.encode()).decode(),
        "Load weight begin.",
    ]
)


@pytest.mark.parametrize("scrub", [lambda t, k: service_probe.scrub(t, [k]), probe.scrub], ids=["role", "probe"])
def test_every_spelling_of_the_key_is_replaced(scrub):
    out = scrub(TAIL, KEY)
    assert "odd" not in out and base64.b64encode(KEY.encode()).decode().rstrip("=") not in out
    assert out.count("<redacted>") == 5 and "Load weight begin." in out


def test_no_key_file_leaves_the_tail_as_it_is(tmp_path):
    assert service_probe.read_key(str(tmp_path / "missing.yaml")) == ""
    assert service_probe.scrub(TAIL, [""]) == TAIL
    assert probe.scrub(TAIL, None) == TAIL


def test_the_key_is_read_from_the_file_the_role_writes(tmp_path):
    path = tmp_path / "secrets.yaml"
    path.write_text(json.dumps({"api-key": KEY}) + "\n")
    assert service_probe.read_key(str(path)) == KEY
    assert probe.api_key({"api_key_file": str(path)}) == KEY
