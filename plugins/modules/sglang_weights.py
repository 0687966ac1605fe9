#!/usr/bin/python
"""Ansible module (container): a Hugging Face repo at a pinned commit in the model directory, every file checked."""

from __future__ import annotations

DOCUMENTATION = r"""
module: sglang_weights
short_description: Download a Hugging Face model repo at a pinned commit with huggingface_hub, and verify each file
description:
  - Runs in the container with the Python of the venv that holds C(huggingface_hub) (SGLang depends on it).
  - Asks the hub for the repo's files at I(revision) (C(HfApi.model_info) with C(files_metadata=True)), checks that
    they fit in the free space at I(path) (one line naming the path, the need and what is free), downloads each
    missing or wrong file with C(hf_hub_download) into I(path), and verifies every file against the size and hash
    the hub reports; an LFS file by its sha256, any other file by its git blob sha1 (the hub reports no sha256 for
    those). A file that does not match is removed, and the module fails naming it.
  - A record of the verified files (C(.provision-weights.json) in I(path)) lets a re-run skip the hub and the
    hashing when every file is as it was verified (same size, mtime and inode); it then reports no change.
  - The token reaches the client as a module parameter only; it is never on a command line, in the result or in
    the record.
  - In check mode, reports which files would be downloaded, and downloads nothing.
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
"""

RETURN = r"""
files:
  description: One entry per file of the repo, with what the run did to it (present, downloaded, would_download).
  type: list
  elements: dict
  returned: always
downloaded_bytes:
  description: Bytes downloaded (or that would be, in check mode).
  type: int
  returned: always
client_version:
  description: The huggingface_hub version that ran.
  type: str
  returned: always
"""

import contextlib
import json
import os

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.provision.pve_sglang.plugins.module_utils import model_source as ms
from ansible_collections.provision.pve_sglang.plugins.module_utils.json_record import read_json


class WeightsError(Exception):
    pass


def hub_client():
    """huggingface_hub, or one line saying which Python lacks it."""
    try:
        import huggingface_hub

        return huggingface_hub
    except ImportError as exc:
        import sys

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
        raise WeightsError(f"{where}: the repo is gated and the hub refused the token ({status(exc)}): "
                           "set sglang_hf_token to a token with access") from exc  # fmt: skip
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
    """(whether the file in place is right, its record entry). A wrong file is removed, with the client's
    download metadata, so that hf_hub_download fetches it again instead of trusting its own record."""
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


def remove_download(root: str, name: str) -> None:
    """A file and the client's metadata for it (huggingface_hub _local_folder.py: .cache/huggingface/download)."""
    for path in (os.path.join(root, name), os.path.join(root, ".cache", "huggingface", "download", name + ".metadata")):
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)


def download(hf, p, expected: dict) -> dict:
    """hf_hub_download one file (the client resumes a transfer that breaks, within the call), then verify it."""
    root, name = p["path"], expected["name"]
    remove_download(root, name)
    try:
        hf.hf_hub_download(p["repo"], name, revision=p["revision"], local_dir=root, token=p["token"] or False,
                           endpoint=p["endpoint"])  # fmt: skip
    except Exception as exc:
        remove_download(root, name)
        raise WeightsError(f"{os.path.join(root, name)}: the download failed: {type(exc).__name__}: "
                           f"{' '.join(str(exc).split())[:300]}") from exc  # fmt: skip
    target = os.path.join(root, name)
    problem = ms.mismatch(expected, *ms.file_digests(target))
    if problem:
        remove_download(root, name)
        raise WeightsError(f"{target}: downloaded file does not match the hub's record ({problem}); removed it")
    return record_entry(expected, target)


def run(module) -> dict:
    p = module.params
    problems = ms.source_problems({"type": "huggingface", "repo": p["repo"], "revision": p["revision"]})
    if problems:
        raise WeightsError("; ".join(problems))
    root = p["path"]
    manifest = read_json(os.path.join(root, ms.MANIFEST))
    hf = hub_client()
    result = dict(changed=False, files=[], downloaded_bytes=0, client_version=hf.__version__)
    if ms.recorded_complete(manifest, p["repo"], p["revision"], root):
        result["files"] = [{"name": n, "size": e["size"], "action": "present"} for n, e in manifest["files"].items()]
        return result
    files = hub_files(hf, p)
    record, missing = sort_present(files, root, manifest)
    need = sum(f["size"] for f in missing)
    problem = ms.space_problem(root, need, *ms.free_bytes(root))
    if problem:
        raise WeightsError(problem)
    # the record is a cache of what was verified, not a change of the weights: changed means files to fetch
    result.update(downloaded_bytes=need, changed=bool(missing))
    if not module.check_mode:
        os.makedirs(root, mode=0o755, exist_ok=True)
        for expected in missing:
            record[expected["name"]] = download(hf, p, expected)
        write_manifest(os.path.join(root, ms.MANIFEST), p, record)
    action = "would_download" if module.check_mode else "downloaded"
    names = {f["name"] for f in missing}
    result["files"] = [file_line(f, action if f["name"] in names else "present") for f in files]
    return result


def sort_present(files: list[dict], root: str, manifest) -> tuple[dict, list[dict]]:
    """({name: record entry} of the files in place and right, [the files to download])."""
    record, missing = {}, []
    for expected in files:
        ok, entry = check_present(expected, root, manifest)
        if ok:
            record[expected["name"]] = entry
        else:
            missing.append(expected)
    return record, missing


def file_line(expected: dict, action: str) -> dict:
    return {"name": expected["name"], "size": expected["size"], "action": action}


def write_manifest(path: str, p, record: dict) -> None:
    tmp = path + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump({"repo": p["repo"], "revision": p["revision"], "files": record}, f, indent=1, sort_keys=True)
        f.write("\n")
    os.replace(tmp, path)


def main():
    module = AnsibleModule(
        argument_spec=dict(
            repo=dict(type="str", required=True),
            revision=dict(type="str", required=True),
            path=dict(type="path", required=True),
            token=dict(type="str", no_log=True),
            endpoint=dict(type="str"),
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
