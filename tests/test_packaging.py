"""A non-editable install run from another directory finds its playbooks, roles and plugins."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def test_wheel_install_finds_packaged_playbooks_and_roles(tmp_path):
    wheels = tmp_path / "wheels"
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(wheels), str(REPO)], check=True)
    target = tmp_path / "site"
    wheel = next(wheels.glob("provision_pve_sglang-*.whl"))
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(target), str(wheel)], check=True
    )
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    env = {**os.environ, "PYTHONPATH": str(target)}
    probe = (
        "import provision, provision.paths as p; "
        "print(provision.__file__); print(p.playbooks_dir()); print(p.roles_dir()); print(p.plugins_dir()); "
        "print(p.example_inventory_dir())"
    )
    out = subprocess.run(
        [sys.executable, "-c", probe], cwd=elsewhere, env=env, capture_output=True, text=True, check=True
    )
    module, playbooks, roles, plugins, inventory = out.stdout.split()
    for path in (module, playbooks, roles, plugins, inventory):
        assert path.startswith(str(target)), f"{path} is not from the installed wheel"
    assert (Path(playbooks) / "site.yml").is_file()
    assert (Path(plugins) / "modules" / "kernel_cmdline.py").is_file()
    assert (Path(plugins) / "module_utils" / "sglang_flags.py").is_file()
    assert (Path(roles) / "gpu_diag" / "files" / "gpu_p2p_diag.py").is_file()
    helped = subprocess.run(
        [sys.executable, "-m", "provision", "--help"], cwd=elsewhere, env=env, capture_output=True, text=True
    )
    assert helped.returncode == 0 and "apply" in helped.stdout and "verify" in helped.stdout
    check = subprocess.run(
        [sys.executable, "-m", "provision", "inventory", "check", "--inventory", "example"],
        cwd=elsewhere,
        env=env,
        capture_output=True,
        text=True,
    )
    assert check.returncode == 0, check.stderr
    # no silent fallback: `prod` is ./inventory/prod or an error, never the packaged example
    missing = subprocess.run(
        [sys.executable, "-m", "provision", "inventory", "check", "--inventory", "prod"],
        cwd=elsewhere,
        env=env,
        capture_output=True,
        text=True,
    )
    assert missing.returncode == 2 and "--inventory example" in missing.stderr, missing.stderr
