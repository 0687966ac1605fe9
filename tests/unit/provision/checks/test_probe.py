"""provision/checks/probe.py, the one command verify runs on each host, read against this machine."""

from __future__ import annotations

import base64
import json
import subprocess
import sys
from pathlib import Path

from provision.checks import probe

PROBE = Path(probe.__file__)


def test_server_info_loses_the_key_and_the_command_line_that_carries_it():
    launch = "python -m sglang.launch_server --api-key k-123"
    body = {"api_key": "k-123", "launch_command": launch, "max_total_num_tokens": 7}
    scrubbed = probe._scrub_server_info({"status": 200, "body": json.dumps(body)})
    assert "k-123" not in scrubbed["body"] and json.loads(scrubbed["body"])["max_total_num_tokens"] == 7


def test_as_verify_runs_it_one_command_prints_one_object(tmp_path):
    state = tmp_path / "verify.json"
    state.write_text("{}")
    request = {"files": [str(state), str(tmp_path / "absent")], "commands": [["true"]]}
    payload = base64.b64encode(json.dumps(request).encode()).decode()
    # as playbooks/verify_probe.yml runs it (ansible.builtin.raw): the source as -c, the request as the one argument
    out = subprocess.run([sys.executable, "-c", PROBE.read_text(), payload], capture_output=True, text=True, check=True)
    data = json.loads(out.stdout)
    assert data["files"] == {str(state): "{}", str(tmp_path / "absent"): None}
    assert data["commands"]["true"]["rc"] == 0 and data["boot_id"]
    assert "sglang" not in data, "no service state was asked for"


def test_weights_total_size_is_read_from_the_safetensors_index(tmp_path):
    assert probe.weights_total_size(str(tmp_path)) is None  # no index: a single-file or GGUF checkpoint
    (tmp_path / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {"total_size": 141107412992}, "weight_map": {"lm_head.weight": "model-00030.st"}})
    )
    assert probe.weights_total_size(str(tmp_path)) == 141107412992
    (tmp_path / "model.safetensors.index.json").write_text("{not json")
    assert probe.weights_total_size(str(tmp_path)) is None
    assert probe.weights_total_size(None) is None
