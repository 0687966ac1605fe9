"""Constants and helpers shared by the verify suites and their conftest."""

from __future__ import annotations

import os
import random
import time
from pathlib import Path

from provision.paths import module_util

STATE_DIR = "/var/lib/provision"
SMOKE_QUESTION = "What is 7 * 13?"
SMOKE_EXPECT = "91"


# the GPU DMA fault lines of a node's kernel log (plugins/module_utils/kernel_faults.py)
kernel_faults = module_util("kernel_faults")


def smoke_question(host_vars: dict) -> str:
    """The question the smoke check asks (verify_smoke_question, else the default)."""
    return host_vars.get("verify_smoke_question") or SMOKE_QUESTION


def run_retrying(host, command: str, *args, attempts: int = 5):
    """Run a command over testinfra's ssh. sshd's default MaxStartups (10:30:100) drops some of a
    burst of new connections (ssh exits 255, "kex_exchange_identification: Connection closed"),
    which testinfra raises: retry those, spread out."""
    for attempt in range(attempts):
        try:
            return host.run(command, *args)
        except RuntimeError as exc:
            if "exit_status=255" not in str(exc) or attempt == attempts - 1:
                raise
            time.sleep(1 + random.random() * 2 * (attempt + 1))
    raise AssertionError("unreachable")


def output_dir() -> Path | None:
    out = os.environ.get("PROVISION_VERIFY_OUT")
    return Path(out) if out else None
