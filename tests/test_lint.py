"""ruff and ansible-lint (profile production) are part of the test suite; ruff covers the package, the tests,
and the Python of the roles and plugins."""

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent
PYTHON_TREES = ["provision", "tests", "roles", "plugins"]


def _tool(name: str) -> str:
    path = BIN / name
    if path.exists():
        return str(path)
    found = shutil.which(name)
    if not found:
        pytest.fail(f"{name} is not installed: run .ci/setup (it installs the test extras)")
    return found


def test_ruff_check():
    proc = subprocess.run([_tool("ruff"), "check", *PYTHON_TREES], cwd=REPO, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_ruff_format():
    proc = subprocess.run([_tool("ruff"), "format", "--check", *PYTHON_TREES], cwd=REPO, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_ansible_lint_production_profile():
    proc = subprocess.run(
        [_tool("ansible-lint"), "--profile", "production", "playbooks", "roles"],
        cwd=REPO,
        capture_output=True,
        text=True,
        # ansible refuses a non-blocking stdin (CI hands one down); the linter needs none
        stdin=subprocess.DEVNULL,
        env={"PATH": f"{BIN}:/usr/bin:/bin", "HOME": str(Path.home()), "ANSIBLE_NOCOLOR": "1"},
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
