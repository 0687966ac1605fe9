"""`provision verify`: run the packaged check suites against every host.

Every host is read once, all hosts at once, by playbooks/verify_probe.yml through `run_playbook`:
the same Ansible connection as apply (templated `ansible_host`, `ansible_password`, become, a
bastion in ssh_args, vaulted connection variables). What each host returned, handed back as the
run's stats (`readings`), goes to one file; one pytest process (the plugin `checks/plugin.py`) then decides each
check per host from it, but for the checks that ask the host through testinfra's `host` (over the host's Ansible
connection plugin, in the run's Ansible environment: `runner.adhoc_environment`, checks/connection.py), and the
user's own check files (`user_checks`); the JUnit XML it writes becomes the report's checks.
Each container's capacity is computed from the same reading (`capacity_of`, provision/capacity.py), which
is all `provision capacity` asks for (`capacity_report`). A host that cannot be read shows up as failed
checks naming the reason (the connection error, or the probe's own).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from pathlib import Path

from provision import capacity, child_warnings
from provision import inventory as inventory_mod
from provision import runner as runner_mod
from provision.checks import next_boot
from provision.checks.support import (
    DEFAULT_STATE_DIR,
    GATEWAY_STATE,
    HOST_VARS,
    INVENTORY_ENV,
    cannot_read,
    no_sglang,
    probe_request,
)
from provision.errors import UsageError, one_line
from provision.job_events import run_stats
from provision.paths import module_util
from provision.progress import SILENT, Progress
from provision.record import DEFAULT_RUNS_DIR, RunRecord
from provision.runner import RunResult, command_said, run_playbook

CHECKS_DIR = Path(__file__).resolve().parent / "checks"
# group -> suites run on its hosts
SUITES = {
    inventory_mod.PROXMOX_HOSTS: ["test_common.py", "test_host.py"],
    inventory_mod.GPU_CONTAINERS: ["test_common.py", "test_container.py"],
    inventory_mod.SGLANG_GATEWAYS: ["test_common.py", "test_gateway.py"],
}
RUN_TIMEOUT_S = 900
PROBE_PLAYBOOK = "verify_probe.yml"
# what playbooks/verify_probe.yml hands back (set_stats): {host: {"vars": ..., "stdout": ..., "stderr": ...}}
PROBE_STATS = "provision_verify"
PROBE_SOURCE = CHECKS_DIR / "probe.py"
# the checks' fixtures and hooks, loaded as a plugin so that a user's check files outside CHECKS_DIR get them too
CHECKS_PLUGIN = "provision.checks.plugin"
# the directory, in the working directory, of the user's own check files where --check-dir names none
USER_CHECKS = "checks"


@dataclass
class Check:
    host: str
    suite: str
    name: str
    passed: bool
    reason: str = ""
    seconds: float = 0.0


@dataclass
class VerifyReport:
    inventory: str
    checks: list[Check] = field(default_factory=list)
    record_dir: str = ""
    capacity: dict[str, dict] = field(default_factory=dict)
    # each gateway's capacity: the sum over the workers it fronts (capacity.fleet)
    fleet_capacity: dict[str, dict] = field(default_factory=dict)
    next_boot: dict[str, dict] = field(default_factory=dict)
    reboots: dict[str, list[str]] = field(default_factory=dict)
    reboot_failures: list[dict] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return bool(self.checks) and all(c.passed for c in self.checks) and not self.reboot_failures

    def to_dict(self) -> dict:
        return {
            "inventory": self.inventory,
            "passed": self.passed,
            "record_dir": self.record_dir,
            "checks": [c.__dict__ for c in self.checks],
            "capacity": self.capacity,
            "fleet_capacity": self.fleet_capacity,
            "next_boot": self.next_boot,
            "reboots": self.reboots,
            "reboot_failures": self.reboot_failures,
        }


def _reason(problem: ET.Element) -> str:
    """The assertion message, or for an error the last `E   ...` line of the traceback."""
    message = (problem.get("message") or "").strip()
    text = problem.text or ""
    e_lines = [line[1:].strip() for line in text.splitlines() if line.startswith("E ")]
    if problem.tag == "error" or not message or message == "collection failure":
        message = e_lines[-1] if e_lines else message or "error"
    first = message.strip().splitlines()[0] if message.strip() else "failed"
    for prefix in ("AssertionError: ", "Failed: ", "AssertionError"):
        if first.startswith(prefix):
            first = first[len(prefix) :]
    return first.strip() or "failed"


def _note(case: ET.Element) -> str:
    """What a passing check has to say (record_property("note", ...)), e.g. "SNP not proven"."""
    found = case.find("properties/property[@name='note']")
    return found.get("value", "") if found is not None else ""


def _parse_junit(path: Path) -> list[Check]:
    """One Check per test case; the host is the case's parameter id (`test_x[host]`)."""
    checks = []
    root = ET.parse(path).getroot()
    for case in root.iter("testcase"):
        name, _, param = case.get("name", "").partition("[")
        suite = case.get("classname", "").rsplit(".", 1)[-1]
        problem = next((case.find(tag) for tag in ("failure", "error") if case.find(tag) is not None), None)
        if case.find("skipped") is not None:
            continue
        reason = _reason(problem) if problem is not None else _note(case)
        host = param.removesuffix("]")
        checks.append(Check(host, suite, name, problem is None, reason[:300], float(case.get("time", 0) or 0)))
    return checks


def _suites(inv: inventory_mod.Inventory, hosts: list[inventory_mod.Host]) -> dict:
    """Each host with its suites, and each container's node (read too, for the container's checks)."""
    return {
        "hosts": {h.name: [s for g, files in SUITES.items() if g in h.groups for s in files] for h in hosts},
        "nodes": {
            h.name: h.value("proxmox_host")
            for h in hosts
            if inventory_mod.GPU_CONTAINERS in h.groups and h.value("proxmox_host") in inv.hosts
        },
    }


def readings(record: Path, names: list[str], run: RunResult) -> dict[str, dict]:
    """Per host, from what the probe run handed back (its stats, PROBE_STATS): the rendered variables the checks
    read, the probe's JSON, or the reason there is none (unreachable, the probe failed, or the play never got
    there)."""
    returned = run_stats(record).get(PROBE_STATS) or {}
    failures = {f["host"]: f["message"] for f in run.failures if f.get("host")}
    general = next((f["message"] for f in run.failures if not f.get("host")), run.status)
    found = {}
    for name in names:
        reading: dict = {"vars": {}, "probe": None, "error": ""}
        got = returned.get(name)
        if isinstance(got, dict):
            reading["vars"] = got.get("vars") or {}
            try:
                reading["probe"] = module_util("json_record").last_json_line(got["stdout"])
            except (KeyError, IndexError, ValueError):
                reading["error"] = "the probe printed no JSON: " + one_line(command_said(got, 300), 300)
        elif name in failures:
            reading["error"] = one_line(failures[name], 300)
        else:
            reading["error"] = one_line(f"the probe never ran here: {general}", 300)
        found[name] = reading
    return found


def read_hosts(
    inv: inventory_mod.Inventory,
    hosts: list[inventory_mod.Host],
    record: RunRecord,
    *,
    host_key_checking: bool = True,
    vault: inventory_mod.VaultOptions | None = None,
    progress: Progress = SILENT,
) -> tuple[dict, RunResult]:
    """Read every host once through Ansible (playbooks/verify_probe.yml); returns what checks/plugin.py reads."""
    spec = _suites(inv, hosts)
    wanted = {name: spec["hosts"].get(name, []) for name in [*spec["hosts"], *spec["nodes"].values()]}
    run = run_playbook(
        PROBE_PLAYBOOK,
        inv.path,
        record=record,
        host_count=len(wanted),
        extravars={
            "provision_verify_requests": {name: probe_request(suites) for name, suites in wanted.items()},
            "provision_verify_var_names": list(HOST_VARS),
            "provision_verify_probe": str(PROBE_SOURCE),
            "provision_verify_state_dir": DEFAULT_STATE_DIR,
        },
        host_key_checking=host_key_checking,
        vault=vault,
        progress=progress.playbook("provision verify: reading every host"),
    )
    return {**spec, "readings": readings(record.path, list(wanted), run)}, run


def user_checks(check_dir: Path | None = None) -> list[str]:
    """The user's own testinfra files: test_*.py in `check_dir` (--check-dir), else in ./checks where the working
    directory has one (docs/verify.md, "Your own checks"). Not in the inventory's directory: Ansible reads every
    file there as an inventory source."""
    found = Path(check_dir) if check_dir is not None else Path.cwd() / USER_CHECKS
    files = [str(p.resolve()) for p in sorted(found.glob("test_*.py"))] if found.is_dir() else []
    if check_dir is not None and not files:
        why = "no test_*.py in it" if found.is_dir() else "not a directory" if found.exists() else "no such directory"
        raise UsageError(f"--check-dir {check_dir}: {why}")
    return files


def _run_checks(
    hosts: list[str],
    spec_file: Path,
    workdir: Path,
    select: str | None = None,
    ansible_env: dict[str, str] | None = None,
    inventory: Path | None = None,
    mine: list[str] | None = None,
):
    """One pytest process for all hosts: each check decides per host from what the probe read, or asks the host
    through testinfra's `host` fixture (its Ansible connection, in `ansible_env`, from `inventory`). `mine`: the
    user's own check files (user_checks)."""
    junit = workdir / "verify.xml"
    cmd = [
        sys.executable,
        "-m",
        "pytest",
        *sorted({str(CHECKS_DIR / s) for files in SUITES.values() for s in files}),
        *(mine or []),
        "-p",
        CHECKS_PLUGIN,
        f"--junitxml={junit}",
        "-p",
        "no:cacheprovider",
        "-q",
        "--no-header",
        "-o",
        "addopts=",
        "-o",
        "junit_family=xunit1",
        f"--rootdir={CHECKS_DIR}",
        *(["-k", select] if select else []),
    ]
    # the checks need no plugin: one that the environment installs (a user's venv, the test tools) would cost its
    # import in every verify, and could change what the checks decide; nor the environment's options (PYTEST_ADDOPTS,
    # which may name a plugin's), as the ini file's addopts are dropped above
    env = {k: v for k, v in os.environ.items() if k != "PYTEST_ADDOPTS"}
    env.update(ansible_env or {})
    env.update(
        PROVISION_VERIFY_HOSTS=str(spec_file), PYTEST_DISABLE_PLUGIN_AUTOLOAD="1", PYTHONWARNINGS=child_warnings(env)
    )
    if inventory is not None:
        env[INVENTORY_ENV] = str(inventory)
    try:
        proc = subprocess.run(
            cmd, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=RUN_TIMEOUT_S, env=env, cwd=workdir
        )
    except subprocess.TimeoutExpired:
        return [Check(h, "verify", "checks finished", False, f"timed out after {RUN_TIMEOUT_S}s") for h in hosts]
    if not junit.is_file():
        tail = (proc.stdout + proc.stderr).strip().splitlines()[-1:] or ["no output"]
        return [Check(h, "verify", "checks ran", False, tail[0][:300]) for h in hosts]
    return _parse_junit(junit)


def reboot_all(
    inv: inventory_mod.Inventory,
    limit: str | None,
    record: RunRecord,
    report: VerifyReport,
    *,
    host_key_checking: bool = True,
    vault: inventory_mod.VaultOptions | None = None,
    progress: Progress = SILENT,
) -> None:
    """Reboot the nodes, then the containers, one at a time (playbooks/reboot.yml)."""
    result = run_playbook(
        "reboot.yml",
        inv.path,
        record=record,
        host_count=len(inv.hosts),
        limit=limit,
        host_key_checking=host_key_checking,
        vault=vault,
        progress=progress.playbook("provision verify --after-reboot: rebooting"),
    )
    report.reboots = result.reports
    report.reboot_failures = result.failures


def targets(inv: inventory_mod.Inventory, limit: str | None) -> list[inventory_mod.Host]:
    """The hosts verify checks: those a play on the managed groups reaches under `--limit`, by Ansible's own pattern
    rules (`!`, `&`, wildcards, ranges and regexes), as `ansible-playbook --limit` selects them."""
    limited = set(inv.match(limit))
    return [h for h in inv.hosts.values() if h.name in limited and set(SUITES) & h.groups]


def verify(
    inventory: str | inventory_mod.Inventory,
    limit: str | None = None,
    junit: Path | None = None,
    runs_dir: Path = DEFAULT_RUNS_DIR,
    after_reboot: bool = False,
    select: str | None = None,
    session_tokens: tuple[int, ...] | None = None,
    host_key_checking: bool = True,
    vault: inventory_mod.VaultOptions | None = None,
    kind: str = "verify",
    progress: Progress | None = None,
    checks: bool = True,
    check_dir: Path | None = None,
) -> VerifyReport:
    """Run the suites on every host (each read once, all in parallel), and the user's own check files of `check_dir`
    (user_checks); `select` is a pytest -k expression over all of them. Each
    container's capacity comes from the same reading (provision/capacity.py), counted in `session_tokens`, else
    in its verify_session_tokens; `checks=False` computes only that (`capacity_report`).

    The record (`kind`: verify, or capacity for `provision capacity`) holds the probe run's artifacts
    (artifacts/run), the reboot run's under reboot/ with --after-reboot, verify.json (the report) and
    summary.json; the report returned, the record and the JUnit file are scrubbed of secrets. `progress` hears
    the runs as they go (silent when left out)."""
    inv = inventory_mod.loaded(inventory, vault, host_key_checking)
    hosts = targets(inv, limit)
    mine = user_checks(check_dir) if checks else []
    report = VerifyReport(inventory=str(inv.path))
    connection = {"host_key_checking": host_key_checking, "vault": vault, "progress": progress or SILENT}
    with RunRecord(runs_dir, kind, inv) as record:
        report.record_dir = str(record.path)
        if after_reboot:
            reboot_all(inv, limit, record.child("reboot"), report, **connection)
        run = _check(
            inv, hosts, record, report, connection, checks=checks, select=select, mine=mine, tokens=session_tokens
        )
        _scrub(report, record)
        record.write_json("verify.json", report.to_dict())
        record.write_summary({"command": kind, **report.to_dict(), "probe_run": run.to_dict() if run else None})
    if junit:
        _write_junit(report, junit)
    return report


def capacity_report(
    inventory: str | inventory_mod.Inventory,
    limit: str | None = None,
    runs_dir: Path = DEFAULT_RUNS_DIR,
    session_tokens: tuple[int, ...] | None = None,
    host_key_checking: bool = True,
    vault: inventory_mod.VaultOptions | None = None,
    progress: Progress | None = None,
) -> VerifyReport:
    """`provision capacity`: every container's capacity from verify's reading of it, and no check; its `checks`
    hold one "capacity" entry per container, failed with the reason where there is none. Record kind: capacity."""
    return verify(
        inventory,
        limit=limit,
        runs_dir=runs_dir,
        session_tokens=session_tokens,
        host_key_checking=host_key_checking,
        vault=vault,
        kind="capacity",
        progress=progress,
        checks=False,
    )


def _check(inv, hosts, record: RunRecord, report: VerifyReport, connection: dict, *, checks, select, mine, tokens):
    """Read the hosts, compute each container's capacity and, with `checks`, run the checks `select` (a -k
    expression) picks, the user's check files `mine` among them; all into `report`. Returns the probe run."""
    if not hosts:
        return None
    spec, run = read_hosts(inv, hosts, record, **connection)
    containers = [h.name for h in hosts if inventory_mod.GPU_CONTAINERS in h.groups]
    found, unknown = capacities(spec["readings"], containers, tokens)
    report.capacity.update(found)
    report.fleet_capacity.update(fleet_capacities(spec["readings"], found))
    if not checks:
        report.checks.extend(Check(h, "capacity", "capacity", h not in unknown, unknown.get(h, "")) for h in containers)
        return run
    report.next_boot.update(next_boot.report(spec))
    adhoc = runner_mod.adhoc_environment(len(hosts), connection["host_key_checking"], connection["vault"])
    with tempfile.TemporaryDirectory(prefix="provision-verify-") as tmp, adhoc as ansible_env:
        spec_file = Path(tmp) / "hosts.json"
        spec_file.write_text(json.dumps(spec))
        names = [h.name for h in hosts]
        report.checks.extend(_run_checks(names, spec_file, Path(tmp), select, ansible_env, inv.path, mine))
    return run


def capacity_of(name: str, reading: dict, session_tokens: tuple[int, ...] | None = None) -> capacity.Capacity:
    """A container's capacity from what verify read of it (`readings`), counted in `session_tokens`, else in its
    verify_session_tokens; capacity.CapacityUnknown says why there is none, as the capacity check does."""
    probe = reading.get("probe")
    if probe is None:
        raise capacity.CapacityUnknown(cannot_read(name, reading.get("error", "")))
    if probe.get("sglang") is None:
        raise capacity.CapacityUnknown(no_sglang(probe))
    return capacity.from_server(probe["sglang"], session_tokens or capacity.session_sizes(reading.get("vars") or {}))


def capacities(
    readings: dict[str, dict], containers: list[str], session_tokens: tuple[int, ...] | None = None
) -> tuple[dict[str, dict], dict[str, str]]:
    """Per container its capacity (Capacity.to_dict), or why it has none."""
    found, unknown = {}, {}
    for name in containers:
        try:
            found[name] = capacity_of(name, readings.get(name) or {}, session_tokens).to_dict()
        except capacity.CapacityUnknown as exc:
            unknown[name] = one_line(exc, 300)
    return found, unknown


def fleet_capacities(readings: dict[str, dict], found: dict[str, dict]) -> dict[str, dict]:
    """Per gateway read, the sum of its workers' capacities (`found`; a worker outside this run counts as unknown):
    its workers are those its record names."""
    fleets = {}
    for name, reading in readings.items():
        text = ((reading.get("probe") or {}).get("files") or {}).get(GATEWAY_STATE)
        if text:
            workers = [w["host"] for w in json.loads(text).get("workers", [])]
            fleets[name] = capacity.fleet({w: found.get(w) for w in workers})
    return fleets


def _scrub(report: VerifyReport, record: RunRecord) -> None:
    """The checks decide from what the hosts returned: their reasons and the capacity go through the redactor."""
    for check in report.checks:
        check.reason = record.redact(check.reason)
    report.capacity = record.redact(report.capacity)
    report.fleet_capacity = record.redact(report.fleet_capacity)
    report.next_boot = record.redact(report.next_boot)


def _write_junit(report: VerifyReport, path: Path) -> None:
    suites = ET.Element("testsuites", name="provision verify")
    by_host: dict[str, list[Check]] = {}
    for c in report.checks:
        by_host.setdefault(c.host, []).append(c)
    for host, checks in by_host.items():
        suite = ET.SubElement(
            suites,
            "testsuite",
            name=host,
            tests=str(len(checks)),
            failures=str(sum(not c.passed for c in checks)),
        )
        for c in checks:
            case = ET.SubElement(suite, "testcase", classname=f"{host}.{c.suite}", name=c.name, time=f"{c.seconds:.3f}")
            if not c.passed:
                ET.SubElement(case, "failure", message=c.reason)
    path.parent.mkdir(parents=True, exist_ok=True)
    ET.ElementTree(suites).write(path, encoding="utf-8", xml_declaration=True)
