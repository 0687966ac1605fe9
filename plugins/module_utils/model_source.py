"""Where a container's model weights come from (`sglang_model_source`), and how a download is checked.

One rule for `provision inventory check`, the sglang role's preflight and the sglang_weights module:

- `{}` (or unset): the weights are already at `sglang_model_path`, as before;
- `{type: node_dir, path: /srv/models/x}`: a directory on the node, bind-mounted read-only into the CT at
  `sglang_model_path` through an `mpN` entry (module_utils/lxc_mounts.py);
- `{type: huggingface, repo: org/name, revision: <40-hex commit>}`: downloaded into the CT with huggingface_hub.
  A branch or tag name is refused: it moves, and a re-run would then fetch other weights.

Checking a file against what the hub reports (`HfApi.model_info(files_metadata=True)`, huggingface_hub 1.33.0
hf_api.py l.1071-1091 `RepoSibling`): an LFS file by its size and `lfs.sha256`; any other file by its size and
its git blob id (`blobId`), which is git's object name for its content: sha1 of `blob <size>\\0` + the bytes. The
hub reports no sha256 for non-LFS files, so those are verified by that sha1 only.
"""

from __future__ import annotations

import hashlib
import os
import re

COMMIT = re.compile(r"^[0-9a-f]{40}$")
# the hub's repo ids: `name` or `namespace/name` (huggingface_hub utils/_validators.py validate_repo_id)
REPO_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,95}(/[A-Za-z0-9][A-Za-z0-9_.-]{0,95})?$")
TYPES = ("node_dir", "huggingface")
KEYS = {"node_dir": {"type", "path"}, "huggingface": {"type", "repo", "revision"}}
CHUNK = 1 << 20
# the record of a verified download, in the model directory (read back to skip re-hashing unchanged files)
MANIFEST = ".provision-weights.json"
# where a download is put together in the model directory before its files are moved into place
STAGING = ".provision-download"
# in the staging directory: the repo and revision whose verified files it keeps for the next run
STAGING_RECORD = ".provision-staging.json"
# what in the model directory is not the model's: the record, the staging, the client's own records
NOT_MODEL_FILES = (MANIFEST, MANIFEST + ".tmp", STAGING, ".cache")


def source_problems(source) -> list[str]:
    """What is wrong with a `sglang_model_source` value, one short line each (the caller names host and
    variable); [] when it is usable. An empty value is usable: it means "already in place"."""
    if source in (None, {}, ""):
        return []
    if not isinstance(source, dict):
        return [f"must be a mapping with a type ({' or '.join(TYPES)}), not {type(source).__name__}"]
    kind = source.get("type")
    if kind not in TYPES:
        return [f"type must be {' or '.join(TYPES)}, not {kind!r}"]
    problems = [f"unknown key {key!r} for type {kind}" for key in sorted(set(source) - KEYS[kind])]
    if kind == "node_dir":
        path = source.get("path")
        if not isinstance(path, str) or not path.startswith("/") or "/../" in path + "/" or "," in path:
            problems.append(f"path must be an absolute directory on the node without '..' or ',', not {path!r}")
        return problems
    repo, revision = source.get("repo"), source.get("revision")
    if not isinstance(repo, str) or not REPO_ID.match(repo) or ".." in repo:
        problems.append(f"repo must be a Hugging Face repo id (namespace/name), not {repo!r}")
    if not isinstance(revision, str) or not COMMIT.match(revision):
        problems.append(f"revision must be a commit: 40 lowercase hex digits (a branch or tag moves), not {revision!r}")
    return problems


def expected_file(name, size, blob_id, lfs_sha256=None) -> dict:
    """What one file must be: its size and either its sha256 (LFS) or its git blob sha1."""
    if lfs_sha256:
        return {"name": name, "size": int(size), "sha256": lfs_sha256}
    return {"name": name, "size": int(size), "git_sha1": blob_id}


def safe_name(name: str) -> bool:
    """A repo file name that stays inside the model directory."""
    parts = name.split("/")
    return bool(name) and not name.startswith("/") and all(p not in ("", ".", "..") for p in parts)


def file_digests(path) -> tuple[int, str, str]:
    """(size, sha256, git blob sha1) of a file, read once."""
    size = os.path.getsize(path)
    sha256, sha1 = hashlib.sha256(), hashlib.sha1(b"blob %d\0" % size)  # git object name
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(CHUNK), b""):
            sha256.update(chunk)
            sha1.update(chunk)
    return size, sha256.hexdigest(), sha1.hexdigest()


def mismatch(expected: dict, size: int, sha256: str, git_sha1: str):
    """Why a file is not what the hub reports (one phrase), or None when it is."""
    if size != expected["size"]:
        return f"size {size}, the hub reports {expected['size']}"
    if "sha256" in expected and sha256 != expected["sha256"]:
        return f"sha256 {sha256}, the hub reports {expected['sha256']}"
    if "git_sha1" in expected and git_sha1 != expected["git_sha1"]:
        return f"git blob sha1 {git_sha1}, the hub reports {expected['git_sha1']}"
    return None


def stat_key(path):
    """What says a file is unchanged since it was verified: (size, mtime_ns, inode), or None when missing."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return [st.st_size, st.st_mtime_ns, st.st_ino]


def recorded_complete(manifest, repo: str, revision: str, root: str) -> bool:
    """Whether the manifest is this repo at this revision and every file in it is as it was when verified."""
    if not isinstance(manifest, dict) or manifest.get("repo") != repo or manifest.get("revision") != revision:
        return False
    files = manifest.get("files")
    if not isinstance(files, dict) or not files:
        return False
    return all(stat_key(os.path.join(root, name)) == entry.get("stat") for name, entry in files.items())


def recorded_unchanged(manifest, expected: dict, root: str) -> bool:
    """Whether one file was verified against these same expectations and has not changed since."""
    entry = ((manifest or {}).get("files") or {}).get(expected["name"])
    if not isinstance(entry, dict):
        return False
    same = all(entry.get(k) == expected.get(k) for k in ("size", "sha256", "git_sha1"))
    return same and stat_key(os.path.join(root, expected["name"])) == entry.get("stat")


def recorded_not_listed(manifest, files: list[dict]) -> list[str]:
    """The files the record says a download put in the model directory and that `files` (the revision now asked
    for) does not list: what a change of revision leaves behind. Names that would leave the directory are never
    returned, whatever the record says."""
    listed = {f["name"] for f in files}
    return sorted(n for n in recorded_files(manifest) if isinstance(n, str) and safe_name(n) and n not in listed)


def recorded_files(manifest) -> dict:
    """{name: entry} of the record, {} when it has none or is not one."""
    files = manifest.get("files") if isinstance(manifest, dict) else None
    return files if isinstance(files, dict) else {}


def files_under(root: str) -> list[str]:
    """Every file (or link) under `root`, relative, outside NOT_MODEL_FILES; [] when root does not exist."""
    found = []
    for top, dirs, names in os.walk(root):
        if top == root:
            dirs[:] = [d for d in dirs if d not in NOT_MODEL_FILES]
            names = [n for n in names if n not in NOT_MODEL_FILES]
        rel = os.path.relpath(top, root)
        found += [n if rel == "." else f"{rel}/{n}" for n in names]
    return sorted(found)


def free_bytes(path: str) -> tuple[str, int]:
    """(the nearest existing directory at or above `path`, bytes free there for an unprivileged writer)."""
    probe = os.path.abspath(path)
    while not os.path.isdir(probe) and probe != "/":
        probe = os.path.dirname(probe)
    st = os.statvfs(probe)
    return probe, st.f_bavail * st.f_frsize


def space_problem(path: str, need: int, where: str, free: int):
    """The one line that says the download does not fit, or None."""
    if need <= free:
        return None
    return f"{path}: the download needs {human(need)} ({need} bytes) and {where} has {human(free)} ({free} bytes) free"


def human(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return f"{n:.1f} {unit}" if unit != "B" else f"{n} B"
        n /= 1024
    return f"{n} B"
