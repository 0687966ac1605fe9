"""The state fingerprint of a phase on one host: a digest over the paths its role watches.

Shared by the provision_state module (which records it after a phase converged) and the
provision_facts module (which recomputes it before the next run), so both read a host the same way.
"""

from __future__ import annotations

import glob
import hashlib
import json
import os
import stat

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
        return "unreadable: %s" % e.strerror


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
