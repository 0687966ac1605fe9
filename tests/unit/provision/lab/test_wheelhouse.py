"""The SGLang release is pinned once, sglang_version in roles/sglang/defaults/main.yml: the role installs and
flag-checks it, and the lab derives its own from it (the wheel it fetches, the stand-in's wheel and reported version,
the benchmark client's cache)."""

from __future__ import annotations

import re
import zipfile

import yaml

from provision.lab import wheelhouse
from tests.loaders import REPO


def test_the_lab_takes_the_roles_pin():
    pin = yaml.safe_load((REPO / "roles/sglang/defaults/main.yml").read_text())["sglang_version"]
    assert pin == wheelhouse.SGLANG_VERSION


def test_the_stand_ins_wheel_carries_the_pin(tmp_path):
    real = tmp_path / f"sglang-{wheelhouse.SGLANG_VERSION}-py3-none-any.whl"
    with zipfile.ZipFile(real, "w") as zf:
        zf.writestr("sglang/srt/server_args.py", 'p.add_argument("--model-path")\n')
    built = wheelhouse.build_standin_wheel(real, tmp_path / "out")
    assert built.name == f"sglang_labserver-{wheelhouse.SGLANG_VERSION}-py3-none-any.whl"
    with zipfile.ZipFile(built) as zf:
        metadata = zf.read(f"sglang_labserver-{wheelhouse.SGLANG_VERSION}.dist-info/METADATA").decode()
    assert f"Version: {wheelhouse.SGLANG_VERSION}\n" in metadata


def test_no_code_spells_the_release_again():
    """Prose may say which release a rule was read from; no other value, default or constant holds it."""
    release = re.compile(rf"""["']{re.escape(wheelhouse.SGLANG_VERSION)}["']""")
    pinned = REPO / "roles/sglang/defaults/main.yml"
    found = [
        str(path.relative_to(REPO))
        for top in ("provision", "plugins", "roles", "playbooks")
        for path in REPO.joinpath(top).rglob("*")
        if path.suffix in (".py", ".yml", ".j2") and path != pinned and release.search(path.read_text())
    ]
    assert found == []
