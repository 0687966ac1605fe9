"""Who may change a fleet now: the per-inventory lock on the controller, and the run's host locks.

`provision apply` and `rollback` (never `--check`, `plan`, `verify`, `capacity`, `diag` or `bench`) take:

- the controller lock: an flock on `<lock dir>/<inventory name>-<digest of its resolved path>.lock`, where the
  lock dir is `$XDG_CACHE_HOME/provision/locks` (`~/.cache/provision/locks`). The kernel drops an flock when its
  holder dies, so it never goes stale; the file names the holder for the next run's error line.
- a host lock on every host of the run, `<provision_state_dir>/lock.json`, taken by the same ssh command that
  reads the phase fingerprints (roles/provision_state, plugins/module_utils/provision_fingerprint.py) when the run
  passes `provision_lock` (`host_lock_request`), and given back by playbooks/unlock.yml at the end of the run.
  A failed host, or a playbook that Ansible or a signal stopped, never reaches that play: `left_locked` names
  the hosts whose lock the run took and did not give back, and apply runs unlock.yml again on them alone.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import socket
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from provision.errors import ProvisionError
from provision.job_events import task_outcomes
from provision.paths import module_util

# The role's task names (roles/provision_state/tasks/facts.yml and unlock.yml) whose results say who holds a lock.
# Keyed by name, not by a returned value, because the lock is taken and given back by raw commands, and a command
# that started and never answered (a signal, a dropped connection) left no result: only its start event, which
# names its task, says that the lock may be this run's. tests/unit/test_locks.py checks each name is a task.
READ_TASK = "Read the recorded phase fingerprints on the host, and take the run's host lock"
TAKE_OVER_TASK = "Take over the host lock of a run of this controller whose process is gone"
HELD_TASK = "Stop where another run holds the host lock"
RELEASE_TASK = "Release the run's host lock"


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


@contextmanager
def controller_lock(inventory: Path, holder: Holder) -> Iterator[Path]:
    """Hold the inventory's controller lock while the body runs; LockHeld naming the holder if another run has it."""
    path = controller_lock_path(inventory)
    try:
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)  # not inherited by ansible-playbook (PEP 446)
    except OSError as exc:
        raise ProvisionError(f"{path}: cannot open the inventory's lock: {exc.strerror or exc}") from None
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
        return json.loads(outcome["res"]["stdout"]).get("lock") or {}
    except (KeyError, TypeError, ValueError, AttributeError):
        return None


def left_locked(record_dir: Path) -> list[str]:
    """Hosts whose lock this run took, or may have taken (its command started and never answered), and whose
    release did not answer."""
    maybe: set[str] = set()
    for task in (READ_TASK, TAKE_OVER_TASK):
        for host, outcome in task_outcomes(record_dir, task, started=True).items():
            answer = _lock_answer(outcome)
            unread = answer is None and outcome["event"] == "runner_on_ok"  # it answered, in words we cannot read
            if outcome["event"] == "runner_on_start" or unread or (answer or {}).get("taken"):
                maybe.add(host)
    return sorted(maybe - released(record_dir))


def released(record_dir: Path) -> set[str]:
    """Hosts where the release answered: the lock is given back, or is no longer this run's."""
    return {h for h, o in task_outcomes(record_dir, RELEASE_TASK).items() if _lock_answer(o) is not None}


def held_errors(result) -> list[str]:
    """One error line per host whose lock another run holds: the host, the holder and --break-lock."""
    # a failure carries its host, task and message only: HELD_TASK's failure is the one that means "held"
    return [f"{f['host']}: {f['message']}" for f in result.failures if f["task"] == HELD_TASK]
