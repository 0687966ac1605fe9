"""One pytest process for every host of a `provision verify` run.

This process connects to no host. `provision verify` has already read every host once, all at
once, through Ansible (playbooks/verify_probe.yml runs `probe.py` with the inventory's own
connection settings) and names the file that holds what each returned in PROVISION_VERIFY_HOSTS:

    {"hosts": {host: [suite, ...]}, "nodes": {container: its node},
     "readings": {host: {"vars": {...}, "probe": {...} or null, "error": "why there is no probe"}}}

Each check is then one test per host that decides from its host's reading; a host that could not
be read fails every check with the reason (the connection error, or the probe's own).
"""

from __future__ import annotations

import functools
import json
import os
from dataclasses import dataclass, field

import pytest

from provision.checks.support import cannot_read, record_path


@dataclass
class Target:
    """A host as the checks see it: the inventory variables they read and what its probe read."""

    name: str
    vars: dict = field(default_factory=dict)
    probe: dict | None = None
    error: str = ""
    node: Target | None = None

    def file(self, name: str) -> str | None:
        """A record the probe read, by its name in the host's state directory (provision_state_dir)."""
        return self.data["files"].get(name)

    def path(self, name: str) -> str:
        """Where that record is on the host."""
        return record_path(self.data, name)

    def json(self, name: str) -> dict | None:
        text = self.file(name)
        return json.loads(text) if text is not None else None

    def command(self, argv: list[str]) -> dict:
        return self.data["commands"][" ".join(argv)]

    @property
    def data(self) -> dict:
        if self.probe is None:
            pytest.fail(cannot_read(self.name, self.error))
        return self.probe


@functools.cache
def _spec() -> dict:
    path = os.environ.get("PROVISION_VERIFY_HOSTS")
    if not path:
        return {"hosts": {}, "nodes": {}, "readings": {}}
    with open(path) as f:
        return json.load(f)


@pytest.fixture(scope="session")
def targets() -> dict[str, Target]:
    spec = _spec()
    found = {
        name: Target(name, reading.get("vars") or {}, reading.get("probe"), reading.get("error") or "")
        for name, reading in spec["readings"].items()
    }
    for name in spec["hosts"]:
        found.setdefault(name, Target(name, error="not in the probe's results"))
    for container, node in spec["nodes"].items():
        found[container].node = found.setdefault(node, Target(node, error="not in the probe's results"))
    return found


def pytest_generate_tests(metafunc):
    if "host_name" in metafunc.fixturenames:
        suite = os.path.basename(metafunc.definition.fspath)
        names = [name for name, suites in _spec()["hosts"].items() if suite in suites]
        metafunc.parametrize("host_name", names, ids=names)


@pytest.fixture
def target(targets, host_name) -> Target:
    return targets[host_name]
