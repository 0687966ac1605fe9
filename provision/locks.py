"""Who may change a fleet now: the per-inventory lock on the controller, and the run's host locks.

`provision apply`, `rollback` and `retire` (never `--check`, `plan`, `verify`, `capacity`, `diag` or `bench`) take:

- the controller lock: an flock on `<lock dir>/<inventory name>-<digest of its resolved path>.lock`, where the
  lock dir is `$XDG_CACHE_HOME/provision/locks` (`~/.cache/provision/locks`). The kernel drops an flock when its
  holder dies, so it never goes stale; the file names the holder for the next run's error line.
- a host lock on every host of the run, `<provision_state_dir>/lock.json`, taken by the same ssh command that
  reads the phase fingerprints (roles/provision_state, plugins/module_utils/provision_fingerprint.py) when the run
  passes `provision_lock` (`host_lock_request`), and given back by playbooks/unlock.yml at the end of the run.
  A failed host, or a playbook that Ansible or a signal stopped, never reaches that play: `left_locked` names
  the hosts whose lock the run took and did not give back, and apply runs unlock.yml again on them alone.

The run's lock set (`lock_set`) is its hosts and the node (`proxmox_host`) of each of its containers: a container's
gpu phase changes its CT config on the node through the API and may restart it, so `apply --limit <container>`
must stop a concurrent run that would reboot that node. A node outside the run's hosts is locked through its
container's read of the node in the facts step (delegated; `nodes_outside`), with the same lock.json and holder
record, given back by the container's delegated release in unlock.yml, and is not otherwise touched: no phase runs
there. The node-lock tasks report under the container's name: `left_locked` and `released` name the node.

A host lock holds for its lease (`provision_state_lock_lease_s`, 4 hours by default), so that a crashed run's lock
frees itself. A run may last longer: a `serial: 1` kernel rollout over twenty nodes, each reboot waiting minutes,
leaves the last node hours inside one phase with no task of the run touching it. So the lease is renewed by the
process that holds the controller lock, not by the run's tasks: while the playbook runs, `LeaseRenewal` runs
playbooks/renew.yml on the whole lock set every quarter of its shortest lease (`renewal_period`). The renewal
re-stamps a lock only where it names this run (plugins/module_utils/provision_fingerprint.py, `renew_lock`): it
never takes a lock, nor extends another run's. A lock thus lasts while its run's controller process lives and
reaches the host, and expires one lease after the last renewal that reached it; a host that cannot be reached for
a while (its reboot) misses a renewal or two, and is renewed at the next.
"""

from __future__ import annotations

import errno
import fcntl
import hashlib
import json
import os
import socket
import stat
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from provision import inventory as inventory_mod
from provision.errors import ProvisionError, one_line
from provision.job_events import task_outcomes
from provision.paths import module_util, role_default

# The role's task names (roles/provision_state/tasks/read.yml, node_read.yml and unlock.yml) whose results say who
# holds a lock.
# Keyed by name, not by a returned value, because the lock is taken and given back by raw commands, and a command
# that started and never answered (a signal, a dropped connection) left no result: only its start event, which
# names its task, says that the lock may be this run's. tests/unit/provision/test_locks.py checks each name is a task.
READ_TASK = "Read the recorded phase fingerprints on the host, and take the run's host lock"
TAKE_OVER_TASK = "Take over the host lock of a run of this controller whose process is gone"
HELD_TASK = "Stop where another run holds the host lock"
RELEASE_TASK = "Release the run's host lock"
# the same for the node of a container outside the run (--limit): they run on the container, delegated to its node
NODE_READ_TASK = (
    "Read the fingerprints on this container's node, outside this run (--limit), and take the node's host lock"
)
NODE_TAKE_OVER_TASK = (
    "Take over the host lock of this container's node from a run of this controller whose process is gone"
)
NODE_HELD_TASK = "Stop where another run holds the host lock of this container's node"
NODE_RELEASE_TASK = "Release the run's host lock of this container's node, outside this run (--limit)"
LEASE_VARIABLE = "provision_state_lock_lease_s"


class LockHeld(ProvisionError):
    """Another run holds a lock this run needs: exit 1, one line naming the holder."""


@dataclass(frozen=True)
class Holder:
    """A run holding a lock: the controller lock file and each host's lock.json record these."""

    run_id: str  # the run record directory's name
    controller: str  # host name of the machine provision runs on
    pid: int
    since: str  # UTC, when the run took its locks
    command: str
    # this boot's pid namespace on the controller: within it, a holder whose pid is gone is a dead run
    pid_ns: str

    @classmethod
    def for_run(cls, run_id: str, command: str) -> Holder:
        since = datetime.now(UTC).isoformat(timespec="seconds")
        return cls(run_id, socket.gethostname(), os.getpid(), since, command, pid_namespace())

    def describe(self) -> str:
        return describe(asdict(self))


def describe(holder: dict[str, Any]) -> str:
    """The one way a holder is named, on the controller and on the hosts: run id, pid, controller, since."""
    return module_util("provision_fingerprint").describe_holder(holder)


def pid_namespace() -> str:
    """Where this process's pid means this process: the boot, and the pid namespace within it."""
    try:
        boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
        return f"{boot}/{os.stat('/proc/self/ns/pid').st_ino}"
    except OSError:
        return ""  # no /proc: no run of this controller is ever taken for gone


def lock_dir() -> Path:
    cache = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(cache) / "provision" / "locks"


def controller_lock_path(inventory: Path) -> Path:
    resolved = Path(inventory).resolve()
    digest = hashlib.sha256(str(resolved).encode()).hexdigest()[:16]
    return lock_dir() / f"{resolved.name}-{digest}.lock"


def _refuse_shared_dir(directory: Path) -> None:
    """The lock's directory must be this user's and writable by nobody else: in a shared one ($XDG_CACHE_HOME set to
    a shared path), another user could plant a link at a lock's name, or take the lock away."""
    st = directory.lstat()
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid() or st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        raise ProvisionError(
            f"{directory}: the lock directory must be a directory of this user that no other user can write "
            f"(it is {stat.filemode(st.st_mode)}, owner uid {st.st_uid}): fix it, or set XDG_CACHE_HOME to one"
        )


@contextmanager
def controller_lock(inventory: Path, holder: Holder) -> Iterator[Path]:
    """Hold the inventory's controller lock while the body runs; LockHeld naming the holder if another run has it."""
    path = controller_lock_path(inventory)
    try:
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        _refuse_shared_dir(path.parent)
        # O_NOFOLLOW: a link planted at the lock's name would make the truncate below hit the file it names;
        # not inherited by ansible-playbook (PEP 446)
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
    except OSError as exc:
        why = "it is a symbolic link" if exc.errno == errno.ELOOP else exc.strerror or exc
        raise ProvisionError(f"{path}: cannot open the inventory's lock: {why}") from None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise LockHeld(held_message(inventory, path, _read_holder(fd))) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps(asdict(holder)).encode(), 0)
        yield path
    finally:
        os.close(fd)  # the flock goes with the last descriptor


def _read_holder(fd: int) -> dict[str, Any]:
    """The holder a locked file names; its holder may be writing it this instant, so read again briefly."""
    for _ in range(20):
        try:
            return json.loads(os.pread(fd, 65536, 0))
        except ValueError:
            time.sleep(0.05)
    return {}


def held_message(inventory: Path, path: Path, holder: dict[str, Any]) -> str:
    command = f", {holder['command']}" if holder.get("command") else ""
    return (
        f"inventory {inventory} is locked by {describe(holder)}{command}: "
        f"wait for it to end (lock {path}; the lock goes when that process does)"
    )


def host_lock_request(holder: Holder, break_lock: bool) -> dict[str, Any]:
    """provision_lock, the extra var that makes the facts step take each host's lock for this run."""
    return {**asdict(holder), "break": break_lock}


def _lock_answer(outcome: dict[str, Any]) -> dict[str, Any] | None:
    """The lock part of a lock task's output; None when the task never answered."""
    try:
        return module_util("json_record").last_json_line(outcome["res"]["stdout"]).get("lock") or {}
    except (KeyError, TypeError, ValueError, AttributeError):
        return None


def left_locked(record_dir: Path, nodes: dict[str, str] | None = None) -> list[str]:
    """Hosts whose lock this run took, or may have taken (its command started and never answered), and whose
    release did not answer. `nodes` (`nodes_outside`) names the node a container's delegated lock task locked."""
    maybe: set[str] = set()
    tasks = {READ_TASK: {}, TAKE_OVER_TASK: {}, NODE_READ_TASK: nodes or {}, NODE_TAKE_OVER_TASK: nodes or {}}
    for task, locked in tasks.items():
        for host, outcome in task_outcomes(record_dir, task, started=True).items():
            answer = _lock_answer(outcome)
            unread = answer is None and outcome["event"] == "runner_on_ok"  # it answered, in words we cannot read
            if outcome["event"] == "runner_on_start" or unread or (answer or {}).get("taken"):
                maybe.add(locked.get(host, host))
    return sorted(maybe - released(record_dir, nodes))


def released(record_dir: Path, nodes: dict[str, str] | None = None) -> set[str]:
    """Hosts where the release answered: the lock is given back, or is no longer this run's."""
    found = {h for h, o in task_outcomes(record_dir, RELEASE_TASK).items() if _lock_answer(o) is not None}
    delegated = task_outcomes(record_dir, NODE_RELEASE_TASK).items()
    return found | {(nodes or {}).get(ct, ct) for ct, o in delegated if _lock_answer(o) is not None}


def held_errors(result) -> list[str]:
    """One error line per host whose lock (or whose node's lock) another run holds: the host, the holder and
    --break-lock."""
    # a failure carries its host, task and message only: a HELD task's failure is the one that means "held"
    return [f"{f['host']}: {f['message']}" for f in result.failures if f["task"] in (HELD_TASK, NODE_HELD_TASK)]


@dataclass(frozen=True)
class LockSet:
    """The host locks of one run: which hosts, the container through which each node outside the run's hosts is
    locked, how often the leases are renewed, and the run's request (`host_lock_request`) once it is known."""

    hosts: list[str]
    nodes: dict[str, str]  # container -> its node, outside the run's hosts (`nodes_outside`)
    period_s: float  # `renewal_period`
    request: dict[str, Any] | None = None

    @classmethod
    def of(cls, inv: inventory_mod.Inventory, scope: list[str]) -> LockSet:
        hosts = lock_set(inv, scope)
        return cls(hosts, nodes_outside(inv, scope), renewal_period(inv, hosts))


def nodes_outside(inv: inventory_mod.Inventory, scope: list[str]) -> dict[str, str]:
    """Container -> its node (`proxmox_host`), for each container in scope whose node is not: the run locks that
    node too, through the container (module doc)."""
    found = {}
    for name in scope:
        host = inv.hosts[name]
        if inventory_mod.GPU_CONTAINERS in host.groups and host.value("proxmox_host") is not None:
            node = str(inventory_mod.rendered(inv, host, "proxmox_host"))
            if node not in scope:
                found[name] = node
    return found


def lock_set(inv: inventory_mod.Inventory, scope: list[str]) -> list[str]:
    """The hosts whose lock the run takes: its own, and the nodes of its containers."""
    return sorted({*scope, *nodes_outside(inv, scope).values()})


def lease_s(inv: inventory_mod.Inventory, name: str) -> int:
    """A host's lease, as the role reads it: its inventory's provision_state_lock_lease_s, else the role default."""
    host = inv.hosts[name]
    if host.value(LEASE_VARIABLE) is None:
        return _default_lease_s()
    value = inventory_mod.rendered(inv, host, LEASE_VARIABLE)
    try:
        seconds = int(value)
    except (TypeError, ValueError):
        seconds = 0
    if seconds <= 0:
        raise ProvisionError(
            f"{host.where(LEASE_VARIABLE)}: host {name}: {LEASE_VARIABLE}: expected a positive "
            f"number of seconds, got {value!r}"
        )
    return seconds


def _default_lease_s() -> int:
    return int(role_default("provision_state", LEASE_VARIABLE))


def renewal_period(inv: inventory_mod.Inventory, hosts: list[str]) -> float:
    """How often the running apply renews its host locks: a quarter of the shortest lease among them, so that a
    host that misses a renewal or two (a reboot) still holds its lock."""
    return min((lease_s(inv, h) for h in hosts), default=_default_lease_s()) / 4


class LeaseRenewal:
    """While entered, a thread calls `renew(stop)` every `period_s` seconds (the first time one period after
    entry); on exit `stop` is set, which a renewal under way sees (it cancels its playbook), and the thread is
    waited for. A renewal that raised is kept in `errors`, and the next one runs: the run goes on either way."""

    def __init__(self, renew: Callable[[threading.Event], object], period_s: float) -> None:
        self.renew, self.period_s = renew, period_s
        self.stop = threading.Event()
        self.count = 0
        self.errors: list[str] = []
        self._thread = threading.Thread(target=self._loop, name="host-lock-renewal", daemon=True)

    def _loop(self) -> None:
        while not self.stop.wait(self.period_s):
            try:
                self.renew(self.stop)
                self.count += 1
            except Exception as exc:  # a renewal must never stop the run it keeps
                self.errors.append(one_line(f"{type(exc).__name__}: {exc}"))

    def __enter__(self) -> LeaseRenewal:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self._thread.join()
