"""The harness's Ansible floor: tests/perf/one_read.yml (one raw read per host) through provision's own runner and
settings (forks, pipelining, ControlPersist, a fresh control directory per run), in a process of its own as
`provision apply` runs: what a no-op costs that reads each host through Ansible and does nothing else.

    .venv/bin/python -m tests.perf.one_read INVENTORY LIMIT RUNS_DIR
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from provision import inventory as inventory_mod
from provision.paths import playbooks_dir
from provision.record import RunRecord
from provision.runner import run_playbook

PLAYBOOK = Path(__file__).resolve().parent / "one_read.yml"


def main(argv: list[str]) -> int:
    inventory, limit, runs = argv
    inv = inventory_mod.load(inventory)
    hosts = inv.match(limit)
    with RunRecord(Path(runs), "floor", inv) as rec:
        result = run_playbook(
            os.path.relpath(PLAYBOOK, playbooks_dir()), inv.path, record=rec, host_count=len(hosts), limit=limit
        )
    if not result.succeeded:
        print(f"one_read: {result.status}: {result.failures}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
