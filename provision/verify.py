"""`provision verify`: run the packaged check suites against every host.

One pytest process for the whole run (`checks/conftest.py`): it reads each host once, all hosts
at once, with one ssh command through testinfra's connection from the same inventory, and each
check then decides per host from what was read. The JUnit XML it writes is merged into one table
per host. A host that cannot be reached shows up as failed checks with the connection error.
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

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from provision import inventory as inventory_mod
from provision.progress import LiveProgress
from provision.runner import new_record_dir, redact_tree, run_playbook, secret_values

CHECKS_DIR = Path(__file__).resolve().parent / "checks"
# group -> suites run on its hosts
SUITES = {
    inventory_mod.PROXMOX_HOSTS: ["test_common.py", "test_host.py"],
    inventory_mod.GPU_CONTAINERS: ["test_common.py", "test_container.py"],
}
RUN_TIMEOUT_S = 900


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


def _targets(inv: inventory_mod.Inventory, hosts: list[inventory_mod.Host]) -> dict:
    """What conftest.py probes: each host with its suites, and each container's node."""
    return {
        "inventory": str(inv.path),
        "hosts": {h.name: [s for g, files in SUITES.items() if g in h.groups for s in files] for h in hosts},
        "nodes": {
            h.name: h.value("proxmox_host")
            for h in hosts
            if inventory_mod.GPU_CONTAINERS in h.groups and h.value("proxmox_host") in inv.hosts
        },
    }


def _run_checks(inv, hosts, workdir: Path, select: str | None = None, extra_env=None) -> list[Check]:
    """One pytest process for all hosts: each host is probed once, then each check decides per host."""
    junit = workdir / "verify.xml"
    cmd = [
        sys.executable, "-m", "pytest", *sorted({str(CHECKS_DIR / s) for files in SUITES.values() for s in files}),
        f"--junitxml={junit}", "-p", "no:cacheprovider", "-q", "--no-header", "-o", "addopts=",
        "-o", "junit_family=xunit1", f"--rootdir={CHECKS_DIR}", *(["-k", select] if select else []),
    ]  # fmt: skip
    env = {
        **os.environ,
        # testinfra runs ansible-inventory through PATH: use the one beside our interpreter
        "PATH": str(Path(sys.executable).parent) + os.pathsep + os.environ.get("PATH", ""),
        "ANSIBLE_HOST_KEY_CHECKING": "True",
        "PROVISION_VERIFY_TARGETS": json.dumps(_targets(inv, hosts)),
        "PROVISION_VERIFY_OUT": str(workdir),
        **(extra_env or {}),
    }
    try:
        # ansible refuses a non-blocking stdin, and the checks never read one
        proc = subprocess.run(
            cmd, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=RUN_TIMEOUT_S, env=env, cwd=workdir
        )
    except subprocess.TimeoutExpired:
        return [Check(h.name, "verify", "checks finished", False, f"timed out after {RUN_TIMEOUT_S}s") for h in hosts]
    if not junit.is_file():
        tail = (proc.stdout + proc.stderr).strip().splitlines()[-1:] or ["no output"]
        return [Check(h.name, "verify", "checks ran", False, tail[0][:300]) for h in hosts]
    return _parse_junit(junit)


def reboot_all(inv: inventory_mod.Inventory, limit: str | None, record: Path, report: VerifyReport) -> None:
    """Reboot the nodes, then the containers, one at a time (playbooks/reboot.yml)."""
    result = run_playbook(
        "reboot.yml",
        inv.path,
        record_dir=record,
        host_count=len(inv.hosts),
        limit=limit,
        progress=LiveProgress(Console(stderr=True), "provision verify --after-reboot: rebooting"),
    )
    report.reboots = result.reports
    report.reboot_failures = result.failures


def verify(
    inventory: str,
    limit: str | None = None,
    junit: Path | None = None,
    runs_dir: Path = Path(".provision/runs"),
    after_reboot: bool = False,
    select: str | None = None,
    session_tokens: str | None = None,
) -> VerifyReport:
    """Run the suites on every host (in parallel); `select` is a pytest -k expression."""
    inv = inventory_mod.load(inventory)
    hosts = [h for h in inv.hosts.values() if set(SUITES) & h.groups]
    if limit:
        wanted = {p.strip() for p in limit.replace(":", ",").split(",") if p.strip()}
        hosts = [h for h in hosts if h.name in wanted or wanted & h.groups]
    report = VerifyReport(inventory=str(inv.path))
    record = new_record_dir(runs_dir, "verify")
    report.record_dir = str(record)
    if after_reboot:
        reboot_all(inv, limit, record, report)
    with tempfile.TemporaryDirectory(prefix="provision-verify-") as tmp:
        env = {"PROVISION_SESSION_TOKENS": session_tokens} if session_tokens else {}
        report.checks.extend(_run_checks(inv, hosts, Path(tmp), select, env) if hosts else [])
        for path in Path(tmp).glob("*-capacity.json"):
            report.capacity[path.name.removesuffix("-capacity.json")] = json.loads(path.read_text())
        if junit:
            _write_junit(report, junit)
    (record / "verify.json").write_text(json.dumps(report.to_dict(), indent=2))
    redact_tree(record, secret_values())
    return report


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


def print_report(console: Console, report: VerifyReport) -> None:
    hosts = sorted({c.host for c in report.checks})
    if not hosts:
        console.print("no hosts matched: nothing was verified", style="red")
    for host in hosts:
        table = Table(title=f"verify {host}")
        for col in ("suite", "check", "result", "reason"):
            table.add_column(col)
        for c in (c for c in report.checks if c.host == host):
            table.add_row(c.suite, c.name, "[green]pass[/]" if c.passed else "[red]FAIL[/]", escape(c.reason))
        console.print(table)
    for host, messages in sorted(report.reboots.items()):
        for message in messages:
            console.print(f"{escape(host)}: {escape(message)}")
    for failure in report.reboot_failures:
        console.print(f"[red]REBOOT FAILED[/] {escape(failure['host'] + ': ' + failure['message'])}")
    print_capacity(console, report)
    verdict = "[green]all checks passed[/]" if report.passed else "[red]verification failed[/]"
    console.print(f"{verdict}; record: {escape(report.record_dir)}")


def print_capacity(console: Console, report: VerifyReport) -> None:
    for host, cap in sorted(report.capacity.items()):
        console.print(f"capacity {escape(host)}: {escape(cap['summary'])}")
        details = f"  kv cache {cap['kv_cache_dtype']}, context {cap['context_length']:,}"
        details += f", max_running_requests {cap['max_running_requests']}"
        if cap.get("kv_bytes_per_token_per_gpu"):
            details += f", {cap['kv_bytes_per_token_per_gpu']:,} KV bytes/token/GPU ({cap['kv_pool_gib_per_gpu']} GiB)"
        console.print(escape(details))
        for p in cap.get("predictions", []):
            console.print(
                escape(f"  {p['what']}: {p['max_total_num_tokens']:,} tokens, {p['full_context_sessions']} sessions")
            )
