#!/usr/bin/python
"""Ansible module (container): a Hugging Face repo at a pinned commit in the model directory, every file checked."""

from __future__ import annotations

DOCUMENTATION = r"""
module: sglang_weights
short_description: Download a Hugging Face model repo at a pinned commit with huggingface_hub, and verify each file
author: provision maintainers (!UNKNOWN)
description:
  - Runs in the container with the Python of the venv that holds C(huggingface_hub) (SGLang depends on it).
  - Asks the hub for the repo's files at I(revision) (C(HfApi.model_info) with C(files_metadata=True)), checks that
    they fit in the free space at I(path) (one line naming the path, the need and what is free), downloads each
    missing or wrong file with C(hf_hub_download) into I(path), and verifies every file against the size and hash
    the hub reports; an LFS file by its sha256, any other file by its git blob sha1 (the hub reports no sha256 for
    those). A file that does not match is removed, and the module fails naming it.
  - Files are downloaded into C(.provision-download) inside I(path) and moved into place only when every file of
    the revision is there and verified; a download that fails leaves I(path) as it was (a complete earlier
    revision stays complete), and keeps the files it verified in C(.provision-download) for the next run of the same
    revision, which downloads only the rest (a run of another revision removes them). After the move, the files
    that the record says an earlier download put there and that this revision does not list (say a stale
    C(model.safetensors.index.json)) are removed. A file in I(path) that no download of this module put there and
    that the revision does not list is left, with a warning naming it.
  - A record of the verified files (C(.provision-weights.json) in I(path)) lets a re-run skip the hub and the
    hashing when every file is as it was verified (same size, mtime and inode); it then reports no change.
  - The token reaches the client as a module parameter only; it is never on a command line, in the result or in
    the record.
  - In check mode, reports which files would be downloaded and which removed, and changes nothing. Run by a
    Python without C(huggingface_hub) (the venv the role installs it into does not exist yet), check mode reports
    the download as pending, unless the record says the revision is complete in I(path).
options:
  repo:
    type: str
    required: true
    description: The repo id, namespace/name.
  revision:
    type: str
    required: true
    description: The commit, 40 hex digits. A branch or tag name is refused.
  path:
    type: path
    required: true
    description: The model directory in the container (sglang_model_path).
  token:
    type: str
    description: The hub token (from the environment or vault); needed for gated or private repos.
  endpoint:
    type: str
    description:
      - The hub's URL. Default is the client's own (C(HF_ENDPOINT) of the module's environment, else
        https://huggingface.co).
  files:
    type: list
    elements: str
    description:
      - Only these files of the revision, into the staging directory (each verified), and nothing put in place; the
        result's I(progress) says where the whole download stands. A run without I(files) then puts the revision in
        place, downloading only what is not staged yet.
      - The sglang role calls it once per missing file, so that the console shows the download's progress between
        files. Such a call trusts the record for the files in place (it hashes none of them), and hashes a staged
        file only when the staging record does not vouch for it.
extends_documentation_fragment:
  - provision.pve_sglang.attributes
attributes:
  check_mode:
    support: full
  diff_mode:
    support: none
"""

EXAMPLES = r"""
- name: Download the model at its pinned commit
  provision.pve_sglang.sglang_weights:
    repo: Qwen/Qwen3-8B
    revision: 9c925d64d72725edaf899c6cb9c377fd0709d9c5
    path: /models/Qwen3-8B
    token: "{{ sglang_hf_token }}"
  vars:
    ansible_python_interpreter: /opt/sglang/venv/bin/python
  no_log: true

- name: Stage one file of the revision (verified), leaving the model directory as it is
  provision.pve_sglang.sglang_weights:
    repo: Qwen/Qwen3-8B
    revision: 9c925d64d72725edaf899c6cb9c377fd0709d9c5
    path: /models/Qwen3-8B
    files: [model-00001-of-00005.safetensors]
  vars:
    ansible_python_interpreter: /opt/sglang/venv/bin/python
"""

RETURN = r"""
files:
  description:
    - One entry per file, with what the run did to it - present, downloaded or would_download (a file of the
      revision), removed or would_remove (a file of an earlier download that the revision does not list).
    - With I(files), one entry per named file - present (in place and right), already_staged, staged, or
      would_stage in check mode.
    - Empty in check mode when the client is not installed yet (see I(msg)).
  type: list
  elements: dict
  returned: always
downloaded_bytes:
  description: Bytes downloaded (or that would be, in check mode).
  type: int
  returned: always
client_version:
  description: The huggingface_hub version that ran; null in check mode when it is not installed yet.
  type: str
  returned: always
progress:
  description:
    - With I(files), where the download of the revision's missing files stands after this call - C(files) and
      C(bytes) to download in all, C(files_staged) and C(bytes_staged) verified in the staging directory so far, and
      C(downloaded_bytes) and C(seconds) of this call's transfers.
  type: dict
  returned: when I(files) is given
msg:
  description: In check mode without the client, that the download is pending and why the files are not listed.
  type: str
  returned: when the client is not installed yet, in check mode
"""

import contextlib
import os
import shutil
import sys
import time

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.provision.pve_sglang.plugins.module_utils import model_source as ms
from ansible_collections.provision.pve_sglang.plugins.module_utils.json_record import read_json, write_json


class WeightsError(Exception):
    pass


def hub_client(required: bool = True):
    """huggingface_hub; when it is missing, None (not `required`: check mode) or one line saying which Python
    lacks it."""
    try:
        import huggingface_hub

        return huggingface_hub
    except ImportError as exc:
        if not required:
            return None
        raise WeightsError(
            f"huggingface_hub is not installed for {sys.executable}: run this module with the Python of the venv "
            "that holds it (the sglang role installs it there)"
        ) from exc


def hub_files(hf, p) -> list[dict]:
    """The repo's files at the revision as the hub reports them; its refusals as one line each."""
    from huggingface_hub import errors

    api = hf.HfApi(endpoint=p["endpoint"], token=p["token"] or False)
    where = f"{p['repo']} at {p['revision']}"
    try:
        info = api.model_info(p["repo"], revision=p["revision"], files_metadata=True)
    except errors.GatedRepoError as exc:
        raise WeightsError(
            f"{where}: the repo is gated and the hub refused the token ({status(exc)}): "
            "set sglang_hf_token to a token with access"
        ) from exc
    except errors.RevisionNotFoundError as exc:
        raise WeightsError(f"{where}: the hub has no such revision ({status(exc)})") from exc
    except errors.RepositoryNotFoundError as exc:
        raise WeightsError(f"{where}: no such repo, or the token has no access to it ({status(exc)})") from exc
    except errors.HfHubHTTPError as exc:
        raise WeightsError(f"{where}: the hub answered {status(exc)}") from exc
    except OSError as exc:  # httpx's connect and timeout errors are not OSErrors; caught below by name
        raise WeightsError(f"{where}: cannot reach the hub at {api.endpoint}: {exc}") from exc
    if info.sha != p["revision"]:
        raise WeightsError(f"{where}: the hub resolved the revision to {info.sha}")
    files = []
    for s in info.siblings or []:
        if not ms.safe_name(s.rfilename) or s.size is None:
            raise WeightsError(
                f"{where}: the hub reported a file without a size or with an unsafe name: {s.rfilename!r}"
            )
        files.append(ms.expected_file(s.rfilename, s.size, s.blob_id, s.lfs.sha256 if s.lfs else None))
    return files


def status(exc) -> str:
    response = getattr(exc, "response", None)
    return f"HTTP {response.status_code}" if response is not None else type(exc).__name__


def check_present(expected: dict, root: str, manifest) -> tuple[bool, dict | None]:
    """(whether the file in place is right, its record entry). A wrong file stays until the verified download of
    the right one replaces it (put_in_place)."""
    target = os.path.join(root, expected["name"])
    if ms.recorded_unchanged(manifest, expected, root):
        return True, manifest["files"][expected["name"]]
    if not os.path.isfile(target):
        return False, None
    size, sha256, sha1 = ms.file_digests(target)
    if ms.mismatch(expected, size, sha256, sha1) is None:
        return True, record_entry(expected, target)
    return False, None


def record_entry(expected: dict, target: str) -> dict:
    return {k: expected[k] for k in ("size", "sha256", "git_sha1") if k in expected} | {"stat": ms.stat_key(target)}


def client_metadata(root: str, name: str) -> str:
    """Where hf_hub_download keeps its record of a file it put in `root` (huggingface_hub _local_folder.py:
    .cache/huggingface/download/<name>.metadata)."""
    return os.path.join(root, ".cache", "huggingface", "download", name + ".metadata")


def remove_download(root: str, name: str) -> None:
    """A file and the client's metadata for it; the directories the file leaves empty, up to `root`."""
    for path in (os.path.join(root, name), client_metadata(root, name)):
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
    parent = os.path.dirname(os.path.join(root, name))
    while parent != os.path.normpath(root) and parent.startswith(os.path.normpath(root) + os.sep):
        try:
            os.rmdir(parent)
        except OSError:  # not empty
            break
        parent = os.path.dirname(parent)


def download(hf, p, staging: str, expected: dict) -> None:
    """hf_hub_download one file into `staging` (the client resumes a transfer that breaks, within the call), then
    verify it there. A failure names the file where it was meant to go; a file that does not verify is removed."""
    name = expected["name"]
    target = os.path.join(p["path"], name)
    try:
        hf.hf_hub_download(
            p["repo"],
            name,
            revision=p["revision"],
            local_dir=staging,
            token=p["token"] or False,
            endpoint=p["endpoint"],
        )
    except Exception as exc:
        raise WeightsError(
            f"{target}: the download failed: {type(exc).__name__}: {' '.join(str(exc).split())[:300]}"
        ) from exc
    problem = ms.mismatch(expected, *ms.file_digests(os.path.join(staging, name)))
    if problem:
        remove_download(staging, name)
        raise WeightsError(f"{target}: downloaded file does not match the hub's record ({problem}); removed it")
    mark_verified(p, staging, name)


def staging_record(p) -> dict | None:
    """The staging directory's record when it is of this repo and revision: {"repo", "revision", "verified": {name:
    stat key}}; None for a staging of another revision, or none."""
    mark = read_json(os.path.join(p["path"], ms.STAGING, ms.STAGING_RECORD))
    if not isinstance(mark, dict) or (mark.get("repo"), mark.get("revision")) != (p["repo"], p["revision"]):
        return None
    return mark | {"verified": mark.get("verified") if isinstance(mark.get("verified"), dict) else {}}


def write_staging_record(staging: str, mark: dict) -> None:
    """Whole or not at all: a record that cannot be read makes the next run drop the staging (drop_other_staging)."""
    write_json(os.path.join(staging, ms.STAGING_RECORD), mark)


def drop_other_staging(p, check_mode: bool) -> int:
    """A staging directory of another revision goes (in check mode it stays, and would go); the bytes it held."""
    staging = os.path.join(p["path"], ms.STAGING)
    if not os.path.isdir(staging) or staging_record(p) is not None:
        return 0
    held = sum(os.path.getsize(os.path.join(staging, n)) for n in ms.files_under(staging))
    if not check_mode:
        shutil.rmtree(staging, ignore_errors=True)
    return held


def staging_for(p) -> str:
    """The staging directory for this repo and revision: what an earlier run of them verified there stays (a failed
    or killed run resumes), a staging of any other revision goes."""
    staging = os.path.join(p["path"], ms.STAGING)
    drop_other_staging(p, check_mode=False)
    os.makedirs(staging, mode=0o755, exist_ok=True)
    if staging_record(p) is None:
        write_staging_record(staging, {"repo": p["repo"], "revision": p["revision"], "verified": {}})
    return staging


def staged(p, staging: str, expected: dict, check_mode: bool = False) -> bool:
    """Whether this file is in the staging directory, verified: unchanged since a run verified it there (its stat
    key in the staging record), or hashed now and found right (then recorded; in check mode, only said)."""
    path = os.path.join(staging, expected["name"])
    if recorded_staged(p, expected):
        return True
    if not os.path.isfile(path):
        return False
    if ms.mismatch(expected, *ms.file_digests(path)) is not None:
        # the client trusts its own record of a file it put there (written over within a second of it, or with its
        # mtime kept): the file and that record go, so that the download fetches it again
        if not check_mode:
            remove_download(staging, expected["name"])
        return False
    if not check_mode:
        mark_verified(p, staging, expected["name"])
    return True


def recorded_staged(p, expected: dict) -> bool:
    """Whether the staging record says this file was verified there and it has not changed since."""
    key = ms.stat_key(os.path.join(p["path"], ms.STAGING, expected["name"]))
    return key is not None and (staging_record(p) or {"verified": {}})["verified"].get(expected["name"]) == key


def mark_verified(p, staging: str, name: str) -> None:
    mark = staging_record(p) or {"repo": p["repo"], "revision": p["revision"], "verified": {}}
    mark["verified"][name] = ms.stat_key(os.path.join(staging, name))
    write_staging_record(staging, mark)


def download_all(hf, p, missing: list[dict]) -> tuple[str, int]:
    """Every missing file into the staging directory, verified; the model directory is as it was until all are. On a
    failure the files verified so far stay there, and the next run of the same revision downloads only the rest.
    Returns the staging directory and the bytes downloaded."""
    staging = staging_for(p)
    fetched = 0
    for expected in missing:
        if staged(p, staging, expected):
            continue
        try:
            download(hf, p, staging, expected)
        except WeightsError as exc:
            kept = len((staging_record(p) or {"verified": {}})["verified"])
            raise WeightsError(f"{exc}; {kept} verified file(s) kept in {staging} for the next run") from exc
        fetched += expected["size"]
    return staging, fetched


def put_in_place(root: str, staging: str, missing: list[dict], stale: list[str]) -> None:
    """The switch, once the whole revision is verified: the earlier download's files this revision does not list
    go, the new files are renamed into place (one filesystem: no copy, no partial file), the staging goes."""
    for name in stale:
        remove_download(root, name)
    for expected in missing:
        target = os.path.join(root, expected["name"])
        os.makedirs(os.path.dirname(target), exist_ok=True)
        os.replace(os.path.join(staging, expected["name"]), target)
        with contextlib.suppress(FileNotFoundError):  # the client's record of the file this one replaced
            os.unlink(client_metadata(root, expected["name"]))
    shutil.rmtree(staging, ignore_errors=True)


def run(module) -> dict:
    p = module.params
    problems = ms.source_problems({"type": "huggingface", "repo": p["repo"], "revision": p["revision"]})
    if problems:
        raise WeightsError("; ".join(problems))
    root = p["path"]
    manifest = read_json(os.path.join(root, ms.MANIFEST))
    hf = hub_client(required=not module.check_mode)
    result = dict(changed=False, files=[], downloaded_bytes=0, client_version=getattr(hf, "__version__", None))
    if ms.recorded_complete(manifest, p["repo"], p["revision"], root):
        return result | complete(p, manifest, module.check_mode)
    if hf is None:  # check mode before the role has installed the client: the download is pending
        result.update(
            changed=True,
            msg=f"the download of {p['repo']} at {p['revision']} into {root} is pending: "
            f"huggingface_hub is not installed for {sys.executable} yet",
        )
        return result
    files = hub_files(hf, p)
    if p["files"] is not None:
        refuse_unknown(p, [f["name"] for f in files])
    # with `files`, one step of a loop over the missing files: the files in place are not hashed again, their record
    # says which are right (the listing step that made the loop hashed the others once)
    record, missing = sort_present(files, root, manifest, p, quick=p["files"] is not None)
    stale = [n for n in ms.recorded_not_listed(manifest, files) if os.path.lexists(os.path.join(root, n))]
    warn_unlisted(module, root, files, manifest)
    need = check_space(p, missing, module.check_mode)
    if p["files"] is not None:
        return result | stage_some(hf, p, files, missing, module.check_mode)
    # the record is a cache of what was verified, not a change of the weights: changed means files to fetch or remove
    result.update(downloaded_bytes=need, changed=bool(missing or stale))
    if not module.check_mode:
        converge(hf, p, record, missing, stale)
    result["files"] = file_lines(files, missing, stale, manifest, module.check_mode)
    return result


def complete(p, manifest: dict, check_mode: bool) -> dict:
    """The result where the record says the revision is in place and unchanged: every file present (with `files`,
    the named ones, and nothing left to download)."""
    if not check_mode:  # a staging left by a run of another revision
        shutil.rmtree(os.path.join(p["path"], ms.STAGING), ignore_errors=True)
    lines = [{"name": n, "size": e["size"], "action": "present"} for n, e in manifest["files"].items()]
    if p["files"] is None:
        return {"files": lines}
    refuse_unknown(p, [line["name"] for line in lines])
    return {"files": [line for line in lines if line["name"] in p["files"]], "progress": progress(p, [], 0, 0.0)}


def check_space(p, missing: list[dict], check_mode: bool) -> int:
    """The bytes still to download, once they are known to fit (one line naming the path, the need and what is free,
    where they do not). What a failed run of this revision left verified in the staging directory is not fetched
    again; a staging of another revision goes first (in check mode, its space counts as free)."""
    reclaimed = drop_other_staging(p, check_mode)
    need = sum(f["size"] for f in missing) - staging_sizes(p["path"], p, missing)
    where, free = ms.free_bytes(p["path"])
    problem = ms.space_problem(p["path"], need, where, free + (reclaimed if check_mode else 0))
    if problem:
        raise WeightsError(problem)
    return need


def refuse_unknown(p, listed: list[str]) -> None:
    """The `files` option names only files of the revision: one line before anything changes."""
    unknown = sorted(set(p["files"]) - set(listed))
    if unknown:
        raise WeightsError(f"{p['repo']} at {p['revision']} lists no file {', '.join(unknown)} (files)")


def stage_some(hf, p, files: list[dict], missing: list[dict], check_mode: bool) -> dict:
    """The `files` option: only the named files into the staging directory, verified; nothing is put in place.
    Each named file's action: present (in place), already_staged, staged, or would_stage in check mode. The
    result's `progress` is where the whole download stands after this call."""
    todo = [f for f in missing if f["name"] in p["files"]]
    staging = os.path.join(p["path"], ms.STAGING)
    before = {f["name"] for f in todo if staged(p, staging, f, check_mode)}
    started, fetched = time.monotonic(), 0
    if not check_mode and len(before) < len(todo):
        fetched = download_all(hf, p, [f for f in todo if f["name"] not in before])[1]

    def action(f: dict) -> str:
        if f not in todo:
            return "present"
        return "already_staged" if f["name"] in before else "would_stage" if check_mode else "staged"

    lines = [file_line(f, action(f)) for f in files if f["name"] in p["files"]]
    return dict(
        changed=any(line["action"] in ("staged", "would_stage") for line in lines),
        files=lines,
        downloaded_bytes=fetched,
        progress=progress(p, missing, fetched, time.monotonic() - started),
    )


def progress(p, missing: list[dict], fetched: int, seconds: float) -> dict:
    """Where the download of the revision's missing files stands: files and bytes verified in the staging
    directory, of how many; the bytes this call fetched and the seconds it took."""
    done = [f for f in missing if recorded_staged(p, f)]
    return {
        "files": len(missing),
        "files_staged": len(done),
        "bytes": sum(f["size"] for f in missing),
        "bytes_staged": sum(f["size"] for f in done),
        "downloaded_bytes": fetched,
        "seconds": round(seconds, 3),
    }


def staging_sizes(root: str, p, missing: list[dict]) -> int:
    """The bytes of the missing files already in a staging directory of this revision, by their sizes (verified
    before use)."""
    staging = os.path.join(root, ms.STAGING)
    if staging_record(p) is None:
        return 0
    found = [f for f in missing if os.path.isfile(os.path.join(staging, f["name"]))]
    return sum(f["size"] for f in found if os.path.getsize(os.path.join(staging, f["name"])) == f["size"])


def converge(hf, p, record: dict, missing: list[dict], stale: list[str]) -> None:
    """Download what is missing, put it in place, remove what the revision does not list, and record it all."""
    root = p["path"]
    os.makedirs(root, mode=0o755, exist_ok=True)
    put_in_place(root, download_all(hf, p, missing)[0], missing, stale)
    record.update({e["name"]: record_entry(e, os.path.join(root, e["name"])) for e in missing})
    write_manifest(os.path.join(root, ms.MANIFEST), p, record)


def file_lines(files: list[dict], missing: list[dict], stale: list[str], manifest, check_mode: bool) -> list[dict]:
    """The result's `files`: each file of the revision, then each file of an earlier download that went."""
    fetched = {f["name"] for f in missing}
    action = "would_download" if check_mode else "downloaded"
    lines = [file_line(f, action if f["name"] in fetched else "present") for f in files]
    sizes = {n: e.get("size") for n, e in ms.recorded_files(manifest).items() if isinstance(e, dict)}
    gone = "would_remove" if check_mode else "removed"
    return lines + [{"name": n, "size": sizes.get(n), "action": gone} for n in stale]


def warn_unlisted(module, root: str, files: list[dict], manifest) -> None:
    """A warning for each file in the model directory that no download of this module put there and that the
    revision does not list: left in place (it is not this module's to remove), but the loader may read it."""
    listed = {f["name"] for f in files} | set(ms.recorded_files(manifest))
    for name in ms.files_under(root):
        if name not in listed:
            module.warn(
                f"{os.path.join(root, name)} is not a file of {module.params['repo']} at "
                f"{module.params['revision']} and no download put it there: left as it is"
            )


def sort_present(files: list[dict], root: str, manifest, p, quick: bool = False) -> tuple[dict, list[dict]]:
    """({name: record entry} of the files in place and right, [the files to download]). A file verified in the
    staging directory goes in place, whatever is there now (not hashed); `quick` trusts the record alone for the
    files in place (a file in place that the record does not vouch for counts as to download)."""
    record, missing = {}, []
    for expected in files:
        if recorded_staged(p, expected):
            missing.append(expected)
            continue
        if quick:
            ok = ms.recorded_unchanged(manifest, expected, root)
            entry = manifest["files"][expected["name"]] if ok else None
        else:
            ok, entry = check_present(expected, root, manifest)
        if ok:
            record[expected["name"]] = entry
        else:
            missing.append(expected)
    return record, missing


def file_line(expected: dict, action: str) -> dict:
    return {"name": expected["name"], "size": expected["size"], "action": action}


def write_manifest(path: str, p, record: dict) -> None:
    write_json(path, {"repo": p["repo"], "revision": p["revision"], "files": record}, indent=1, sort_keys=True)


def main():
    module = AnsibleModule(
        argument_spec=dict(
            repo=dict(type="str", required=True),
            revision=dict(type="str", required=True),
            path=dict(type="path", required=True),
            token=dict(type="str", no_log=True),
            endpoint=dict(type="str"),
            files=dict(type="list", elements="str"),
        ),
        supports_check_mode=True,
    )
    try:
        result = run(module)
    except WeightsError as exc:
        module.fail_json(msg=" ".join(str(exc).split()))
    except Exception as exc:  # httpx's ConnectError and the like: one line, never the token
        module.fail_json(msg=f"{module.params['repo']}: {type(exc).__name__}: {' '.join(str(exc).split())[:300]}")
    module.exit_json(**result)


if __name__ == "__main__":
    main()
