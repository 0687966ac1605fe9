"""What one testinfra command of verify's checks costs: testinfra's `host` over the host's Ansible connection
(provision/checks/connection.py), against testinfra's own ansible backend with every command through the `ansible`
CLI (force_ansible). Both run in the checks' environment (runner.adhoc_environment), each in a process of its own.

    .venv/bin/python -m tests.perf.testinfra_command INVENTORY HOST
"""

from __future__ import annotations

import os
import subprocess
import sys

from provision import inventory as inventory_mod
from provision.runner import adhoc_environment

TIMED = r"""
import sys, time
import testinfra
from provision.checks import connection
inventory, name, kind, count = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
start = time.monotonic()
if kind == "connection":
    host = connection.host(inventory, name)
else:
    host = testinfra.get_host(f"ansible://{name}", ansible_inventory=inventory, force_ansible=True)
assert host.run("true").rc == 0
first = time.monotonic()
for _ in range(count):
    assert host.run("true").rc == 0
each = (time.monotonic() - first) / count
print(f"{kind}: the first command {first - start:.2f} s (with the set-up), then {each:.3f} s each")
"""


def main(argv: list[str]) -> int:
    inventory, name = argv
    path = str(inventory_mod.resolve(inventory))
    with adhoc_environment(1) as env:
        for kind, count in (("connection", 20), ("force_ansible", 5)):
            proc = subprocess.run(
                [sys.executable, "-c", TIMED, path, name, kind, str(count)],
                env={**os.environ, **env},
                capture_output=True,
                text=True,
            )
            print(proc.stdout.strip() or f"{kind}: failed: {proc.stderr.strip()[-500:]}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
