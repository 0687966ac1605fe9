"""Helpers for lab tests: inventory overrides and host facts."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import yaml

from tests.conftest import run_provision


def set_host_vars(inventory: Path, host: str, values: dict | None) -> None:
    """Write (or with None remove) host_vars/<host>.yml in the lab inventory."""
    path = inventory / "host_vars" / f"{host}.yml"
    if values is None:
        path.unlink(missing_ok=True)
        return
    path.parent.mkdir(exist_ok=True)
    path.write_text(yaml.safe_dump(values))


def apply(inventory: Path, runs: Path, *extra: str, env: dict | None = None) -> tuple[int, dict, str]:
    proc = run_provision("apply", "--inventory", str(inventory), "--yes", "--json", "--runs-dir", str(runs), *extra,
                         env=env, timeout=1800)  # fmt: skip
    try:
        data = json.loads(proc.stdout)
    except ValueError:
        data = {}
    return proc.returncode, data, proc.stderr


_KC = Path(__file__).resolve().parents[2] / "roles" / "kernel_cmdline" / "module_utils" / "kernel_cmdline.py"
_spec = importlib.util.spec_from_file_location("kernel_cmdline_utils", _KC)
_kernel_cmdline = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_kernel_cmdline)
split_cmdline = _kernel_cmdline.split
canonical = _kernel_cmdline.canonical


def boots(machine) -> int:
    """How many boots the host's wtmp records."""
    out = machine.ssh("last -x reboot 2>/dev/null | grep -c '^reboot' || true").stdout.strip()
    return int(out or 0)
