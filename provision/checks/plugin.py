"""The pytest plugin of verify's checks: one pytest process for every host of a `provision verify` run, loaded
with `-p provision.checks.plugin`, so that its fixtures (`target`, `host`) serve the packaged suites and the
user's own check files alike (docs/verify.md, "Your own checks").

`provision verify` has already read every host once, all at once, through Ansible
(playbooks/verify_probe.yml runs `probe.py` with the inventory's own connection settings) and names
the file that holds what each returned in PROVISION_VERIFY_HOSTS:

    {"hosts": {host: [suite, ...]}, "nodes": {container: its node},
     "readings": {host: {"vars": {...}, "probe": {...} or null, "error": "why there is no probe"}}}

Each check is then one test per host that decides from its host's reading (`target`), or asks the
host itself through testinfra's `host` fixture: testinfra over the host's own Ansible connection plugin, set
up in the environment verify gives this process (checks/connection.py), so the user's ansible.cfg,
ProxyCommand or ProxyJump, become and vault apply as in apply. A host that could not be
read fails every check with the reason (the connection error, or the probe's own), without another try.
"""

from __future__ import annotations

import functools
import json
import os
from dataclasses import dataclass, field

import pytest

from provision.checks import connection
from provision.checks.support import INVENTORY_ENV, cannot_read, record_path


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
        names = hosts_of(os.path.basename(metafunc.definition.fspath))
        metafunc.parametrize("host_name", names, ids=names)


def hosts_of(suite: str) -> list[str]:
    """The hosts a check file runs on: a packaged suite's hosts; a user's test_container*.py on the containers,
    test_host*.py on the nodes, test_gateway*.py on the gateways, any other on every host verify checks."""
    hosts = _spec()["hosts"]
    packaged = {s for suites in hosts.values() for s in suites}
    if suite not in packaged:
        kinds = ("test_container.py", "test_host.py", "test_gateway.py")
        kind = next((s for s in kinds if suite.startswith(s[:-3])), None)
        return [name for name, suites in hosts.items() if kind is None or kind in suites]
    return [name for name, suites in hosts.items() if suite in suites]


@pytest.fixture
def target(targets, host_name) -> Target:
    """What the probe read of this check's host."""
    return targets[host_name]


@pytest.fixture
def host(target):
    """testinfra's host for this check's host, reached through Ansible with verify's inventory: one connection per
    host for the whole run, made by its Ansible connection plugin (checks/connection.py). A host the probe could not
    read fails at once."""
    target.data  # noqa: B018 -- fails the check with the reason the probe gave
    inventory = os.environ.get(INVENTORY_ENV)
    if not inventory:
        pytest.fail(f"{INVENTORY_ENV} is not set: the checks run from provision verify")
    try:
        return connection.host(inventory, target.name)
    except connection.Unreachable as exc:
        pytest.fail(str(exc))
