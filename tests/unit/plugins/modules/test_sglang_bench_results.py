"""The container's copy of the benchmark JSONL: the sglang_bench_results module rewrites it without the key."""

from __future__ import annotations

import json
import os
import stat

from tests.unit.collection import main_result, module

KEY = "sk-bench-0123456789"


def line(c: int, launch: str) -> str:
    # the shape of SGLang 0.5.23's /server_info, as the client copies it into each line
    info = {"api_key": KEY, "admin_api_key": None, "launch_command": launch, "version": "0.5.23"}
    return json.dumps({"max_concurrency": c, "completed": c, "server_info": info})


def test_the_key_is_taken_out_of_every_form_and_the_file_stays_root_only(tmp_path):
    path = tmp_path / "results.jsonl"
    launches = [
        f"python3 -m sglang.launch_server --model-path /m --api-key {KEY} --port 30000",
        f"python3 -m sglang.launch_server --api-key={KEY} --admin-api-key 'adm {KEY}'",
    ]
    cut_short = line(8, launches[0])[:40]
    path.write_text("".join(line(c, cmd) + "\n" for c, cmd in zip((1, 4), launches, strict=True)) + cut_short)
    path.chmod(0o644)
    result = main_result(module("sglang_bench_results"), {"path": str(path)})
    assert result["changed"] and result["dropped"] == [3], result
    text = path.read_text()
    assert KEY not in text, text
    rows = [json.loads(r) for r in text.splitlines()]
    assert [r["max_concurrency"] for r in rows] == [1, 4]
    assert rows[0]["server_info"]["launch_command"].endswith("--api-key <redacted> --port 30000")
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert main_result(module("sglang_bench_results"), {"path": str(path)}) == {
        "changed": False,
        "dropped": [],
        "invocation": {"module_args": {"path": str(path)}},
    }


def test_check_mode_leaves_the_file_and_a_missing_file_is_no_change(tmp_path):
    path = tmp_path / "results.jsonl"
    path.write_text(line(1, f"x --api-key {KEY}") + "\n")
    result = main_result(module("sglang_bench_results"), {"path": str(path), "_ansible_check_mode": True})
    assert result["changed"] and KEY in path.read_text()
    assert not main_result(module("sglang_bench_results"), {"path": str(tmp_path / "none.jsonl")})["changed"]
