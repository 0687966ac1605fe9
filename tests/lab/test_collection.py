"""The collection as an AWX or Semaphore user runs it: ansible-galaxy collection build and install, then
`ansible-playbook provision.pve_sglang.site` against the lab, from a Python that cannot import provision
(controller-side modules such as gpu_passthrough's API calls run under it too: ansible_playbook_python).
On a lab the CLI has converged, the collection's run changes nothing."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

from tests.lab.common import apply

LAB_CHANGES = {"kernel", "gpu", "sglang", "ct"}  # tests/lab/conftest.py
LAB_NODES = "nspawn"  # no bootloader, no kernel line changed: nodes as nspawn containers (docs/lab.md)

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent


def python_without_provision(root: Path) -> Path:
    """A venv whose only packages are this virtualenv's, less provision (its editable-install hook and the
    copies the editable install left beside it)."""
    site = next(Path(p) for p in sys.path if p.endswith("site-packages") and Path(p).is_dir())
    shadow = root / "site-packages"
    shadow.mkdir()
    for entry in site.iterdir():
        if "provision" not in entry.name:
            (shadow / entry.name).symlink_to(entry)
    venv = root / "venv"
    subprocess.run([sys._base_executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    venv_site = next((venv / "lib").glob("python3*/site-packages"))
    # an import line in a .pth runs at start-up: the shadow becomes a site directory (its .pth files apply)
    (venv_site / "shadow.pth").write_text(f"import site; site.addsitedir({str(shadow)!r})\n")
    return venv / "bin" / "python"


def test_the_installed_collection_converges_the_lab_without_provision(lab, lab_inventory, tmp_path):
    rc, _, err = apply(lab_inventory, tmp_path / "runs")
    assert rc == 0, err[-3000:]
    for step in (["build", "--output-path", tmp_path, REPO], ["install", "-p", tmp_path / "collections"]):
        if step[0] == "install":
            step.append(next(tmp_path.glob("provision-pve_sglang-*.tar.gz")))
        subprocess.run([BIN / "ansible-galaxy", "collection", *map(str, step)], check=True, cwd=tmp_path)
    python = python_without_provision(tmp_path)
    env = {k: v for k, v in os.environ.items() if not k.startswith("ANSIBLE_") and k != "PYTHONPATH"}
    env |= {
        "ANSIBLE_COLLECTIONS_PATH": str(tmp_path / "collections"),
        "ANSIBLE_ROLES_PATH": str(tmp_path / "none"),
        "ANSIBLE_NOCOLOR": "1",
    }
    probe = subprocess.run(
        [python, "-c", "import ansible, proxmoxer; import provision"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
    )
    assert "No module named 'provision'" in probe.stderr, probe.stderr
    proc = subprocess.run(
        [python, "-m", "ansible", "playbook", "provision.pve_sglang.site", "-i", str(lab_inventory)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=1800,
    )
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    recap = re.findall(r"^(\S+)\s+: ok=\d+\s+changed=(\d+)\s+unreachable=(\d+)\s+failed=(\d+)", proc.stdout, re.M)
    assert recap and all(c == u == f == "0" for _, c, u, f in recap), proc.stdout[-4000:]
