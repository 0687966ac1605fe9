"""One lab per test session: booted once, shared by every test marked `lab`, torn down at the end.

Skip these locally with `-m "not lab"`. In CI (CI=true) a lab that cannot be built is a
failure, not a skip.

No module depends on which modules ran before it: the suite passes in reverse order too. Each module
names at its top what it leaves changed on the shared lab (`LAB_CHANGES`: "kernel", "gpu", "sglang", "ct") and
what no earlier module may have changed (`LAB_NEEDS_UNCHANGED`). When an earlier module did, the module gets a
fresh lab, made again from the cached image and booted snapshots (`Lab.recreate`, about 20 s); in MODULE_ORDER, the
order the modules run in, none needs one. A module that leaves the lab down (test_driver.py, which brings up a bare
lab of its own) names "down": the next lab module brings a normal lab up first, and when none follows, nothing is
brought up for nothing. A module that starts
from converged phases brings them there itself
(`common.ensure_converged`), which costs one read per host when they already are.

A module names the nodes it needs (`LAB_NODES`): "vm" (the default: qemu VMs, a bootloader, real reboots) or "nspawn"
(nodes as nspawn containers, for modules that never change a node's kernel line: docs/lab.md); None for a module that
brings up a lab of its own. A module whose nodes differ from the running lab's gets a fresh lab of its kind.

Every module that is not on nspawn nodes is also marked `lab_vm`: TCG guests slow down more than the nspawn labs and
unit files beside them gain (docs/lab.md), so they run apart from those (`-m lab_vm -n 2`: two VM labs, one per
worker, beside each other). The nspawn modules may run on pytest-xdist workers beside the tests outside the lab
(`-m "not lab_vm" -n 3 --dist loadfile --no-loadscope-reorder`): each worker that runs one
brings up a lab of its own, on links of its own (`PROVISION_LAB_NET_INDEX`).
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from provision.errors import ProvisionError
from provision.lab.image import check_tools

HERE = Path(__file__).resolve().parent
# the order the lab modules run in: the lab's own and the kernel's on VMs, then those on nspawn nodes, the bare lab's
# (which leaves the lab down) and the gateway's last; in this order no module needs a fresh lab
MODULE_ORDER = (
    "test_lab.py",
    "test_kernel.py",
    "test_gpu.py",
    "test_sglang.py",
    "test_verify.py",
    "test_bench.py",
    "test_collection.py",
    "test_ansible_fit.py",
    "test_weights.py",
    "test_ct_create.py",
    "test_retire.py",
    "test_driver.py",
    "test_gateway.py",
)
# gw0 from 10.213.1, gw1 from 10.213.61, gw2 from 10.213.121: below the indexes the unit tests use (200, 250)
LINKS_PER_WORKER, MAX_LAB_WORKERS = 60, 3


def _bring_up(instance, nodes: str = "vm") -> None:
    """A normal lab (two nodes, CT 101), its progress on the console."""
    instance.up(hosts=2, nodes=nodes, progress=lambda msg: print(msg, flush=True))


@pytest.fixture(scope="session")
def lab_env(tmp_path_factory):
    root = tmp_path_factory.mktemp("labroot")
    saved = {k: os.environ.get(k) for k in ("PROVISION_LAB_DIR", "PROVISION_LAB_INVENTORY", "PROVISION_LAB_NET_INDEX")}
    os.environ["PROVISION_LAB_DIR"] = str(root / ".lab")
    os.environ["PROVISION_LAB_INVENTORY"] = str(root / "inventory" / "lab")
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    if worker.startswith("gw"):  # each pytest-xdist worker's lab on links of its own (10.213.<index>.0/30)
        number = int(worker[2:])
        assert number < MAX_LAB_WORKERS, f"{worker}: the lab's links are planned for {MAX_LAB_WORKERS} xdist workers"
        os.environ["PROVISION_LAB_NET_INDEX"] = str(1 + LINKS_PER_WORKER * number)
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
        if not instance.state().get("up"):  # a module left it down (LAB_CHANGES "down"): leave it up, as found
            _bring_up(instance)
        return
    instance = Lab()
    _bring_up(instance, _first_nodes[0])  # the kind the first lab module needs
    try:
        yield instance
    finally:
        instance.down(progress=lambda msg: None)
        assert not instance.dir.exists(), "lab down left its directory behind"


_changed: set[str] = set()  # what the modules run since the lab was (re)made left changed
_first_nodes = ["vm"]  # the nodes of the session's first lab: the first lab module's


@pytest.fixture(scope="module", autouse=True)
def _lab_as_the_module_needs_it(request):
    module = request.module
    nodes = getattr(module, "LAB_NODES", "vm")
    if "down" in _changed and hasattr(module, "LAB_CHANGES"):  # a lab module, after one that left it down
        print(f"lab: {module.__name__} needs the lab that the module before left down; a fresh one")
        _bring_up(request.getfixturevalue("lab"), nodes or "vm")
        _changed.clear()
    broken = set(getattr(module, "LAB_NEEDS_UNCHANGED", ())) & _changed
    if broken:
        print(f"lab: {module.__name__} needs a lab with no {', '.join(sorted(broken))} changes; a fresh one")
    running = request.getfixturevalue("lab").state().get("nodes", "vm") if nodes else None
    if running != nodes:
        print(f"lab: {module.__name__} needs {nodes} nodes, the lab has {running} nodes; a fresh one")
    if broken or running != nodes:
        request.getfixturevalue("lab").recreate(progress=lambda msg: print(msg, flush=True), nodes=nodes)
        _changed.clear()
    yield
    _changed.update(getattr(request.module, "LAB_CHANGES", ()))


# module-scoped, after the module's own setup: a session-scoped one would be set up before it, while the lab a
# module before left down (LAB_CHANGES "down") is not up again yet
@pytest.fixture(scope="module")
def lab_inventory(lab, lab_env, _lab_as_the_module_needs_it):
    inv = lab_env / "inventory" / "lab"
    assert (inv / "hosts.yml").is_file()
    return inv


def pytest_collection_modifyitems(config, items):
    """Marks the lab's tests. Their modules run in MODULE_ORDER (one not named there after those that are), unless
    the command line names lab modules: then in its order. Everything else keeps its place."""
    slots = [i for i, item in enumerate(items) if "tests/lab/" in str(item.fspath)]
    rank = {name: i for i, name in enumerate(MODULE_ORDER)}
    named = any((config.invocation_params.dir / arg.split("::")[0]).resolve().parent == HERE for arg in config.args)
    ordered = [items[i] for i in slots]
    if not named:
        ordered.sort(key=lambda item: (rank.get(item.path.name, len(rank)), item.path.name))
    for i, item in zip(slots, ordered, strict=True):
        items[i] = item
        item.add_marker(pytest.mark.lab)
        if getattr(item.module, "LAB_NODES", "vm") != "nspawn":  # qemu VMs: never beside other work
            item.add_marker(pytest.mark.lab_vm)


def pytest_collection_finish(session):
    """The session's lab comes up before any module's fixture runs: in the kind of the first lab module that runs
    (after `-m` deselected what does not)."""
    lab_items = [item for item in session.items if "tests/lab/" in str(item.fspath)]
    if lab_items:
        _first_nodes[0] = getattr(lab_items[0].module, "LAB_NODES", None) or "vm"


def have(tool: str) -> bool:
    return shutil.which(tool) is not None
