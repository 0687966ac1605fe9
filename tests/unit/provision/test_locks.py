"""provision/locks.py: the controller's per-inventory lock, and which hosts a run left locked."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import yaml

from provision import inventory, locks
from provision.errors import ProvisionError
from provision.runner import RunResult
from tests.loaders import REPO


@pytest.fixture(autouse=True)
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    return tmp_path / "cache"


def _holder(run_id="20250101T000000-apply") -> locks.Holder:
    return locks.Holder.for_run(run_id, "provision apply --inventory prod")


def test_the_lock_file_is_named_after_the_resolved_inventory(tmp_path, cache, monkeypatch):
    (tmp_path / "inventory" / "prod").mkdir(parents=True)
    monkeypatch.chdir(tmp_path)
    path = locks.controller_lock_path(Path("inventory/prod"))
    assert path == locks.controller_lock_path(tmp_path / "inventory" / ".." / "inventory" / "prod")
    assert path.parent == cache / "provision" / "locks" and path.name.startswith("prod-")
    assert path != locks.controller_lock_path(tmp_path / "inventory")


def test_a_link_planted_at_the_locks_name_is_refused_and_its_target_untouched(tmp_path):
    """With a shared $XDG_CACHE_HOME another user could plant a link where the lock goes: opened through it, the lock's
    truncate would empty whatever file it names."""
    path = locks.controller_lock_path(tmp_path)
    path.parent.mkdir(parents=True, mode=0o700)
    victim = tmp_path / "precious"
    victim.write_text("keep me")
    path.symlink_to(victim)
    denied = "cannot open the inventory's lock: it is a symbolic link"
    with pytest.raises(ProvisionError, match=denied), locks.controller_lock(tmp_path, _holder()):
        pytest.fail("the lock was taken through a link")
    assert victim.read_text() == "keep me"


def test_a_lock_directory_other_users_can_write_is_refused(tmp_path):
    path = locks.controller_lock_path(tmp_path)
    path.parent.mkdir(parents=True)
    path.parent.chmod(0o777)
    denied = r"the lock directory must be a directory of this user that no other user can write \(it is drwxrwxrwx"
    with pytest.raises(ProvisionError, match=denied), locks.controller_lock(tmp_path, _holder()):
        pytest.fail("the lock was taken in a directory anyone can write")


def test_a_second_run_is_refused_naming_the_holder_and_the_lock(tmp_path):
    first = _holder()
    with locks.controller_lock(tmp_path, first) as path:
        assert json.loads(path.read_text())["run_id"] == first.run_id
        assert oct(path.stat().st_mode & 0o777) == "0o600"
        with pytest.raises(locks.LockHeld) as caught, locks.controller_lock(tmp_path, _holder("20250101T000001-apply")):
            pytest.fail("two runs held one inventory")
    message = str(caught.value)
    for part in (first.run_id, f"pid {os.getpid()}", first.controller, first.since, str(path), "provision apply"):
        assert part in message
    with locks.controller_lock(tmp_path, _holder("20250101T000002-apply")):
        pass  # given back when the first one ended


def test_the_lock_goes_with_a_holder_that_dies(tmp_path, cache):
    """A crashed run leaves no stale controller lock: the kernel drops the flock with the process."""
    code = (
        "import sys, time; from pathlib import Path; from provision import locks\n"
        "with locks.controller_lock(Path(sys.argv[1]), locks.Holder.for_run('r1', 'c')):\n"
        "    print('held', flush=True); time.sleep(60)\n"
    )
    env = {**os.environ, "XDG_CACHE_HOME": str(cache)}
    proc = subprocess.Popen([sys.executable, "-c", code, str(tmp_path)], stdout=subprocess.PIPE, text=True, env=env)
    try:
        assert proc.stdout.readline().strip() == "held"
        with pytest.raises(locks.LockHeld, match=f"pid {proc.pid} "), locks.controller_lock(tmp_path, _holder()):
            pass
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)
        with locks.controller_lock(tmp_path, _holder()):
            pass
    finally:
        proc.kill()
        proc.wait()


def test_the_request_for_host_locks_names_this_run():
    holder = _holder()
    request = locks.host_lock_request(holder, break_lock=True)
    assert request["break"] is True and request["pid"] == os.getpid() and request["run_id"] == holder.run_id
    assert request["pid_ns"] and request["pid_ns"] == locks.pid_namespace()


def _event(counter, kind, host, task, stdout=None):
    data = {"host": host, "task": task}
    if stdout is not None:
        data["res"] = {"stdout": json.dumps(stdout)}
    return {"counter": counter, "event": kind, "event_data": data}


def _record(tmp_path, events) -> Path:
    folder = tmp_path / "rec" / "artifacts" / "run" / "job_events"
    folder.mkdir(parents=True)
    for event in events:
        (folder / f"{event['counter']}.json").write_text(json.dumps(event))
    return tmp_path / "rec"


def test_left_locked_names_hosts_whose_lock_was_taken_or_may_be_and_not_given_back(tmp_path):
    taken, held = {"lock": {"taken": True}}, {"lock": {"taken": False}}
    record = _record(
        tmp_path,
        [
            _event(1, "runner_on_start", "done", locks.READ_TASK),
            _event(2, "runner_on_ok", "done", locks.READ_TASK, taken),
            _event(3, "runner_on_ok", "failed-later", locks.READ_TASK, taken),
            _event(4, "runner_on_ok", "other-run", locks.READ_TASK, held),
            _event(5, "runner_on_ok", "taken-over", locks.READ_TASK, held),
            _event(6, "runner_on_ok", "taken-over", locks.TAKE_OVER_TASK, taken),
            _event(7, "runner_on_start", "cut-short", locks.READ_TASK),
            _event(8, "runner_on_unreachable", "down", locks.READ_TASK),
            _event(9, "runner_on_ok", "done", locks.RELEASE_TASK, {"lock": {"released": True}}),
            # an answer that cannot be read (mangled): the lock may be this run's
            {
                "counter": 10,
                "event": "runner_on_ok",
                "event_data": {"host": "unread", "task": locks.READ_TASK, "res": {"stdout": '{"lock": {"taken": ***'}},
            },
        ],
    )
    assert locks.left_locked(record) == ["cut-short", "failed-later", "taken-over", "unread"]
    assert locks.released(record) == {"done"}


def test_held_errors_are_one_line_per_host():
    result = RunResult("site.yml", "failed", 2, False, "now", 1.0)
    result.failures = [
        {"host": "node1", "task": locks.HELD_TASK, "message": "host lock held by run r (pid 1 on c, since t): ..."},
        {"host": "node2", "task": "Something else", "message": "boom"},
    ]
    assert locks.held_errors(result) == ["node1: host lock held by run r (pid 1 on c, since t): ..."]


def _task_names(*files: Path) -> set[str]:
    names: set[str] = set()
    for path in files:
        for task in yaml.safe_load(path.read_text()) or []:
            names.add(task.get("name", ""))
    return names


def test_the_task_names_provision_reads_are_the_roles():
    tasks = REPO / "roles" / "provision_state" / "tasks"
    names = _task_names(
        *(tasks / f for f in ("read.yml", "read_lock.yml", "node_read.yml", "node_read_lock.yml", "unlock.yml"))
    )
    assert {locks.READ_TASK, locks.TAKE_OVER_TASK, locks.HELD_TASK, locks.RELEASE_TASK} <= names
    assert {locks.NODE_READ_TASK, locks.NODE_TAKE_OVER_TASK, locks.NODE_HELD_TASK, locks.NODE_RELEASE_TASK} <= names


def test_describe_is_the_scripts_own():
    holder = _holder()
    assert holder.describe() == f"run {holder.run_id} (pid {holder.pid} on {holder.controller}, since {holder.since})"


# The lock set: the run's hosts and the nodes of its containers.
HOSTS = """\
all:
  children:
    proxmox_hosts:
      hosts:
        pve1: {provision_state_lock_lease_s: 600}
        pve2:
    gpu_containers:
      hosts:
        ct1: {proxmox_host: pve1, proxmox_vmid: 101}
        ct2: {proxmox_host: pve1, proxmox_vmid: 102}
        ct3: {proxmox_host: "{{ node_of_ct3 }}", proxmox_vmid: 103, node_of_ct3: pve2}
"""


@pytest.fixture
def inv(tmp_path):
    root = tmp_path / "inv"
    root.mkdir()
    (root / "hosts.yml").write_text(HOSTS)
    return inventory.load(root, host_key_checking=False)


@pytest.mark.parametrize(
    ("limit", "hosts", "nodes"),
    [
        ("ct1", ["ct1", "pve1"], {"ct1": "pve1"}),
        ("ct1,ct2", ["ct1", "ct2", "pve1"], {"ct1": "pve1", "ct2": "pve1"}),
        ("ct3", ["ct3", "pve2"], {"ct3": "pve2"}),  # its node as Ansible renders it
        ("ct1,pve1", ["ct1", "pve1"], {}),  # the node is in the run: its own lock
        ("pve2", ["pve2"], {}),
        (None, ["ct1", "ct2", "ct3", "pve1", "pve2"], {}),
    ],
)
def test_the_lock_set_holds_the_node_of_every_container_in_scope(inv, limit, hosts, nodes):
    scope = inv.scope(limit)
    assert locks.lock_set(inv, scope) == hosts
    assert locks.nodes_outside(inv, scope) == nodes
    held = locks.LockSet.of(inv, scope)
    assert (held.hosts, held.nodes, held.request) == (hosts, nodes, None)


def test_renewal_comes_every_quarter_of_the_shortest_lease_in_the_lock_set(inv):
    assert locks.renewal_period(inv, ["ct1", "pve1"]) == 150  # pve1's own lease, 600 s
    assert locks.renewal_period(inv, ["ct3", "pve2"]) == 3600  # the role's default, 4 hours
    assert locks.LockSet.of(inv, inv.scope("ct1")).period_s == 150, "--limit ct1 takes pve1's lock: its lease counts"


def test_a_lease_that_is_no_number_of_seconds_names_the_host_and_variable(tmp_path):
    root = tmp_path / "inv"
    root.mkdir()
    (root / "hosts.yml").write_text(
        HOSTS.replace("provision_state_lock_lease_s: 600", "provision_state_lock_lease_s: soon")
    )
    inv = inventory.load(root, host_key_checking=False)
    with pytest.raises(ProvisionError) as caught:
        locks.LockSet.of(inv, inv.scope("ct1"))
    where = root / "hosts.yml"
    assert str(caught.value) == (
        f"{where}:5: host pve1: provision_state_lock_lease_s: expected a positive number of seconds, got 'soon'"
    )


def test_a_node_locked_through_its_container_is_named_by_its_own_name(tmp_path):
    taken, held = {"lock": {"taken": True}}, {"lock": {"taken": False}}
    record = _record(
        tmp_path,
        [
            _event(1, "runner_on_ok", "ct1", locks.READ_TASK, taken),
            _event(2, "runner_on_ok", "ct1", locks.NODE_READ_TASK, taken),  # delegated to pve1
            _event(3, "runner_on_ok", "ct2", locks.NODE_READ_TASK, held),
            _event(4, "runner_on_ok", "ct2", locks.NODE_TAKE_OVER_TASK, taken),  # pve2, from a gone run
            _event(5, "runner_on_start", "ct3", locks.NODE_READ_TASK),  # pve3: may be ours
            _event(6, "runner_on_ok", "ct2", locks.RELEASE_TASK, {"lock": {"released": True}}),
            _event(7, "runner_on_ok", "ct2", locks.NODE_RELEASE_TASK, {"lock": {"released": True}}),
        ],
    )
    nodes = {"ct1": "pve1", "ct2": "pve2", "ct3": "pve3"}
    assert locks.left_locked(record, nodes) == ["ct1", "pve1", "pve3"]
    assert locks.released(record, nodes) == {"ct2", "pve2"}


def test_held_errors_name_a_containers_node_lock_too():
    result = RunResult("site.yml", "failed", 2, False, "now", 1.0)
    message = "host lock of its node pve1 held by run r (pid 1 on c, since t): ..."
    result.failures = [{"host": "ct1", "task": locks.NODE_HELD_TASK, "message": message}]
    assert locks.held_errors(result) == [f"ct1: {message}"]


def test_lease_renewal_renews_every_period_until_the_run_ends_and_cancels_a_renewal_under_way():
    calls: list[float] = []
    under_way = threading.Event()

    def renew(stop: threading.Event) -> None:
        calls.append(time.monotonic())
        if len(calls) == 3:
            under_way.set()
            assert stop.wait(10), "the end of the run was not seen by the renewal under way"
        elif len(calls) == 2:
            raise ProvisionError("pve1: unreachable")

    started = time.monotonic()
    with locks.LeaseRenewal(renew, 0.05) as renewal:
        assert under_way.wait(10)
    assert len(calls) == 3, "a renewal after the end of the run"
    assert calls[0] - started >= 0.05, "the first renewal comes one period after the locks were taken"
    assert renewal.count == 2 and renewal.errors == ["ProvisionError: pve1: unreachable"], "a failed renewal stopped it"


def test_lease_renewal_does_nothing_in_a_run_shorter_than_its_period():
    calls = []
    with locks.LeaseRenewal(calls.append, 60):
        time.sleep(0.05)
    assert calls == []
