"""Checks for an SGLang container (group gpu_containers): GPUs, userspace, service, smoke, capacity.
Each decides from the container's probe (conftest.py), read once per run; the userspace check also
reads its Proxmox node's probe."""

from __future__ import annotations

import json
import re

import pytest

from provision import capacity
from provision.checks import next_boot
from provision.checks.support import (
    DRIVER_QUERY,
    SERVICE_STATE,
    SMOKE_EXPECT,
    USERSPACE_QUERY,
    gpu_devices,
    gpu_p2p,
    kernel_faults,
    no_sglang,
    smoke_failure,
    smoke_question,
)


def test_gpu_nodes_visible(target):
    """The passed-through GPU nodes, nvidiactl and nvidia-uvm are visible in the container."""
    nodes = target.data["nvidia_nodes"]
    gpus = [name for name in nodes if gpu_devices.is_gpu_node("/dev/" + name)]
    assert gpus, "no /dev/nvidiaN in the container: the devN entries are missing or the container needs a restart"
    for name in ["nvidiactl", "nvidia-uvm", *gpus]:
        assert nodes.get(name, {}).get("char"), f"/dev/{name} is missing in the container"


def test_userspace_matches_host_driver(target):
    """The container's NVIDIA userspace is the node's driver version (else NVML: version mismatch)."""
    assert target.node is not None, "proxmox_host is not set for this container"
    want = target.node.command(DRIVER_QUERY)["stdout"].split()
    m = re.search(r"DRIVER version\s*:\s*(\S+)", target.command(USERSPACE_QUERY)["stdout"])
    have = m.group(1) if m else ""
    assert want, f"cannot read the driver version of node {target.node.name}"
    assert have == want[0], f"container userspace {have or 'missing'} != node driver {want[0]}"


def _sglang(target) -> dict:
    sglang = target.data.get("sglang")
    assert sglang is not None, no_sglang(target.data)
    assert "stale" not in sglang, f"{target.path(SERVICE_STATE)} {sglang['stale']}"
    return sglang


def _answer(target, name: str) -> tuple[int, str]:
    answer = _sglang(target)[name]
    return answer["status"], answer["body"]


def test_service_enabled(host, target):
    """The SGLang unit starts at boot (testinfra: host.service)."""
    _sglang(target)  # the sglang phase's record, or the reason there is none
    name = target.json(SERVICE_STATE)["service"]
    assert host.service(name).is_enabled, f"the {name} unit is not enabled: it will not come back after a reboot"


def test_service_active(target):
    """The SGLang unit is running."""
    unit = _sglang(target)["service"]
    if not unit["active"]:
        tail = unit.get("journal", "").splitlines()[-5:]
        pytest.fail(f"the sglang unit is not running; journal: {' | '.join(tail)}")


def test_service_listening(host, target):
    """The server listens on its configured address and port (testinfra: host.socket; a wildcard address counts)."""
    _sglang(target)  # the sglang phase's record, or the reason there is none
    state = target.json(SERVICE_STATE)
    where = f"[{state['host']}]:{state['port']}" if ":" in state["host"] else f"{state['host']}:{state['port']}"
    # testinfra's socket spec takes an IPv6 address bare (`tcp://::1:30000`: the port after the last colon)
    assert host.socket(f"tcp://{state['host']}:{state['port']}").is_listening, f"nothing listens on {where}"


def test_health_answers(target):
    """GET /health answers 200 (SGLang runs a one-token generate for it)."""
    status, _ = _answer(target, "health")
    assert status == 200, f"/health answered {status or 'nothing (no connection)'}"


def test_server_info_answers(target):
    """GET /server_info answers with max_total_num_tokens."""
    status, body = _answer(target, "server_info")
    assert status == 200, f"/server_info answered {status}"
    assert "max_total_num_tokens" in json.loads(body), "/server_info has no max_total_num_tokens"


def test_process_matches_p2p_policy(target):
    """The running server's environment and argv match the P2P policy the role decided."""
    state = target.json(SERVICE_STATE)
    unit = _sglang(target)["service"]
    assert unit["main_pid"] not in ("", "0"), "the service has no main process"
    flags, env = unit["argv_flags"], " ".join(f"{k}={v}" for k, v in sorted(gpu_p2p.P2P_OFF_ENV.items()))
    if state["p2p_policy"] == "off":
        values = unit.get("env_values") or {}
        assert all(values.get(k) == v for k, v in gpu_p2p.P2P_OFF_ENV.items()), (
            f"P2P policy is off but {env} is not in its environment"
        )
        missing = [flag for flag in gpu_p2p.p2p_off_flags(state["tp_size"]) if flag not in flags]
        tp = state["tp_size"]
        assert not missing, f"P2P policy is off (tp {tp}) but {' '.join(missing)} is not on the command line"
    else:
        guarded = gpu_p2p.GUARD_FLAGS_ENV in unit["env_names"]
        assert not guarded or not set(gpu_p2p.P2P_OFF_ENV) & set(unit["env_names"]), (
            "P2P policy is on, but the unit's start guard started the server with P2P off: this boot is not the "
            f"one P2P was decided for (journalctl -u {state.get('service', 'sglang')}): run provision apply to "
            "decide for this boot"
        )
        assert not set(gpu_p2p.P2P_OFF_ENV) & set(unit["env_names"]), f"P2P policy is on but {env} is set"
        assert not set(gpu_p2p.P2P_OFF_FLAGS) & set(flags), "P2P policy is on but P2P-disabling flags are passed"


def test_the_next_boot_starts_p2p_safely(target, record_property):
    """In every boot its node may boot next, the unit starts with a safe P2P policy: off, on between NVLink peers,
    or on between PCIe peers only where that boot does not translate (the start guard turns it off in a boot with
    other IOMMU arguments). A line armed or edited since apply that would start P2P through a translating IOMMU
    fails before anyone reboots."""
    assert target.node is not None, "proxmox_host is not set for this container"
    _sglang(target)
    node_lines = next_boot.lines(target.node.data)
    starts = next_boot.container(target.data, node_lines)
    unsafe = [f"{s['source']}: P2P {s['p2p']} ({s['why']})" for s in starts if not s["safe"]]
    assert not unsafe, "the next boot would start GPU P2P unsafely: " + "; ".join(unsafe) + ": run provision apply"
    record_property("note", "; ".join(f"{s['source']}: P2P {s['p2p']}" for s in starts))


def fault_window(unit: dict) -> tuple[float | None, str]:
    """(since, words): faults count from the unit's start, or from the node's boot when systemd restarted the
    unit by itself (NRestarts, which a manual start resets): a fault that crashed it must not hide behind the
    restart's new start time."""
    restarts = int(unit.get("restarts") or 0)
    if restarts:
        return None, f"this boot (sglang restarted {restarts} time(s) by itself)"
    return float(unit["started_at"]), "since sglang started"


def test_no_gpu_dma_faults_since_the_service_started(target, record_property):
    """The node logged no AMD-Vi IO_PAGE_FAULT / RMP_PAGE_FAULT or NVRM Xid of this container's GPUs (or of no named
    device) since SGLang started; the lines of the node's other devices are a note, not a failure."""
    assert target.node is not None, "proxmox_host is not set for this container"
    unit = _sglang(target)["service"]
    assert unit.get("started_at"), "the sglang unit has no start time (not running?)"
    since, window = fault_window(unit)
    log = target.node.command(kernel_faults.journal_argv())
    text, error = kernel_faults.read_result(log["rc"], log["stdout"], log["stderr"])
    assert error is None, f"node {target.node.name}: {error}"
    gpus = (target.json(SERVICE_STATE) or {}).get("gpus")  # none in a record without them: every line counts
    found, other = kernel_faults.of_devices(kernel_faults.faults(text, since=since), gpus or None)
    if other:
        record_property("note", f"{len(other)} fault line(s) of other devices {window}: " + " | ".join(other[:3]))
    assert not found, f"node {target.node.name} logged {len(found)} GPU DMA fault line(s) {window}: " + " | ".join(
        found[:5]
    )


def test_smoke_answer(target):
    """A chat completion answers the smoke question with the expected text (default: 7 * 13 -> 91)."""
    question = target.data.get("question") or smoke_question(target.vars)  # what the probe asked, rendered once
    expect = str(target.vars.get("verify_smoke_expect") or SMOKE_EXPECT)
    failure = smoke_failure(*_answer(target, "chat"), question, expect)
    assert failure is None, failure


def test_capacity_report(target):
    """Serving capacity from /server_info and /v1/models, in sessions people plan with (provision/capacity.py,
    which `provision verify` and `provision capacity` report from the same reading)."""
    try:
        capacity.from_server(_sglang(target), capacity.session_sizes(target.vars))
    except capacity.CapacityUnknown as exc:
        pytest.fail(str(exc))
