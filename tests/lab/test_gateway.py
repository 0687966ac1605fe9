"""SGLang's gateway in front of two workers (`provision lab up --containers 2 --gateway`): the real smg 1.13.0 from its
wheel, in a container of its own, in front of the SGLang stand-in in sglang-01 and sglang-02. The gateway phase
converges and then changes nothing; verify checks the gateway's view and asks through it; a flag change restarts the
workers one at a time through the gateway while SGLang's own benchmark client sends requests through it, and the
client sees no failure; the last healthy worker is refused unless the inventory says otherwise; a worker killed hard
under load comes back into the gateway with the next apply; a gateway host that cannot sandbox a unit (no nesting)
is refused in one line; a rollout stopped half-way is finished by the next apply; the nodes and containers rebooted
one at a time under load fail no request; a retire of both workers is refused before either is touched, and one
worker retired under load leaves with no failed request; and the benchmark through the gateway reports 1 worker
against 2. The figures mean nothing (the stand-in has no model); what each step did is what the tests hold."""

from __future__ import annotations

import json
import shlex
import time
from pathlib import Path

import pytest

from provision.errors import EXIT_OK, EXIT_REGRESSION
from provision.lab.lab import GATEWAY_NAME, inventory_dir
from tests.conftest import run_provision
from tests.lab.common import apply, interrupt_at, set_host_vars

LAB_CHANGES = {"down"}  # tests/lab/conftest.py: it leaves no lab behind
LAB_NODES = "nspawn"  # no bootloader, no kernel line changed: nodes as nspawn containers (docs/lab.md)

WORKERS = ("sglang-01", "sglang-02")
HOSTS = ("pve-grub", "pve-sdboot", *WORKERS, GATEWAY_NAME)
GATEWAY_LOG = "journalctl -u sglang-gateway -o cat --no-pager"
WORKERS_VIEW = (
    'curl -s -H "Authorization: Bearer $(cut -d: -f4 /etc/sglang-gateway/control-plane-key)" '
    "http://127.0.0.1:30000/workers"
)
# SGLang's benchmark client on the gateway, as `provision bench --through-gateway` installed it, with the key the
# launcher reads from the gateway's file: C requests at a time through the gateway
CLIENT = (
    "env HF_HUB_OFFLINE=1 /var/lib/provision/sglang-bench-client sglang.benchmark.serving --backend sglang "
    "--base-url http://127.0.0.1:30000 --dataset-name random-ids --random-input-len 64 --random-output-len 128 "
    "--random-range-ratio 1 --max-concurrency 4 --tokenizer /srv/models/lab-standin --disable-tqdm"
)


@pytest.fixture(scope="module")
def fleet(lab):
    lab.down(progress=lambda msg: None)
    lab.up(hosts=2, containers=2, gateway=True, nodes="nspawn", progress=lambda msg: print(msg, flush=True))
    yield lab
    for name in HOSTS:  # the variables the tests set: the lab a later module brings up has no such host
        set_host_vars(inventory_dir(), name, None)
    lab.down(progress=lambda msg: None)


@pytest.fixture(scope="module")
def inventory(fleet) -> Path:
    return inventory_dir()


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    return tmp_path_factory.mktemp("gateway-runs")


def gateway(lab):
    return lab.container(GATEWAY_NAME)


def listed(lab) -> dict[str, dict]:
    """The gateway's own view of its workers, by URL."""
    answer = json.loads(gateway(lab).ssh(WORKERS_VIEW).stdout)
    return {w["url"]: w for w in answer["workers"]}


def start_client(lab, name: str, prompts: int, rounds: str = "1") -> None:
    """SGLang's client on the gateway, in the background: `prompts` requests a round, one round, or with rounds
    "until-stopped" a round after another until stop_client; each round appends its summary line to name.jsonl."""
    gw = gateway(lab)
    client = f"{CLIENT} --num-prompts {prompts} --output-file /tmp/{name}.jsonl"
    loop = f"while [ ! -e /tmp/{name}.stop ]; do {client}; done" if rounds == "until-stopped" else client
    gw.ssh(f"rm -f /tmp/{name}.*; cd /tmp; setsid sh -c {shlex.quote(loop)} > /tmp/{name}.log 2>&1 < /dev/null &")
    deadline = time.monotonic() + 120
    while not any(w["load"] for w in listed(lab).values()):  # its first requests are in the gateway
        assert time.monotonic() < deadline, gw.ssh(f"tail -5 /tmp/{name}.log").stdout
        time.sleep(0.5)


def stop_client(lab, name: str) -> None:
    """No round after the one running: it finishes, and its summary counts."""
    gateway(lab).ssh(f"touch /tmp/{name}.stop")


def client_running(lab) -> bool:
    return gateway(lab).ssh("pgrep -f sglang.benchmark.serving").returncode == 0


def client_result(lab, name: str, prompts: int, timeout: float = 600) -> dict:
    """What the client saw over its rounds: requests completed (each round's results.jsonl line) of those sent
    (`prompts` a round), and the error lines of its log."""
    deadline = time.monotonic() + timeout
    while client_running(lab):
        assert time.monotonic() < deadline, "the benchmark client did not finish"
        time.sleep(2)
    gw = gateway(lab)
    rows = [json.loads(line) for line in gw.ssh(f"cat /tmp/{name}.jsonl").stdout.splitlines() if line.strip()]
    assert rows, gw.ssh(f"tail -20 /tmp/{name}.log").stdout
    log = gw.ssh(f"cat /tmp/{name}.log").stdout.splitlines()
    errors = [line for line in log if "rror" in line and "tokenizer config" not in line]
    return {"completed": sum(r["completed"] for r in rows), "sent": prompts * len(rows), "errors": errors}


BENCHED: dict[str, Path] = {}  # the sweeps' baselines, by the number of workers they ran at
REFUSED = (
    "sglang-01: restarting it takes out the last healthy server(s) of gateway sglang-gw (model lab-standin): "
    "sglang-01: every request sent there would fail until they are back. Set sglang_gateway_allow_outage=true to go "
    "on anyway (provision apply -e sglang_gateway_allow_outage=true)"
)
ROLLING = ("out", "restarted", "back")
ROLLING_TASK = {
    "out": "Take the servers out of their gateways, and wait until each sends them nothing new",
    "restarted": "Restart the server (it finishes the requests in flight first)",
    "back": "Put the servers back into their gateways, and wait until each counts them ready and healthy",
}
ROLLING_TASKS = {f"TASK {task}": step for step, task in ROLLING_TASK.items()}


def rolling_steps(progress: str) -> list[tuple[str, str]]:
    """(step, host) of each rolling-restart task that changed a host, in the order apply's progress shows them."""
    steps, task = [], None
    for line in progress.splitlines():
        if line.startswith("TASK "):
            task = ROLLING_TASKS.get(line.strip())
        elif task and line.strip().startswith("changed: "):
            steps.append((task, line.split("changed: ", 1)[1].strip()))
    return steps


def gateway_events(log: str) -> list[str]:
    """The removals, registrations and health changes in the gateway's JSON log lines, one short line each."""
    said = []
    for line in log.splitlines():
        try:
            event = json.loads(line)
        except ValueError:
            continue
        message = event.get("message", "")
        if message.startswith(("Draining", "Worker status transition", "Activated")) or (
            message == "Workflow completed" and event.get("definition_id")
        ):
            fields = {k: event[k] for k in ("worker_url", "old", "new", "definition_id") if k in event}
            said.append(f"{event.get('timestamp')} {message} {fields or ''}".rstrip())
        elif message == "Workflow started":
            said.append(f"{event.get('timestamp')} {message} {event.get('definition_id')}")
    return said


def bench(inventory: Path, runs: Path, *extra: str) -> tuple[int, dict, str]:
    proc = run_provision(
        "bench",
        "--inventory",
        str(inventory),
        "--through-gateway",
        "--json",
        "--runs-dir",
        str(runs),
        *("--concurrency", "1,4,8", "--input-len", "64", "--output-len", "32", "--prompts-per-level", "4"),
        *extra,
        timeout=1800,
    )
    return proc.returncode, json.loads(proc.stdout)["result"] if proc.stdout.strip() else {}, proc.stderr


def test_apply_converges_the_gateway_and_a_second_apply_changes_nothing(fleet, inventory, runs):
    code, _, err = apply(inventory, runs / "first")
    assert code == 0, err[-3000:]
    urls = {f"http://{fleet.container(w).spec.address}:30000" for w in WORKERS}
    seen = listed(fleet)
    assert set(seen) == urls and all(w["status"] == "ready" and w["is_healthy"] for w in seen.values()), seen
    # the key stays in the gateway's files: never on its command line or in its unit
    gw = gateway(fleet)
    key = (fleet.dir / "sglang-api-key").read_text().strip()
    title = gw.ssh("cat /proc/$(systemctl show -p MainPID --value sglang-gateway)/cmdline").stdout
    assert title.replace("\x00", " ").strip() == "smg::router", title
    seen = gw.ssh("cat /etc/systemd/system/*.service; for f in /proc/[0-9]*/cmdline; do tr '\\0' ' ' < $f; done").stdout
    assert "smg::router" in seen and key not in seen
    code, second, err = apply(inventory, runs / "second")
    assert code == 0, err[-3000:]
    assert {h: s["changed"] for h, s in second["hosts"].items()} == dict.fromkeys(HOSTS, 0)


def test_verify_sees_both_workers_healthy_through_the_gateway(fleet, inventory, runs):
    proc = run_provision("verify", "--inventory", str(inventory), "--json", "--runs-dir", str(runs), timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    report = json.loads(proc.stdout)["result"]
    checks = {c["name"]: c for c in report["checks"] if c["host"] == GATEWAY_NAME}
    for name in ("test_gateway_enabled", "test_gateway_listening", "test_answers_through_the_gateway"):
        assert checks[name]["passed"], checks[name]
    assert checks["test_every_worker_registered_and_healthy"]["reason"] == (
        "2 worker(s) ready and healthy: sglang-01, sglang-02"
    )
    fleet_capacity = report["fleet_capacity"][GATEWAY_NAME]
    one = report["capacity"]["sglang-01"]["max_total_num_tokens"]
    assert fleet_capacity["workers"] == list(WORKERS) and fleet_capacity["max_total_num_tokens"] == 2 * one


def test_a_flag_change_restarts_one_worker_at_a_time_and_the_client_sees_no_failure(fleet, inventory, runs):
    code, two, err = bench(inventory, runs)  # installs SGLang's client on the gateway; the sweep at 2 workers
    assert code == 0, err[-3000:]
    BENCHED["two workers"] = Path(two["record_dir"]) / "hosts" / GATEWAY_NAME / "baseline.json"
    gw = gateway(fleet)
    since = gw.ssh("date +%s").stdout.strip()
    start_client(fleet, "rollout", prompts=200, rounds="until-stopped")
    set_host_vars(inventory, "sglang-01", {"sglang_extra_args": ["--enable-metrics"]})
    set_host_vars(inventory, "sglang-02", {"sglang_extra_args": ["--enable-metrics"]})
    code, result, err = apply(inventory, runs / "rollout")
    assert code == 0, err[-3000:]
    stop_client(fleet, "rollout")  # it sent requests the whole time: its last round ends after the rollout did
    summary = client_result(fleet, "rollout", 200)
    print(f"\nclient through the rollout: {summary['completed']} of {summary['sent']} completed", flush=True)
    assert summary["completed"] == summary["sent"] > 0 and summary["errors"] == [], summary
    assert {h: s["changed"] > 0 for h, s in result["hosts"].items() if h in WORKERS} == dict.fromkeys(WORKERS, True)
    # one worker at a time: out of the gateway, restarted, back in, then the next
    order = rolling_steps(err)
    first, second = order[0][1], order[3][1]
    assert order == [(step, host) for host in (first, second) for step in ROLLING] and first != second, order
    log = gw.ssh(f"{GATEWAY_LOG} --since @{since}").stdout
    assert log.count("Draining 1 worker(s) for 5s before removal") == 2, log[-3000:]
    assert log.count('"definition_id":"worker_registration"') == 2, log[-3000:]
    print("the gateway's log of the rollout:", *gateway_events(log), sep="\n  ", flush=True)
    for url, seen in listed(fleet).items():
        assert seen["status"] == "ready" and seen["is_healthy"], (url, seen)


def test_the_last_healthy_worker_is_refused_unless_the_inventory_allows_it(fleet, inventory, runs):
    # the gateway fronts one worker: sglang-02 serves another model, and the gateway takes it out
    set_host_vars(inventory, "sglang-02", {"sglang_served_model_name": "lab-other"})
    set_host_vars(inventory, GATEWAY_NAME, {"sglang_gateway_model": "lab-standin"})
    code, _, err = apply(inventory, runs / "one")
    assert code == 0, err[-3000:]
    assert list(listed(fleet)) == [f"http://{fleet.container('sglang-01').spec.address}:30000"]
    # the sweep at 1 worker against the one at 2 (the flag change's test): the report's table and chart. Whether it
    # calls the difference a regression (exit 3) says nothing here: the stand-in's figures follow this machine's load
    code, one, err = bench(inventory, runs / "bench-one", "--baseline", str(BENCHED["two workers"]))
    assert code in (EXIT_OK, EXIT_REGRESSION), err[-3000:]
    host_dir = Path(one["record_dir"]) / "hosts" / GATEWAY_NAME
    report = (host_dir / "report.md").read_text()
    print("\n" + report, flush=True)
    assert "in front of 1 worker(s): sglang-01" in report
    assert "## Throughput against the number of workers (2 workers, then 1 worker)" in report
    assert (host_dir / "throughput.png").read_bytes()[:4] == b"\x89PNG"
    set_host_vars(inventory, "sglang-01", {"sglang_extra_args": ["--enable-metrics", "--log-requests"]})
    code, refused, err = apply(inventory, runs / "refused")
    assert code != 0
    said = [(f["host"], f["message"]) for f in refused["failures"]]
    assert said == [("sglang-01", REFUSED)], err[-3000:]
    assert [w["status"] for w in listed(fleet).values()] == ["ready"]  # refused before it was taken out
    code, _, err = apply(inventory, runs / "allowed", "-e", "sglang_gateway_allow_outage=true")
    assert code == 0, err[-3000:]
    # both workers again
    set_host_vars(inventory, "sglang-02", {"sglang_extra_args": ["--enable-metrics", "--log-requests"]})
    set_host_vars(inventory, GATEWAY_NAME, None)
    code, _, err = apply(inventory, runs / "two")
    assert code == 0, err[-3000:]
    assert len(listed(fleet)) == 2


def test_a_rollout_stopped_with_a_worker_out_is_finished_by_the_next_apply(fleet, inventory, runs, tmp_path):
    """SIGINT while the first worker restarts, out of the gateway: the run says so, the gateway lists the other
    worker alone, and the next apply, the sglang phase as recorded, puts the first back (the gateway phase sees the
    mark the rollout left on the gateway's host)."""
    flags = ["--enable-metrics", "--log-requests", "--enable-cache-report"]
    for name in WORKERS:
        set_host_vars(inventory, name, {"sglang_extra_args": flags})
    summary = interrupt_at(inventory, runs, tmp_path, "sglang-01", ROLLING_TASK["restarted"])
    left = summary["stopped_at"]["sglang-01"]["leaves"]
    # SIGINT reaches the run in the restart, or in the readiness wait after it: the server is out of its gateways then
    assert left.startswith("SGLang service") and left.endswith("the next run puts it back"), left
    out = fleet.container("sglang-01").spec.address
    assert f"http://{out}:30000" not in listed(fleet) and len(listed(fleet)) == 1
    assert gateway(fleet).ssh("ls /var/lib/provision/sglang-gateway-out").stdout.split() == ["sglang-01"]
    code, _, err = apply(inventory, runs / "after-interrupt")
    assert code == 0, err[-3000:]
    seen = listed(fleet)
    assert len(seen) == 2 and all(w["status"] == "ready" and w["is_healthy"] for w in seen.values()), seen
    assert gateway(fleet).ssh("ls -A /var/lib/provision/sglang-gateway-out 2>/dev/null").stdout == ""


def test_rebooting_each_node_and_container_takes_its_workers_out_first_and_the_client_sees_no_failure(
    fleet, inventory, runs
):
    """`provision verify --after-reboot` while SGLang's client sends requests through the gateway: the workers
    alternate nodes (pve-grub holds sglang-01, pve-sdboot sglang-02), each leaves the gateway before its node, and
    then itself, reboots, and joins it again once it serves."""
    start_client(fleet, "reboots", prompts=200, rounds="until-stopped")
    proc = run_provision(
        "verify",
        "--inventory",
        str(inventory),
        "--after-reboot",
        "--yes",
        "--json",
        "--runs-dir",
        str(runs),
        timeout=1200,
    )
    report = json.loads(proc.stdout)["result"]
    assert proc.returncode == 0, (report.get("reboot_failures"), proc.stderr[-3000:])
    stop_client(fleet, "reboots")
    summary = client_result(fleet, "reboots", 200)
    print(f"\nclient through the rolling reboot: {summary['completed']} of {summary['sent']} completed", flush=True)
    assert summary["completed"] == summary["sent"] > 0 and summary["errors"] == [], summary
    for node in ("pve-grub", "pve-sdboot"):
        assert any(m.startswith("SGLang serving again after the reboot") for m in report["reboots"][node]), node


def test_a_worker_killed_hard_under_load_is_back_in_the_gateway_after_apply(fleet, inventory, runs):
    start_client(fleet, "killed", prompts=400)
    fleet.container("sglang-02").ssh("systemctl kill -s KILL sglang")
    summary = client_result(fleet, "killed", 400)
    print(
        f"\nclient with sglang-02 killed: {summary['completed']} of {summary['sent']} completed; "
        f"errors: {summary['errors'][:3]}",
        flush=True,
    )
    assert summary["completed"] > 0
    code, _, err = apply(inventory, runs / "after-kill")
    assert code == 0, err[-3000:]
    seen = listed(fleet)
    assert len(seen) == 2 and all(w["status"] == "ready" and w["is_healthy"] for w in seen.values()), seen


NO_SANDBOX = (
    "sglang-gw: systemd cannot sandbox the gateway's unit on this host: a unit with ProtectSystem=strict and "
    "PrivateTmp= failed before it ran, with status 226/NAMESPACE; on a Proxmox CT, set features nesting=1 (pct set "
    "<vmid> --features nesting=1) and restart it"
)


def test_a_gateway_host_without_nesting_is_refused_before_anything_changes(fleet, inventory, runs):
    """The gateway's container restarted without `features: nesting=1`: a sandboxed unit fails there at step
    NAMESPACE, as in an unprivileged PVE CT. The gateway phase says so in one line, naming the host and the setting,
    and leaves the unit as it was; with nesting back, the next apply serves through the gateway again."""
    gw = gateway(fleet)
    unit_before = gw.ssh("systemctl cat sglang-gateway").stdout
    for nesting in (False, True):
        gw.stop()
        gw.configure(devices=[], nesting=nesting, driver_version=None)
        gw.start()
        gw.wait_for_ssh(120)
        code, result, err = apply(inventory, runs / f"nesting-{nesting}", "--tags", "gateway")
        if not nesting:
            said = [(f["host"], f["message"]) for f in result["failures"]]
            print(f"\nthe gateway's host without nesting: {said}", flush=True)
            assert code == 1, err[-3000:]
            assert said == [(GATEWAY_NAME, NO_SANDBOX)], err[-3000:]
            assert gw.ssh("systemctl cat sglang-gateway").stdout == unit_before
    assert code == 0, err[-3000:]
    seen = listed(fleet)
    assert len(seen) == 2 and all(w["status"] == "ready" and w["is_healthy"] for w in seen.values()), seen


RETIRE_REFUSED = (
    "sglang-01: retiring them takes out the last healthy server(s) of gateway sglang-gw (model lab-standin): "
    "sglang-01, sglang-02: every request sent there would fail until they are back. Set "
    "sglang_gateway_allow_outage=true to go on anyway (provision retire -e sglang_gateway_allow_outage=true)"
)


def retire(inventory: Path, runs: Path, limit: str) -> tuple[int, dict, str]:
    args = ("--inventory", str(inventory), "--limit", limit, "--yes", "--json", "--runs-dir", str(runs))
    proc = run_provision("retire", *args, timeout=900)
    return proc.returncode, json.loads(proc.stdout)["result"] if proc.stdout.strip() else {}, proc.stderr


def test_a_retire_of_every_worker_is_refused_and_one_worker_leaves_under_load_with_no_failure(fleet, inventory, runs):
    """`provision retire` of both workers is refused in one line before either is touched (they are the gateway's
    last healthy servers); a retire of sglang-01 while SGLang's client sends requests through the gateway takes it out
    of the gateway before its service stops, and the client sees no failure. `apply` brings it back."""
    code, refused, err = retire(inventory, runs, ",".join(WORKERS))
    assert code == 1, err[-3000:]
    assert [(f["host"], f["message"]) for f in refused["failures"]] == [("sglang-01", RETIRE_REFUSED)]
    assert len(listed(fleet)) == 2 and all(
        fleet.container(name).ssh("systemctl is-active sglang").stdout.strip() == "active" for name in WORKERS
    )
    start_client(fleet, "retire", prompts=100, rounds="until-stopped")
    code, _, err = retire(inventory, runs, "sglang-01")
    stop_client(fleet, "retire")
    summary = client_result(fleet, "retire", 100)
    print(f"\nclient through the retire: {summary['completed']} of {summary['sent']} completed", flush=True)
    assert code == 0, err[-3000:]
    assert summary["completed"] == summary["sent"] > 0 and summary["errors"] == [], summary
    assert list(listed(fleet)) == [f"http://{fleet.container('sglang-02').spec.address}:30000"]
    assert fleet.container("sglang-01").ssh("test -e /etc/systemd/system/sglang.service").returncode == 1
    assert gateway(fleet).ssh("ls -A /var/lib/provision/sglang-gateway-out 2>/dev/null").stdout == ""
    code, again, err = retire(inventory, runs, "sglang-01")
    assert code == 0 and again["hosts"]["sglang-01"]["changed"] == 0, (again.get("hosts"), err[-3000:])
    code, _, err = apply(inventory, runs / "after-retire")
    assert code == 0, err[-3000:]
    seen = listed(fleet)
    assert len(seen) == 2 and all(w["status"] == "ready" and w["is_healthy"] for w in seen.values()), seen


def test_no_key_in_any_run_record(fleet, runs):
    """Every apply, verify, retire and bench above, the rollouts and the refusal among them: neither the API key nor the
    gateway's control-plane key is in their records."""
    keys = [(fleet.dir / "sglang-api-key").read_text().strip()]
    keys.append(gateway(fleet).ssh("cut -d: -f4 /etc/sglang-gateway/control-plane-key").stdout.strip())
    assert all(len(key) > 16 for key in keys)
    for path in (p for p in runs.rglob("*") if p.is_file()):
        text = path.read_text(errors="replace")
        assert not [key for key in keys if key in text], path
