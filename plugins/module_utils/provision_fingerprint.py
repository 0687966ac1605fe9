"""The state fingerprint of a phase on one host: a digest over the paths its role watches.

One file, two uses, so that the record and the check read a host the same way:
- module_utils of the provision_state module, which records a fingerprint after a phase converged;
- a standalone script (standard library only) that tasks/facts.yml runs on each host with
  `python3 -c <this file> read <dir>` through ansible.builtin.raw before the next run: it recomputes every
  recorded fingerprint and prints `{"fingerprints": {name: {"inputs", "current"}}, "boot_id"}`. Nothing is
  written. A module would cost Ansible's module runtime start on each host (about 3 s on the lab's emulated
  CPUs against 1 s for this script, measured), on every run, for a read.
"""

from __future__ import annotations

import glob
import hashlib
import json
import os
import stat
import sys

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


if __name__ == "__main__" and sys.argv[1:2] == ["read"]:
    print(json.dumps(dict(fingerprints=read_all(sys.argv[2]), boot_id=_boot_id())))
