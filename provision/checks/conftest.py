"""One pytest process for every host of a `provision verify` run.

`provision verify` names the hosts and their suites in PROVISION_VERIFY_TARGETS. At the start of
the session every host is probed once, all at once (`probe.py` over testinfra's connection from
the Ansible inventory); each check is then one test per host that decides from its host's probe.
"""

from __future__ import annotations

import base64
import json
import os
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from provision.checks.support import STATE_DIR, kernel_faults, run_retrying, smoke_question

PROBE_SOURCE = (Path(__file__).parent / "probe.py").read_text()
NODE_FILES = [
    f"{STATE_DIR}/verify.json",
    f"{STATE_DIR}/kernel-cmdline/wanted.json",
    f"{STATE_DIR}/kernel-findings.json",
]
CONTAINER_FILES = [f"{STATE_DIR}/verify.json", f"{STATE_DIR}/sglang-service.json"]
DRIVER_QUERY = ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"]
USERSPACE_QUERY = ["nvidia-smi", "--version"]


@dataclass
class Target:
    """A host as the checks see it: its inventory variables and what its probe read."""

    name: str
    vars: dict = field(default_factory=dict)
    probe: dict | None = None
    error: str = ""
    node: Target | None = None

    def file(self, path: str) -> str | None:
        return self.data["files"].get(path)

    def json(self, path: str) -> dict | None:
        text = self.file(path)
        return json.loads(text) if text is not None else None

    def command(self, argv: list[str]) -> dict:
        return self.data["commands"][" ".join(argv)]

    @property
    def data(self) -> dict:
        if self.probe is None:
            pytest.fail(f"cannot read {self.name}: {self.error}")
        return self.probe


def _targets() -> dict:
    return json.loads(os.environ.get("PROVISION_VERIFY_TARGETS") or '{"hosts": {}, "nodes": {}}')


def _request(target: Target, suites: list[str]) -> dict:
    if "test_container.py" in suites:
        question = smoke_question(target.vars)
        files, commands = CONTAINER_FILES, [USERSPACE_QUERY]
        return {"files": files, "commands": commands, "sglang_state": CONTAINER_FILES[1], "question": question}
    return {"files": NODE_FILES, "commands": [DRIVER_QUERY, kernel_faults.journal_argv()]}


def _probe(host, target: Target, request: dict) -> None:
    payload = base64.b64encode(json.dumps(request).encode()).decode()
    try:
        cmd = run_retrying(host, "python3 -c %s %s", PROBE_SOURCE, payload)
    except Exception as exc:  # testinfra raises the connection error as RuntimeError
        target.error = str(exc).strip().splitlines()[-1][:300] if str(exc).strip() else type(exc).__name__
        return
    try:
        target.probe = json.loads(cmd.stdout.strip().splitlines()[-1]) if cmd.rc == 0 else None
    except (ValueError, IndexError):
        target.probe = None
    if target.probe is None:
        target.error = f"the probe exited {cmd.rc}: {(cmd.stderr or cmd.stdout).strip()[-300:]}"


@pytest.fixture(scope="session")
def targets() -> dict[str, Target]:
    import testinfra

    spec = _targets()
    inventory = spec["inventory"]
    suites = dict(spec["hosts"])
    for node in spec["nodes"].values():
        suites.setdefault(node, [])
    hosts = {name: testinfra.get_host(f"ansible://{name}?ansible_inventory={inventory}") for name in suites}
    found = {name: Target(name, _variables(host)) for name, host in hosts.items()}
    with ThreadPoolExecutor(max_workers=max(1, min(len(hosts), 32))) as pool:
        for name, host in hosts.items():
            pool.submit(_probe, host, found[name], _request(found[name], suites[name]))
    for container, node in spec["nodes"].items():
        found[container].node = found[node]
    return found


def _variables(host) -> dict:
    try:
        return host.ansible.get_variables()
    except Exception:  # not an Ansible host
        return {}


def pytest_generate_tests(metafunc):
    if "host_name" in metafunc.fixturenames:
        suite = Path(metafunc.definition.fspath).name
        names = [name for name, suites in _targets()["hosts"].items() if suite in suites]
        metafunc.parametrize("host_name", names, ids=names)


@pytest.fixture
def target(targets, host_name) -> Target:
    return targets[host_name]
