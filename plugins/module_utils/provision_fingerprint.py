"""The state fingerprint of a phase on one host (a digest over the paths its role watches), and the run's
host lock.

One file, two uses, so that the record and the check read a host the same way:
- module_utils of the provision_state module, which records a fingerprint after a phase converged;
- a standalone script (standard library only) that tasks/facts.yml runs on each host with
  `python3 -c <this file> read <dir> [<lock request>]` through ansible.builtin.raw before the next run: it
  recomputes every recorded fingerprint and prints `{"fingerprints": {name: {"inputs", "current"}}, "boot_id"}`.
  Nothing is written, unless the run asks for the host lock (`provision apply` passes `provision_lock`): then,
  in the same process, it takes `<dir>/lock.json` or names who holds it (`"lock"` in the output). A module
  would cost Ansible's module runtime start on each host (about 3 s on the lab's emulated CPUs against 1 s for
  this script, measured), on every run, for a read; the lock rides on the same ssh command for the same reason.
  `lock <dir> <request>` takes it alone (a run of this controller that is gone, taken over). The release at the
  end of a run is roles/provision_state/files/release_lock.sh: it needs no Python.

The lock's lease, and its renewal. A lock holds for `lease_s` seconds (host clock) from `taken_at`; an older one is
expired and the next run takes it, so a crashed run's lock frees itself. A run may last longer than that (a
`serial: 1` kernel rollout over many nodes, each reboot waiting minutes: the last node waits hours inside the one
phase, and no task of the run touches it meanwhile). So the lease is not renewed by the run's tasks but by the
process that holds the controller lock: while the site playbook runs, `provision apply` runs `renew <dir> <request>`
on every host of the run's lock set every quarter lease (provision/locks.py, LeaseRenewal), through its own
playbook (playbooks/renew.yml). `renew_lock` re-stamps `taken_at` only when the lock names this run (run id,
controller, pid); it never takes a free lock, never extends another run's, and never makes the state directory.
A lock thus lasts while its controller process lives and reaches the host, and expires a lease after the last
renewal that reached it: after the controller died, or lost the host for a whole lease.
"""

from __future__ import annotations

import contextlib
import fcntl
import glob
import hashlib
import json
import os
import stat
import sys
import time

# /proc and /sys files report size 0: read them, but never more than this from any file
READ_LIMIT = 1 << 20
FINGERPRINT_DIR = "fingerprint"


def _entry(path):
    try:
        st = os.lstat(path)
    except OSError:
        return [path, "missing"]
    entry = [path, stat.S_IFMT(st.st_mode), stat.S_IMODE(st.st_mode), st.st_uid, st.st_gid]
    if stat.S_ISCHR(st.st_mode) or stat.S_ISBLK(st.st_mode):
        entry += [os.major(st.st_rdev), os.minor(st.st_rdev)]
    elif stat.S_ISLNK(st.st_mode):
        entry.append(os.readlink(path))
    elif stat.S_ISDIR(st.st_mode):
        entry.append(sorted(os.listdir(path)))
    elif stat.S_ISREG(st.st_mode):
        entry.append(_content_digest(path))
    return entry


def _content_digest(path):
    try:
        with open(path, "rb") as f:
            return hashlib.sha256(f.read(READ_LIMIT)).hexdigest()
    except OSError as e:
        return "unreadable: " + str(e.strerror)


def digest(patterns):
    """sha256 over every path the glob patterns match (type, mode, owner, device numbers, link
    target, directory listing or content); a pattern that matches nothing counts as absent."""
    entries = []
    for pattern in patterns:
        matches = sorted(glob.glob(pattern)) if glob.has_magic(pattern) else [pattern]
        entries.append([pattern, [_entry(path) for path in matches]])
    return hashlib.sha256(json.dumps(entries, sort_keys=True).encode()).hexdigest()


def fingerprint_path(state_dir, name):
    return os.path.join(state_dir, FINGERPRINT_DIR, name + ".json")


def read_all(state_dir):
    """Every recorded fingerprint under state_dir, recomputed: {name: {inputs, current}}."""
    found = {}
    for path in sorted(glob.glob(fingerprint_path(state_dir, "*"))):
        name = os.path.basename(path)[: -len(".json")]
        try:
            with open(path) as f:
                record = json.load(f)
            current = record["state"] == digest(record["watch"])
        except (OSError, ValueError, KeyError, TypeError):
            continue
        found[name] = dict(inputs=record.get("inputs"), current=current)
    return found


def _boot_id():
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            return f.read().strip()
    except OSError:
        return None


# The host lock: <state dir>/lock.json (0600), holding who runs: run id, controller, pid, since, the pid's
# namespace on the controller, and when (host clock) and for how long (lease) it was taken.
LOCK_FILE = "lock.json"
DEFAULT_LEASE_S = 4 * 3600
_IDENTITY = ("run_id", "controller", "pid")


def same_run(a, b):
    return all(a.get(key) == b.get(key) for key in _IDENTITY)


def describe_holder(holder):
    """One line naming a lock's holder: run id, pid, controller and since when."""
    run_id, pid = holder.get("run_id", "?"), holder.get("pid", "?")
    return f"run {run_id} (pid {pid} on {holder.get('controller', '?')}, since {holder.get('since', '?')})"


def lock_decision(current, request, now):
    """May the run of `request` take the host lock that `current` records (None: nobody)? One of:
    free; ours (this run holds it already); stale (a run of this controller found gone, named by the request's
    take_over); expired (older than the lease it was taken with); broken (--break-lock, from a run of another
    controller: one of this controller is either gone, and taken over as stale, or alive, and not to be broken);
    held (it may not)."""
    if not current:
        return "free"
    if same_run(current, request):
        return "ours"
    if request.get("take_over") and same_run(current, request["take_over"]):
        return "stale"
    try:
        expires = float(current.get("taken_at", 0)) + float(current.get("lease_s", DEFAULT_LEASE_S))
    except (TypeError, ValueError):
        expires = 0
    if now >= expires:
        return "expired"
    other_controller = current.get("pid_ns") != request.get("pid_ns") or not request.get("pid_ns")
    return "broken" if request.get("break") and other_controller else "held"


def _read_lock(path):
    try:
        with open(path) as f:
            current = json.load(f)
    except FileNotFoundError:
        return None
    except (OSError, ValueError):
        # unreadable: held by nobody we can name, until its lease runs out (counted from the file's time)
        return dict(run_id="unreadable " + path, taken_at=os.stat(path).st_mtime)
    return current if isinstance(current, dict) else dict(run_id="unreadable " + path)


def _write_lock(path, record):
    """Written whole, then renamed over the lock, under the state directory's flock (_locked_dir): one writer at a
    time, so a fixed name serves. Not tempfile: its import (shutil, random) was a fifth of the read on a slow host."""
    tmp = path + ".tmp"
    with contextlib.suppress(FileNotFoundError):  # what a crashed write left: made anew, with this write's owner
        os.unlink(tmp)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)  # root's under become
    with os.fdopen(fd, "w") as f:
        json.dump(record, f, sort_keys=True)
    os.replace(tmp, path)


def _locked_dir(state_dir):
    """The state directory, flock()ed: a decision and its write happen with no other run in between."""
    if not os.path.isdir(state_dir):
        os.makedirs(state_dir, mode=0o755, exist_ok=True)
    fd = os.open(state_dir, os.O_RDONLY)
    fcntl.flock(fd, fcntl.LOCK_EX)
    return fd


def take_lock(state_dir, request, now=None):
    """Take the host lock for the run of `request`, or say who holds it:
    {"decision", "taken", "holder": the lock's previous or current holder, "holder_text"}."""
    now = time.time() if now is None else now
    path = os.path.join(state_dir, LOCK_FILE)
    fd = _locked_dir(state_dir)
    try:
        current = _read_lock(path)
        decision = lock_decision(current, request, now)
        if decision != "held":
            record = {k: request.get(k) for k in (*_IDENTITY, "since", "pid_ns", "command")}
            record.update(taken_at=now, lease_s=request.get("lease_s", DEFAULT_LEASE_S))
            _write_lock(path, record)
    finally:
        os.close(fd)
    holder = current if decision not in ("free", "ours") else None
    text = describe_holder(holder) if holder else ""
    return dict(decision=decision, taken=decision != "held", holder=holder, holder_text=text)


def renew_lock(state_dir, request, now=None):
    """Re-stamp the host lock's `taken_at` (and its lease, `lease_s` of the request) when it is the lock of the run
    of `request`; anything else (no lock, no state directory, another run's lock, expired or not) is left as it is.
    {"renewed", "holder_text": who holds it, when not this run}."""
    now = time.time() if now is None else now
    path = os.path.join(state_dir, LOCK_FILE)
    if not os.path.isdir(state_dir):
        return dict(renewed=False, holder_text="")
    fd = _locked_dir(state_dir)
    try:
        current = _read_lock(path)
        renewed = bool(current) and same_run(current, request)
        if renewed:
            _write_lock(path, {**current, "taken_at": now, "lease_s": request.get("lease_s", current.get("lease_s"))})
    finally:
        os.close(fd)
    return dict(renewed=renewed, holder_text=describe_holder(current) if current and not renewed else "")


COMMANDS = ("read", "lock", "renew")


def main(argv):
    command, state_dir, args = argv[0], argv[1], [json.loads(a) for a in argv[2:]]
    if command == "read":
        out = dict(fingerprints=read_all(state_dir), boot_id=_boot_id())
        if args:
            out["lock"] = take_lock(state_dir, args[0])
    elif command == "renew":
        out = dict(lock=renew_lock(state_dir, args[0]))
    else:  # lock
        out = dict(lock=take_lock(state_dir, args[0]))
    sys.stdout.write(json.dumps(out) + "\n")


if __name__ == "__main__" and sys.argv[1:2] in [[c] for c in COMMANDS]:
    main(sys.argv[1:])
