"""A non-editable install run from another directory finds its playbooks, roles and plugins."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import yaml

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


def _tool(name: str) -> str:
    return str(Path(sys.executable).parent / name)


def test_the_execution_environment_builds_its_context_installs_the_collection_and_finds_its_needs(tmp_path):
    """What ansible-builder does for execution-environment.yml up to the container runtime: the build context (the
    Containerfile and _build/), the galaxy stage's `ansible-galaxy collection install -r requirements.yml` run in
    _build/ as the Containerfile runs it in /build, and the builder stage's introspection of the installed collection.
    The image build itself needs podman or docker and the base image's registry."""
    ee = yaml.safe_load((REPO / "execution-environment.yml").read_text())
    version = yaml.safe_load((REPO / "galaxy.yml").read_text())["version"]
    tarball = f"provision-pve_sglang-{version}.tar.gz"
    assert ee["additional_build_files"] == [{"src": f"dist/{tarball}", "dest": "collections"}]
    assert ee["dependencies"]["galaxy"]["collections"] == [{"name": f"collections/{tarball}", "type": "file"}]
    project = tmp_path / "project"
    project.mkdir()
    (project / "execution-environment.yml").write_text((REPO / "execution-environment.yml").read_text())
    run = {"capture_output": True, "text": True, "stdin": subprocess.DEVNULL}
    built = subprocess.run(
        [_tool("ansible-galaxy"), "collection", "build", "--output-path", str(project / "dist"), str(REPO)], **run
    )
    assert built.returncode == 0, built.stderr
    created = subprocess.run([_tool("ansible-builder"), "create", "--context", "context"], cwd=project, **run)
    assert created.returncode == 0, created.stdout + created.stderr
    context = project / "context"
    containerfile = next(context.glob("*file")).read_text()  # Containerfile, or Dockerfile for docker
    assert 'ARG ANSIBLE_INSTALL_REFS="ansible-core>=2.19,<2.20 ansible-runner>=2.4"' in containerfile
    assert (context / "_build" / "collections" / tarball).is_file()
    installed = tmp_path / "collections"
    install = subprocess.run(
        [_tool("ansible-galaxy"), "collection", "install", "-r", "requirements.yml", "-p", str(installed)],
        cwd=context / "_build",
        **run,
    )
    assert install.returncode == 0, install.stdout + install.stderr
    assert (installed / "ansible_collections" / "provision" / "pve_sglang" / "MANIFEST.json").is_file()
    needs = subprocess.run([_tool("ansible-builder"), "introspect", str(installed)], **run)
    assert needs.returncode == 0, needs.stderr
    found = yaml.safe_load(needs.stdout.split("\n", 1)[1])
    assert [line.split()[0] for line in found["python"]] == ["proxmoxer>=2.1", "requests>=2.31", "paramiko>=3.4", "pip"]
