"""One lab per test session: booted once, shared by every test marked `lab`, torn down at the end.

Skip these locally with `-m "not lab"`. In CI (CI=true) a lab that cannot be built is a
failure, not a skip.
"""

from __future__ import annotations

import os
import shutil

import pytest

from provision.errors import ProvisionError
from provision.lab.image import check_tools


@pytest.fixture(scope="session")
def lab_env(tmp_path_factory):
    root = tmp_path_factory.mktemp("labroot")
    saved = {k: os.environ.get(k) for k in ("PROVISION_LAB_DIR", "PROVISION_LAB_INVENTORY")}
    os.environ["PROVISION_LAB_DIR"] = str(root / ".lab")
    os.environ["PROVISION_LAB_INVENTORY"] = str(root / "inventory" / "lab")
    yield root
    for key, value in saved.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value


@pytest.fixture(scope="session")
def lab(lab_env):
    from provision.lab.lab import Lab

    try:
        check_tools()
    except ProvisionError as exc:
        if os.environ.get("CI"):
            raise
        pytest.skip(str(exc))
    reuse = os.environ.get("PROVISION_TEST_LAB_DIR")
    if reuse:  # development: run against a lab that is already up, and leave it up
        os.environ["PROVISION_LAB_DIR"] = reuse
        os.environ["PROVISION_LAB_INVENTORY"] = str(lab_env / "inventory" / "lab")
        instance = Lab()
        assert instance.state().get("up"), f"PROVISION_TEST_LAB_DIR={reuse}: no lab is up there"
        instance.write_inventory(instance.state())
        yield instance
        return
    instance = Lab()
    instance.up(hosts=2, progress=lambda msg: print(msg, flush=True))
    try:
        yield instance
    finally:
        instance.down(progress=lambda msg: None)
        assert not instance.dir.exists(), "lab down left its directory behind"


@pytest.fixture(scope="session")
def lab_inventory(lab, lab_env):
    inv = lab_env / "inventory" / "lab"
    assert (inv / "hosts.yml").is_file()
    return inv


def pytest_collection_modifyitems(items):
    for item in items:
        if "tests/lab/" in str(item.fspath):
            item.add_marker(pytest.mark.lab)


def have(tool: str) -> bool:
    return shutil.which(tool) is not None
