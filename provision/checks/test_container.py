"""Checks for an SGLang container (group gpu_containers): GPUs, userspace, service, smoke, capacity."""

from __future__ import annotations

import json
import os
import re

import pytest

from provision.checks.support import (
    SMOKE_EXPECT,
    SMOKE_QUESTION,
    STATE_DIR,
    api,
    host_vars,
    is_char_device,
    node_of,
    output_dir,
    run_on_node,
    sglang_state,
)

P2P_FLAGS = ("--disable-custom-all-reduce", "--enforce-disable-flashinfer-allreduce-fusion")


def test_container_reachable(host):
    """The container answers over ssh with the inventory's connection settings."""
    assert host.file("/proc/sys/kernel/random/boot_id").exists, "cannot read the boot id"


def test_provision_applied(host):
    """`provision apply` has converged this container at least once."""
    assert host.file(f"{STATE_DIR}/verify.json").exists, f"{STATE_DIR}/verify.json is missing: run provision apply"


def test_gpu_nodes_visible(host):
    """The passed-through GPU nodes, nvidiactl and nvidia-uvm are visible in the container."""
    gpus = [f for f in host.run("ls /dev").stdout.split() if re.fullmatch(r"nvidia\d+", f)]
    assert gpus, "no /dev/nvidiaN in the container: the devN entries are missing or the container needs a restart"
    for name in ["nvidiactl", "nvidia-uvm", *gpus]:
        assert is_char_device(host, f"/dev/{name}"), f"/dev/{name} is missing in the container"


def _driver(host) -> str:
    out = host.run("nvidia-smi --version").stdout
    m = re.search(r"DRIVER version\s*:\s*(\S+)", out)
    return m.group(1) if m else ""


def test_userspace_matches_host_driver(host, request):
    """The container's NVIDIA userspace is the node's driver version (else NVML: version mismatch)."""
    node = node_of(host, request)
    want = run_on_node(node, "nvidia-smi --query-gpu=driver_version --format=csv,noheader").stdout.split()
    have = _driver(host)
    assert want, "cannot read the node's driver version"
    assert have == want[0], f"container userspace {have or 'missing'} != node driver {want[0]}"


def _unit(host):
    return host.service(sglang_state(host)["service"])


def test_service_enabled(host):
    """The SGLang unit starts at boot."""
    assert _unit(host).is_enabled, "the sglang unit is not enabled: it will not come back after a reboot"


def test_service_active(host):
    """The SGLang unit is running."""
    unit = _unit(host)
    if not unit.is_running:
        tail = host.run(f"journalctl -u {sglang_state(host)['service']} -n 5 --no-pager -o cat").stdout
        pytest.fail(f"the sglang unit is not running; journal: {' | '.join(tail.splitlines()[-5:])}")


def test_service_listening(host):
    """The server listens on its configured address and port."""
    state = sglang_state(host)
    sock = host.socket(f"tcp://{state['host']}:{state['port']}")
    assert sock.is_listening, f"nothing listens on {state['host']}:{state['port']}"


def test_health_answers(host):
    """GET /health answers 200 (SGLang runs a one-token generate for it)."""
    status, _ = api(host, "GET", "/health")
    assert status == 200, f"/health answered {status or 'nothing (no connection)'}"


def test_server_info_answers(host):
    """GET /server_info answers with max_total_num_tokens."""
    status, body = api(host, "GET", "/server_info")
    assert status == 200, f"/server_info answered {status}"
    assert "max_total_num_tokens" in json.loads(body), "/server_info has no max_total_num_tokens"


def test_process_matches_p2p_policy(host):
    """The running server's environment and argv match the P2P policy the role decided."""
    state = sglang_state(host)
    pid = host.run(f"systemctl show -p MainPID --value {state['service']}").stdout.strip()
    assert pid not in ("", "0"), "the service has no main process"
    env = dict(e.split("=", 1) for e in host.file(f"/proc/{pid}/environ").content_string.split("\0") if "=" in e)
    argv = host.file(f"/proc/{pid}/cmdline").content_string.split("\0")
    if state["p2p_policy"] == "off":
        assert env.get("NCCL_P2P_DISABLE") == "1", "P2P policy is off but NCCL_P2P_DISABLE=1 is not in its environment"
        assert P2P_FLAGS[0] in argv, "P2P policy is off but --disable-custom-all-reduce is not on the command line"
        if state["tp_size"] > 1:
            assert P2P_FLAGS[1] in argv, "P2P off with tp > 1 needs --enforce-disable-flashinfer-allreduce-fusion"
    else:
        assert "NCCL_P2P_DISABLE" not in env, "P2P policy is on but NCCL_P2P_DISABLE is set"
        assert not set(P2P_FLAGS) & set(argv), "P2P policy is on but P2P-disabling flags are passed"


def test_smoke_answer(host):
    """A chat completion answers the smoke question with the expected text (default: 7 * 13 -> 91)."""
    hv = host_vars(host)
    question = hv.get("verify_smoke_question") or SMOKE_QUESTION
    expect = str(hv.get("verify_smoke_expect") or SMOKE_EXPECT)
    state = sglang_state(host)
    _, models = api(host, "GET", "/v1/models")
    model = json.loads(models)["data"][0]["id"] if models.startswith("{") else state.get("served_model_name")
    request = {"model": model, "messages": [{"role": "user", "content": question}], "max_tokens": 256, "temperature": 0}
    status, body = api(host, "POST", "/v1/chat/completions", request)
    assert status == 200, f"chat completion answered {status}: {body[:200]}"
    answer = json.loads(body)["choices"][0]["message"]["content"]
    assert expect in answer, f"asked {question!r}, expected {expect!r} in the answer, got {answer[:200]!r}"


def test_capacity_report(host):
    """Serving capacity from /server_info and /v1/models, in sessions people plan with."""
    from provision.capacity import compute

    hv = host_vars(host)
    wanted = os.environ.get("PROVISION_SESSION_TOKENS") or hv.get("verify_session_tokens") or "32768"
    sizes = tuple(int(s) for s in str(wanted).split(",") if s.strip())
    _, info = api(host, "GET", "/server_info")
    _, models = api(host, "GET", "/v1/models")
    state = sglang_state(host)
    config_file = host.file(f"{state['model_path']}/config.json")
    model_config = json.loads(config_file.content_string) if config_file.exists else None
    cap = compute(json.loads(info), json.loads(models), session_tokens=sizes, model_config=model_config,
                  predict_tp=(1, 2, 4, 8))  # fmt: skip
    out = output_dir()
    if out is not None:
        name = os.environ.get("PROVISION_VERIFY_HOST") or host.backend.get_hostname()
        (out / f"{name}-capacity.json").write_text(json.dumps(cap.to_dict(), indent=2))
    print(cap.sentence())
