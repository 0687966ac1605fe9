"""The SGLang phase in the lab container, with the lab's stand-in installed through the role's real
install path (a local wheelhouse), on a real systemd."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from provision.lab import wheelhouse
from tests.conftest import run_provision
from tests.lab.common import apply, ensure_converged, interrupt_at, pve_api, set_host_vars, wait_task
from tests.processes import start_apply, wait_for_task

LAB_CHANGES = {"sglang", "ct"}  # tests/lab/conftest.py
LAB_NODES = "nspawn"  # no bootloader, no kernel line changed: nodes as nspawn containers (docs/lab.md)

API_KEY = "lab-key-" + "5b1e0c77"
# An environment variable whose name does not look secret: provision knows the key only by rendering
# sglang_api_key (provision/secrets.py), and the host-side scrub of the journal hides it too
KEY_VARS = {"sglang_api_key": "{{ lookup('ansible.builtin.env', 'LAB_SERVING_CREDENTIAL') }}"}
ENV = {"LAB_SERVING_CREDENTIAL": API_KEY}
HF_SECRET = "hf_lab" + "Q7c2d9e"
VENV_PY = "/opt/sglang/venv/bin/python"


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    return tmp_path_factory.mktemp("sglang-runs")


@pytest.fixture(scope="module")
def ct(lab, lab_inventory, runs):
    ensure_converged(lab, lab_inventory, runs, "kernel", "gpu")  # the sglang phase starts from both
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


def venv_env(ct, name: str) -> str:
    """What a Python started from the venv by hand (root's login, no unit) sees in its environment."""
    code = f'import os; print(os.environ.get("{name}"))'
    return ct.ssh(f"env -u {name} {VENV_PY} -c '{code}'").stdout.strip()


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
    # any Python started from the venv, outside the unit, gets it (a venv sitecustomize.py never ran on Debian)
    assert venv_env(ct, "NCCL_P2P_DISABLE") == "1"
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


def journal_until(ct, since: str, text: str, timeout: float = 60) -> str:
    """The service's journal since `since` (epoch seconds on the CT) once it holds `text`."""
    deadline = time.monotonic() + timeout
    while True:
        out = ct.ssh(f"journalctl -u sglang --since @{since} -o cat").stdout
        if text in out or time.monotonic() > deadline:
            return out
        time.sleep(1)


def test_triton_needs_the_compiler_and_headers_the_role_installs(ct, lab_inventory, runs):
    """The container is made from the lab's template, which has neither a C compiler nor Python.h, and whose only
    apt source is a local mirror. The stand-in builds a C launcher at its first generate as Triton does: with the
    headers package removed (and Triton's cache emptied) it fails naming Python.h, with the compiler removed it
    fails as Triton does without one. An apply told to install nothing stops once the server has exited
    sglang_ready_exits times, with Triton's line, instead of waiting out sglang_ready_timeout; the real apply
    installs both again and the server serves."""
    vars_ = {"sglang_p2p": "off", "sglang_tp_size": 2}
    no_header = "cuda_utils.c:7:10: fatal error: Python.h: No such file or directory"  # Triton 3.6.0's, on an H100
    for package, missing in (("libpython3.11-dev", no_header), ("gcc", "RuntimeError: Failed to find C compiler")):
        since = ct.ssh("date +%s").stdout.strip()
        removed = ct.ssh(f"apt-get remove -y {package} && rm -rf /var/lib/sglang/.triton && systemctl restart sglang")
        assert removed.returncode == 0, removed.stderr
        assert missing in journal_until(ct, since, missing), f"{package} removed, yet no '{missing}'"
    start = time.monotonic()
    rc, result, _ = converge(lab_inventory, runs, {**vars_, "sglang_runtime_packages": []})
    message = " ".join(f["message"] for f in result["failures"])
    assert rc == 1 and "sglang exited 3 times (sglang_ready_exits) before it became ready" in message, message
    assert "Failed to find C compiler" in message and time.monotonic() - start < 150
    rc, _, err = converge(lab_inventory, runs, vars_)
    assert rc == 0, err[-3000:]
    assert ct.ssh("test -x /usr/bin/gcc && test -f /usr/include/python3.11/Python.h").returncode == 0
    assert get(ct, "/health_generate", key=None)[0] == 200


def test_changing_one_flag_restarts_exactly_once(ct, lab_inventory, runs):
    since = ct.ssh("date +%s").stdout.strip()
    time.sleep(1)
    rc, _, err = converge(
        lab_inventory, runs, {"sglang_p2p": "off", "sglang_tp_size": 2, "sglang_extra_args": ["--enable-metrics"]}
    )
    assert rc == 0, err[-2000:]
    starts = ct.ssh(f"journalctl -u sglang --since @{since} -o cat | grep -c 'Started sglang.service'").stdout
    assert starts.strip() == "1"
    assert "--enable-metrics" in process(ct)[0]
    assert get(ct, "/metrics")[0] == 200


# the restart of a server no gateway sends requests to (roles/sglang tasks/restart.yml)
RESTART = "Restart the server at once (no running gateway sends it requests)"
INSTALL = "Install SGLang into its venv"


def test_sigint_while_the_service_restarts_then_a_rerun_serves_again(ct, lab_inventory, runs, tmp_path):
    """SIGINT in the sglang phase: while the service restarts for a changed unit. Exit 130, no process of the
    run left, the record `interrupted` naming the task and what it leaves, no host lock; the re-run serves."""
    changed = {
        "sglang_p2p": "off",
        "sglang_tp_size": 2,
        "sglang_extra_args": ["--enable-metrics"],
        "sglang_timeout_stop_sec": 123,
    }
    set_host_vars(lab_inventory, "sglang-01", {**KEY_VARS, **changed})
    summary = interrupt_at(lab_inventory, runs, tmp_path, "sglang-01", RESTART, "--tags", "sglang", env=ENV)
    stopped = summary["stopped_at"]["sglang-01"]
    # the restart itself is quick: the signal may land in it or in the task after it
    assert stopped["role"].endswith("sglang") and stopped["leaves"], stopped
    if stopped["task"] == RESTART:
        assert stopped["leaves"].startswith("SGLang service restart"), stopped
    assert "lock.json" not in ct.ssh("ls /var/lib/provision").stdout, "host lock left"
    rc, _, err = converge(lab_inventory, runs, changed)
    assert rc == 0, err[-2000:]
    assert show(ct, "TimeoutStopUSec") == "2min 3s" and show(ct, "ActiveState") == "active"
    assert get(ct, "/health_generate", key=None)[0] == 200


def test_the_container_stopped_mid_install_is_named_and_a_rerun_converges(lab, ct, lab_inventory, runs, tmp_path):
    """The fault matrix: the container stopped (through the API, as `pct stop`) while the phase installs SGLang.
    The run fails on that host with one line; once the container is started again (as the user would), a re-run
    converges: it installs again and serves."""
    set_host_vars(lab_inventory, "sglang-01", {**KEY_VARS, "sglang_p2p": "off", "sglang_tp_size": 2})
    api = pve_api(lab)
    lxc = api.nodes("pve-grub").lxc(101)
    out = tmp_path / "stopped.json"
    # the install has work to do (the server's package gone from the venv): the stop lands during or right after it
    ct.ssh(f"{VENV_PY} -m pip uninstall -y -q {wheelhouse.STANDIN_NAME}")
    proc = start_apply(lab_inventory, runs, out, "--tags", "sglang", "--full", env=ENV)
    try:
        wait_for_task(proc, "sglang-01", INSTALL)
        assert wait_task(api, "pve-grub", lxc.status.stop.post())["exitstatus"] == "OK"
        assert proc.wait(timeout=600) == 1
    finally:
        proc.kill()
        if lxc.status.current.get()["status"] != "running":
            wait_task(api, "pve-grub", lxc.status.start.post())
    result = json.loads(out.read_text())["result"]
    # where the stop lands varies: pip killed by the container's shutdown (the task fails with pip's words), the
    # connection lost in the middle of the call (unreachable, runner.unreachable_message's line), or the next task
    # refused by the stopped container's address (unreachable, ssh's own line)
    assert result["hosts"]["sglang-01"]["status"] in ("failed", "unreachable"), result["hosts"]
    (failure,) = result["failures"]
    assert failure["host"] == "sglang-01" and failure["message"], failure
    assert "file a bug" not in failure["message"] and "\n" not in failure["message"], failure
    ct.wait_for_ssh(120)
    rc, _, err = converge(lab_inventory, runs, {"sglang_p2p": "off", "sglang_tp_size": 2})
    assert rc == 0, err[-2000:]
    assert get(ct, "/health_generate", key=None)[0] == 200


def test_stop_drains_the_request_in_flight(ct):
    """SGLang's scheduler and detokenizer have no SIGTERM handler: under KillMode=control-group they
    die at once and the request fails; with KillMode=mixed only the main process drains."""
    body = json.dumps({"text": "go", "sampling_params": {"max_new_tokens": 2500, "ignore_eos": True}})
    script = (
        f"curl -sS -H 'Authorization: Bearer {API_KEY}' -d '{body}' http://127.0.0.1:30000/generate"
        " > /tmp/drain.out 2> /tmp/drain.err\necho $? > /tmp/drain.rc\n"
    )
    ct.ssh(f"rm -f /tmp/drain.*; cat > /tmp/drain.sh <<'EOF'\n{script}EOF\nnohup sh /tmp/drain.sh > /dev/null 2>&1 &")
    try:
        time.sleep(1.5)  # 2500 tokens take about 5 s
        ct.ssh("systemctl stop sglang", timeout=120)
        for _ in range(20):
            if ct.ssh("test -s /tmp/drain.rc").returncode == 0:
                break
            time.sleep(0.5)
        rc = ct.ssh("cat /tmp/drain.rc").stdout.strip()
        out, err = ct.ssh("cat /tmp/drain.out").stdout, ct.ssh("cat /tmp/drain.err").stdout
        assert rc == "0", f"the request in flight failed during the stop: curl rc {rc}: {err.strip()}"
        assert json.loads(out)["meta_info"]["completion_tokens"] == 2500
    finally:
        ct.ssh("systemctl start sglang")


def test_the_key_leaks_from_sglang_but_from_nothing_provision_writes(ct, lab_inventory, runs):
    """The stand-in echoes the key as 0.5.23 does; the unit, its world-readable properties, the run
    record and the console must not hold the key nor a secret sglang_environment value."""
    record_dir = runs / "secrets"
    record_dir.mkdir()
    rc, result, err = converge(lab_inventory, record_dir, {"sglang_environment": {"HF_TOKEN": HF_SECRET}})
    assert rc == 0, err[-2000:]
    code, body = get(ct, "/server_info")
    info = json.loads(body)
    assert code == 200 and info["api_key"] == API_KEY and f"--api-key {API_KEY}" in info["launch_command"]
    assert process(ct)[1].get("HF_TOKEN") == HF_SECRET, "the environment must still reach the server"
    unit = "/etc/systemd/system/sglang.service"
    assert ct.ssh(f"stat -c %a {unit}").stdout.strip() == "644"
    readable = ct.ssh(f"cat {unit}; systemctl show sglang").stdout
    assert API_KEY not in readable and HF_SECRET not in readable
    env_file = ct.ssh("stat -c '%a %U' /etc/sglang/environment").stdout.strip()
    assert env_file == "600 root"
    assert ct.ssh("runuser -u sglang -- cat /etc/sglang/environment").returncode != 0
    console = json.dumps(result) + err
    records = "".join(p.read_text(errors="replace") for p in record_dir.rglob("*") if p.is_file())
    for secret in (API_KEY, HF_SECRET):
        assert secret not in console and secret not in records


def test_api_key_in_extra_args_and_newlines_are_refused_by_variable_name(ct, lab_inventory, runs):
    unit = ct.ssh("sha256sum /etc/systemd/system/sglang.service").stdout
    rc, result, _ = converge(lab_inventory, runs, {"sglang_extra_args": ["--api-key", "sk-on-argv"]})
    assert rc == 1
    assert "sglang_extra_args holds --api-key" in " ".join(f["message"] for f in result["failures"])
    injected = "/srv/models/m\nExecStartPre=/bin/touch /tmp/injected"
    rc, _, err = converge(lab_inventory, runs, {"sglang_model_path": injected})
    # a literal newline: the inventory check refuses it on the controller, naming the file, before any host
    assert rc == 2 and "host_vars/sglang-01.yml:" in err and "sglang_model_path holds a control character" in err
    # one that a template renders from the inventory alone: the inventory check renders it, by the same rule
    templated = "{{ '/srv/models/m%cExecStartPre=/bin/touch /tmp/injected' % 10 }}"  # 10: a newline
    rc, _, err = converge(lab_inventory, runs, {"sglang_model_path": templated})
    assert rc == 2 and "host_vars/sglang-01.yml:" in err and "sglang_model_path holds a control character" in err
    # one that only the play renders (it reads the host's facts): the role's preflight refuses it, by the same rule
    rc, result, _ = converge(
        lab_inventory, runs, {"sglang_model_path": templated + "{{ ansible_facts.no_such | default('') }}"}
    )
    assert rc == 1
    assert "sglang_model_path holds a control character" in " ".join(f["message"] for f in result["failures"])
    assert ct.ssh("sha256sum /etc/systemd/system/sglang.service").stdout == unit


def test_policy_on_has_neither_the_variable_nor_the_flags(ct, lab_inventory, runs):
    rc, _, err = converge(lab_inventory, runs, {"sglang_p2p": "on", "sglang_tp_size": 2})
    assert rc == 0, err[-2000:]
    argv, env = process(ct)
    assert "NCCL_P2P_DISABLE" not in env
    assert "--disable-custom-all-reduce" not in argv and "--enforce-disable-flashinfer-allreduce-fusion" not in argv
    assert venv_env(ct, "NCCL_P2P_DISABLE") == "None"


VERDICT = "/var/lib/provision/gpu-diag.json"


def auto_report(result) -> str:
    return next(m for m in result["reports"]["sglang-01"] if m.startswith("sglang_p2p auto"))


def test_auto_turns_p2p_off_for_pcie_peers_behind_a_translating_iommu(ct, lab_inventory, runs):
    # the lab's nvidia-smi reports PHB between the two GPUs (--gpu-link pcie), its node logs "Translated"
    ct.ssh(f"rm -f {VERDICT}")
    rc, result, err = converge(lab_inventory, runs, {"sglang_p2p": "auto"})
    assert rc == 0, err[-2000:]
    assert auto_report(result) == (
        "sglang_p2p auto -> off: PCIe peers (GPU0-GPU1 PHB) behind a translating IOMMU (default domain "
        "Translated); no diagnostic verdict (provision diag)"
    )
    assert process(ct)[1]["NCCL_P2P_DISABLE"] == "1"


def test_a_verdict_counts_only_in_the_context_it_was_taken_in(lab, ct, lab_inventory, runs, tmp_path):
    # provision diag stores the verdict with its context (the lab has no torch, so the verdict is no-gpu, which
    # is kept as the last run's and never becomes the one the policy reads)
    set_host_vars(lab_inventory, "sglang-01", {**KEY_VARS})
    proc = run_provision(
        "diag",
        "--inventory",
        str(lab_inventory),
        "--limit",
        "sglang-01",
        "--json",
        "--runs-dir",
        str(tmp_path),
        env=ENV,
        timeout=600,
    )
    stored = json.loads(ct.ssh("cat /var/lib/provision/gpu-diag-last.json").stdout)
    assert stored["verdict"] == "no-gpu", proc.stdout[-1500:] + proc.stderr[-1500:]
    assert ct.ssh(f"test -e {VERDICT}").returncode == 1
    node = lab.vm(lab.state()["vms"][0]["name"])  # the container's node
    context = stored["context"]
    assert context["boot_id"] == node.ssh("cat /proc/sys/kernel/random/boot_id").stdout.strip()
    assert context["cmdline"] == node.ssh("cat /proc/cmdline").stdout.strip()
    assert context["gpus"] == ["0000:41:00.0", "0000:42:00.0"]
    assert context["iommu"] == "default domain Translated" and context["driver_version"]
    healthy = {**stored, "verdict": "healthy", "reason": "every peer copy was bit-exact"}
    try:
        # a healthy verdict from another boot of the node leaves P2P off, and says why
        planted = {**healthy, "context": {**context, "boot_id": "5b0e2c4f-0000-4000-8000-000000000000"}}
        ct.ssh(f"cat > {VERDICT} <<'EOF'\n{json.dumps(planted)}\nEOF")
        rc, result, err = converge(lab_inventory, runs, {"sglang_p2p": "auto"})
        assert rc == 0, err[-2000:]
        assert auto_report(result) == (
            "sglang_p2p auto -> off: PCIe peers (GPU0-GPU1 PHB) behind a translating IOMMU (default domain "
            "Translated); the diagnostic verdict healthy is stale: the node's boot id (it rebooted since) changed "
            "since it was taken"
        )
        assert process(ct)[1]["NCCL_P2P_DISABLE"] == "1"
        # the same verdict in the context the diagnostic recorded turns it on
        ct.ssh(f"cat > {VERDICT} <<'EOF'\n{json.dumps(healthy)}\nEOF")
        rc, result, err = converge(lab_inventory, runs, {"sglang_p2p": "auto"})
        assert rc == 0, err[-2000:]
        assert auto_report(result) == (
            "sglang_p2p auto -> on: PCIe peers (GPU0-GPU1 PHB) behind a translating IOMMU (default domain "
            "Translated); diagnostic verdict healthy in this context: every peer copy was bit-exact"
        )
        assert "NCCL_P2P_DISABLE" not in process(ct)[1]
        # a verdict binds P2P to the boot it was taken in: the unit's start guard compares the container's own boot
        # id (LXC and nspawn give each container start a fresh one), so a restart of the unit alone keeps it on
        assert ct.ssh("systemctl restart sglang").returncode == 0
        assert "NCCL_P2P_DISABLE" not in process(ct)[1]
    finally:
        ct.ssh(f"rm -f {VERDICT}")


def test_nvlink_peers_keep_p2p_on_without_a_verdict(lab, ct, lab_inventory, runs):
    lab.set_gpu_link("nvlink")  # as `provision lab up --gpu-link nvlink` would have it
    try:
        ct.ssh(f"rm -f {VERDICT} /var/lib/provision/fingerprint/sglang.json")  # new hardware: decide again
        rc, result, err = converge(lab_inventory, runs, {"sglang_p2p": "auto"})
        assert rc == 0, err[-2000:]
        assert auto_report(result) == (
            "sglang_p2p auto -> on: every GPU pair is joined by NVLink (GPU0-GPU1 NV18), which does not pass "
            "through the IOMMU"
        )
        assert "NCCL_P2P_DISABLE" not in process(ct)[1]
    finally:
        lab.set_gpu_link("pcie")
        ct.ssh("rm -f /var/lib/provision/fingerprint/sglang.json")


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
    assert f"SGLang {wheelhouse.SGLANG_VERSION} has no flag --enable-metrix" in message
    assert ct.ssh("sha256sum /etc/systemd/system/sglang.service").stdout == unit


def vaulted_host_vars(inv, tmp_path, host_vars: dict) -> list[str]:
    """host_vars/sglang-01.yml with sglang_api_key as a `!vault` value; returns apply's extra arguments."""
    import subprocess
    import sys

    import yaml

    password = tmp_path / "vault-password"
    password.write_text("lab-vault-" + "pw\n")
    vault = Path(sys.executable).with_name("ansible-vault")
    encrypted = subprocess.run(
        [str(vault), "encrypt_string", "--vault-password-file", str(password), "--stdin-name", "sglang_api_key"],
        input=API_KEY,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    path = inv / "host_vars" / "sglang-01.yml"
    path.parent.mkdir(exist_ok=True)
    path.write_text(encrypted + "\n" + yaml.safe_dump(host_vars))
    return ["--vault-password-file", str(password)]


@pytest.mark.parametrize("source", ["env", "vault"])
def test_a_server_that_never_becomes_ready_fails_within_the_timeout(ct, lab_inventory, runs, tmp_path, source):
    record_dir = runs / f"never-ready-{source}"
    record_dir.mkdir()
    start = time.monotonic()
    never = {"sglang_environment": {"SGLANG_LABSERVER_STARTUP_S": "100000"}, "sglang_ready_timeout": 15}
    if source == "env":
        rc, result, err = converge(lab_inventory, record_dir, never)
    else:  # the key from ansible-vault: nothing about its name or source tells a scrubber it is secret
        extra = vaulted_host_vars(lab_inventory, tmp_path, never)
        rc, result, err = apply(lab_inventory, record_dir, "--tags", "sglang", *extra)
    elapsed = time.monotonic() - start
    assert rc == 1
    message = " ".join(f["message"] for f in result["failures"])
    assert "did not become ready on /health_generate within 15s" in message
    assert "Load weight begin" in message, "the journal tail must be shown"
    # SGLang logs server_args, api_key included, before loading: the tail shows it, without the key
    assert "server_args=" in message and "<redacted>" in message
    records = "".join(p.read_text(errors="replace") for p in record_dir.rglob("*") if p.is_file())
    assert API_KEY not in message and API_KEY not in json.dumps(result) + err and API_KEY not in records
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
