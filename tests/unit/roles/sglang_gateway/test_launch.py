"""roles/sglang_gateway/files/launch.py: smg's argv from the unit's flags and the gateway's files, the keys never
given on the command line."""

from __future__ import annotations

import importlib.util
import json

import pytest

from provision.paths import roles_dir

spec = importlib.util.spec_from_file_location("launch", roles_dir() / "sglang_gateway" / "files" / "launch.py")
launch = importlib.util.module_from_spec(spec)
spec.loader.exec_module(launch)


def test_the_workers_and_both_keys_come_from_the_files(tmp_path):
    (tmp_path / "workers.json").write_text(json.dumps(["http://10.0.0.11:30000", "http://10.0.0.12:30000"]))
    (tmp_path / "secrets.json").write_text(json.dumps({"api_key": "k-123"}))
    (tmp_path / "control-plane-key").write_text("provision:provision:admin:c-456\n")
    argv = launch.smg_argv(tmp_path, ["--host", "0.0.0.0", "--port", "30000"])
    assert argv == [
        *("--host", "0.0.0.0", "--port", "30000"),
        *("--worker-urls", "http://10.0.0.11:30000", "http://10.0.0.12:30000"),
        *("--api-key", "k-123"),
        *("--control-plane-api-keys", "provision:provision:admin:c-456"),
    ]


def test_no_key_and_no_worker_files_give_the_flags_alone(tmp_path):
    (tmp_path / "secrets.json").write_text(json.dumps({"api_key": ""}))
    assert launch.smg_argv(tmp_path, ["--policy", "round_robin"]) == ["--policy", "round_robin"]


@pytest.mark.parametrize("flag", ["--api-key", "--api-key=x", "--control-plane-api-keys", "--worker-urls"])
def test_a_key_or_worker_flag_on_the_command_line_is_refused(tmp_path, flag):
    with pytest.raises(SystemExit) as stopped:
        launch.smg_argv(tmp_path, ["--port", "30000", flag])
    assert "must not be given on the command line" in str(stopped.value) and flag.split("=")[0] in str(stopped.value)
