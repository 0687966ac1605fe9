"""The SGLang phase in the lab container, with the lab's stand-in installed through the role's real
install path (a local wheelhouse), on a real systemd."""

from __future__ import annotations

import json
import time

import pytest

from tests.lab.helpers import apply, set_host_vars

API_KEY = "lab-key-" + "5b1e0c77"
KEY_VARS = {"sglang_api_key": "{{ lookup('ansible.builtin.env', 'SGLANG_API_KEY') }}"}
ENV = {"SGLANG_API_KEY": API_KEY}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    return tmp_path_factory.mktemp("sglang-runs")


@pytest.fixture(scope="module")
def ct(lab, lab_inventory):
    yield lab.container()
    set_host_vars(lab_inventory, "sglang-01", None)


def converge(inv, runs, host_vars, *extra):
    set_host_vars(inv, "sglang-01", {**KEY_VARS, **host_vars})
    return apply(inv, runs, "--tags", "sglang", *extra, env=ENV)


def show(ct, prop: str) -> str:
    return ct.ssh(f"systemctl show -p {prop} --value sglang").stdout.strip()


def process(ct) -> tuple[list[str], dict[str, str]]:
    pid = show(ct, "MainPID")
    argv = ct.ssh(f"cat /proc/{pid}/cmdline").stdout.split("\0")
    env = dict(e.split("=", 1) for e in ct.ssh(f"cat /proc/{pid}/environ").stdout.split("\0") if "=" in e)
    return [a for a in argv if a], env


def get(ct, path: str, key: str | None = API_KEY) -> tuple[int, str]:
    auth = f"-H 'Authorization: Bearer {key}'" if key else ""
    out = ct.ssh(f"curl -s -o /tmp/body -w '%{{http_code}}' {auth} http://127.0.0.1:30000{path}; echo; cat /tmp/body")
    code, _, body = out.stdout.partition("\n")
    return int(code or 0), body


def test_policy_off_service_is_enabled_active_listening_and_p2p_safe(ct, lab_inventory, runs):
    rc, result, err = converge(lab_inventory, runs, {"sglang_p2p": "off", "sglang_tp_size": 2})
    assert rc == 0, err[-3000:]
    assert any("sglang_p2p off -> off" in m for m in result["reports"]["sglang-01"])
    assert ct.ssh("systemctl is-enabled sglang").stdout.strip() == "enabled"
    assert ct.ssh("systemctl is-active sglang").stdout.strip() == "active"
    assert "127.0.0.1:30000" in ct.ssh("ss -ltnH").stdout
    argv, env = process(ct)
    assert env.get("NCCL_P2P_DISABLE") == "1"
    assert "--disable-custom-all-reduce" in argv and "--enforce-disable-flashinfer-allreduce-fusion" in argv
    site = ct.ssh("cat /opt/sglang/venv/lib/python3*/site-packages/sitecustomize.py").stdout
    assert 'os.environ.setdefault("NCCL_P2P_DISABLE", "1")' in site
    assert show(ct, "User") == "sglang"
    assert API_KEY not in ct.ssh("ps -eo args").stdout, "the API key must not be on any process's argv"
    assert get(ct, "/v1/models", key=None)[0] == 401
    code, body = get(ct, "/v1/models")
    assert code == 200 and json.loads(body)["data"][0]["id"] == "lab-standin"


def test_second_apply_changes_nothing_and_does_not_restart(ct, lab_inventory, runs):
    started = show(ct, "ExecMainStartTimestampMonotonic")
    rc, result, err = converge(lab_inventory, runs, {"sglang_p2p": "off", "sglang_tp_size": 2})
    assert rc == 0, err[-2000:]
    assert result["hosts"]["sglang-01"]["changed"] == 0
    assert show(ct, "ExecMainStartTimestampMonotonic") == started


def test_changing_one_flag_restarts_exactly_once(ct, lab_inventory, runs):
    since = ct.ssh("date +%s").stdout.strip()
    time.sleep(1)
    rc, _, err = converge(lab_inventory, runs, {"sglang_p2p": "off", "sglang_tp_size": 2,
                                                "sglang_extra_args": ["--enable-metrics"]})  # fmt: skip
    assert rc == 0, err[-2000:]
    starts = ct.ssh(f"journalctl -u sglang --since @{since} -o cat | grep -c 'Started sglang.service'").stdout
    assert starts.strip() == "1"
    assert "--enable-metrics" in process(ct)[0]
    assert get(ct, "/metrics")[0] == 200


def test_policy_on_has_neither_the_variable_nor_the_flags(ct, lab_inventory, runs):
    rc, _, err = converge(lab_inventory, runs, {"sglang_p2p": "on", "sglang_tp_size": 2})
    assert rc == 0, err[-2000:]
    argv, env = process(ct)
    assert "NCCL_P2P_DISABLE" not in env
    assert "--disable-custom-all-reduce" not in argv and "--enforce-disable-flashinfer-allreduce-fusion" not in argv
    assert ct.ssh("ls /opt/sglang/venv/lib/python3*/site-packages/sitecustomize.py").returncode != 0


def test_auto_policy_says_what_it_decided_and_why(ct, lab_inventory, runs):
    # the lab VMs' kernels log "iommu: Default domain type: Translated" and the container has 2 GPUs
    rc, result, err = converge(lab_inventory, runs, {"sglang_p2p": "auto"})
    assert rc == 0, err[-2000:]
    report = next(m for m in result["reports"]["sglang-01"] if m.startswith("sglang_p2p auto"))
    assert report == (
        "sglang_p2p auto -> off: the node IOMMU translates (default domain Translated) "
        "and 2 GPUs would talk peer to peer"
    )
    # a diagnostic verdict, when there is one, wins over the findings (here: what diag says on healthy GPUs)
    verdict = {"verdict": "healthy", "reason": "every peer copy was bit-exact", "recommended_sglang_p2p": "on"}
    ct.ssh(f"echo '{json.dumps(verdict)}' > /var/lib/provision/gpu-diag.json")
    try:
        rc, result, err = converge(lab_inventory, runs, {"sglang_p2p": "auto"})
    finally:
        ct.ssh("rm -f /var/lib/provision/gpu-diag.json")
    assert rc == 0, err[-2000:]
    report = next(m for m in result["reports"]["sglang-01"] if m.startswith("sglang_p2p auto"))
    assert report == "sglang_p2p auto -> on: GPU diagnostic verdict healthy: every peer copy was bit-exact"
    assert "NCCL_P2P_DISABLE" not in process(ct)[1]


def test_model_path_with_spaces_and_shell_metacharacters(ct, lab_inventory, runs):
    path = '/srv/models/my model; echo $HOME "quoted" 100%'
    rc, _, err = converge(lab_inventory, runs, {"sglang_model_path": path, "sglang_served_model_name": ""})
    assert rc == 0, err[-2000:]
    assert ct.ssh("systemctl is-active sglang").stdout.strip() == "active"
    code, body = get(ct, "/model_info")
    assert code == 200 and json.loads(body)["model_path"] == path
    assert path in process(ct)[0]


def test_unknown_flag_fails_on_the_controller_before_anything_changes(ct, lab_inventory, runs):
    unit = ct.ssh("sha256sum /etc/systemd/system/sglang.service").stdout
    rc, result, _ = converge(lab_inventory, runs, {"sglang_extra_args": ["--enable-metrix"]})
    assert rc == 1
    message = " ".join(f["message"] for f in result["failures"])
    assert "SGLang 0.5.23 has no flag --enable-metrix" in message
    assert ct.ssh("sha256sum /etc/systemd/system/sglang.service").stdout == unit


def test_a_server_that_never_becomes_ready_fails_within_the_timeout(ct, lab_inventory, runs):
    start = time.monotonic()
    rc, result, _ = converge(lab_inventory, runs, {"sglang_environment": {"SGLANG_LABSERVER_STARTUP_S": "100000"},
                                                   "sglang_ready_timeout": 15})  # fmt: skip
    elapsed = time.monotonic() - start
    assert rc == 1
    message = " ".join(f["message"] for f in result["failures"])
    assert "did not become ready on /health_generate within 15s" in message
    assert "Load weight begin" in message, "the journal tail must be shown"
    assert elapsed < 150


def test_service_comes_back_by_itself_after_the_container_reboots(ct, lab_inventory, runs):
    rc, _, err = converge(lab_inventory, runs, {})
    assert rc == 0, err[-2000:]
    old = ct.boot_id()
    ct.ssh("systemctl reboot", timeout=20)
    ct.wait_for_ssh(120, not_boot_id=old)
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline and get(ct, "/health", key=None)[0] != 200:
        time.sleep(2)
    assert ct.ssh("systemctl is-active sglang").stdout.strip() == "active"
    assert get(ct, "/health", key=None)[0] == 200
