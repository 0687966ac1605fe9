"""sglang_weights and module_utils/model_source.py: a pinned Hugging Face repo downloaded with the real
huggingface_hub client from the lab's hub (provision/lab/hfhub.py) on 127.0.0.1, each file verified.

The module runs as Ansible starts it (tests/unit/collection.py main_result); what the tests look at is the model
directory on disk, the hub's request log and the module's result."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess

import pytest

from provision.lab import hfhub
from tests.unit.collection import main_result, module
from tests.unit.conftest import HF_TOKEN

weights = module("sglang_weights")
ms = __import__("ansible_collections.provision.pve_sglang.plugins.module_utils.model_source", fromlist=["x"])

TOKEN = HF_TOKEN


def args(hub, path, **kw):
    repo = hub.repos[hfhub.REPO_ID]
    return {"repo": repo.repo_id, "revision": repo.commit, "path": str(path), "token": TOKEN, "endpoint": hub.url} | kw


def files_in(path):
    return {p.name for p in path.iterdir() if p.is_file()} - {ms.MANIFEST}


# ---------------------------------------------------------------- pure rules


@pytest.mark.parametrize(
    ("source", "problem"),
    [
        ({}, None),
        ({"type": "node_dir", "path": "/srv/models/x"}, None),
        ({"type": "huggingface", "repo": "Qwen/Qwen3-8B", "revision": "a" * 40}, None),
        ({"type": "huggingface", "repo": "Qwen/Qwen3-8B", "revision": "main"}, "revision must be a commit"),
        ({"type": "huggingface", "repo": "Qwen/Qwen3-8B", "revision": "A" * 40}, "revision must be a commit"),
        ({"type": "huggingface", "repo": "../etc", "revision": "a" * 40}, "repo must be"),
        ({"type": "node_dir", "path": "relative/dir"}, "path must be an absolute"),
        ({"type": "node_dir", "path": "/srv/a,ro=0"}, "path must be an absolute"),
        ({"type": "s3", "path": "/x"}, "type must be"),
        ({"type": "node_dir", "path": "/x", "revision": "a" * 40}, "unknown key 'revision'"),
        ("Qwen/Qwen3-8B", "must be a mapping"),
    ],
)
def test_source_problems(source, problem):
    found = ms.source_problems(source)
    assert (found == []) if problem is None else any(problem in p for p in found), found


def test_the_git_blob_sha1_is_gits_own(tmp_path):
    path = tmp_path / "f"
    path.write_bytes(b"hello\x00world\n" * 1000)
    git = subprocess.run(["git", "hash-object", str(path)], capture_output=True, text=True, check=True).stdout.strip()
    size, sha256, sha1 = ms.file_digests(path)
    assert sha1 == git and sha256 == hashlib.sha256(path.read_bytes()).hexdigest() and size == 12000


def test_mismatch_names_what_differs():
    want = ms.expected_file("a", 3, "b" * 40, "c" * 64)
    assert "size 4" in ms.mismatch(want, 4, "c" * 64, "x")
    assert "sha256" in ms.mismatch(want, 3, "d" * 64, "x")
    assert ms.mismatch(want, 3, "c" * 64, "anything: LFS files are checked by sha256") is None
    plain = ms.expected_file("a", 3, "b" * 40)
    assert "git blob sha1" in ms.mismatch(plain, 3, "c" * 64, "e" * 40)


def test_space_problem_is_one_line_with_path_need_and_free():
    line = ms.space_problem("/models/x", 3 * 2**30, "/models", 2**30)
    assert line.startswith("/models/x: ") and "3.0 GiB" in line and "1.0 GiB" in line and "\n" not in line
    assert ms.space_problem("/models/x", 10, "/models", 10) is None


# ---------------------------------------------------------------- the module against the hub


def test_downloads_every_file_verified_and_records_it(hub, tmp_path):
    target = tmp_path / "models" / "tiny"
    result = main_result(weights, args(hub, target))
    assert result["changed"] is True, result
    repo = hub.repos[hfhub.REPO_ID]
    for f in repo.files:
        assert hashlib.sha256((target / f.path).read_bytes()).hexdigest() == f.sha256
    assert {f["name"]: f["action"] for f in result["files"]} == {f.path: "downloaded" for f in repo.files}
    assert result["downloaded_bytes"] == sum(len(f.data) for f in repo.files)
    assert TOKEN not in json.dumps(result) and TOKEN not in (target / ms.MANIFEST).read_text()


def test_a_second_run_downloads_nothing_and_asks_the_hub_nothing(hub, tmp_path):
    main_result(weights, args(hub, tmp_path))
    hub.requests.clear()
    again = main_result(weights, args(hub, tmp_path))
    assert again["changed"] is False and {f["action"] for f in again["files"]} == {"present"}
    assert hub.requests == []


def test_check_mode_says_what_it_would_download_and_writes_nothing(hub, tmp_path):
    target = tmp_path / "tiny"
    result = main_result(weights, args(hub, target, _ansible_check_mode=True))
    assert result["changed"] is True and {f["action"] for f in result["files"]} == {"would_download"}
    assert not target.exists()
    assert not [r for r in hub.requests if "/resolve/" in r["path"]]


def test_a_corrupted_file_is_refused_by_name_and_removed(hub, tmp_path):
    hub.corrupt(hfhub.REPO_ID, "model.safetensors")
    result = main_result(weights, args(hub, tmp_path))
    assert result.get("failed") and "model.safetensors" in result["msg"] and "sha256" in result["msg"], result
    assert "\n" not in result["msg"]
    assert not (tmp_path / "model.safetensors").exists()
    assert not (tmp_path / ms.MANIFEST).exists()
    hub.corrupt(hfhub.REPO_ID, "model.safetensors", on=False)
    fixed = main_result(weights, args(hub, tmp_path))
    assert fixed["changed"] is True and (tmp_path / "model.safetensors").exists()


def test_a_file_changed_in_place_is_found_and_fetched_again(hub, tmp_path):
    main_result(weights, args(hub, tmp_path))
    (tmp_path / "config.json").write_text("{}\n")
    result = main_result(weights, args(hub, tmp_path))
    assert result["changed"] is True
    assert {f["name"] for f in result["files"] if f["action"] == "downloaded"} == {"config.json"}
    assert (tmp_path / "config.json").read_bytes() == hub.repos[hfhub.REPO_ID].file("config.json").data


def test_files_in_place_without_a_record_are_verified_not_fetched(hub, tmp_path):
    main_result(weights, args(hub, tmp_path))
    (tmp_path / ms.MANIFEST).unlink()
    os.utime(tmp_path / "model.safetensors")
    hub.requests.clear()
    result = main_result(weights, args(hub, tmp_path))
    assert result["changed"] is False and not [r for r in hub.requests if "/resolve/" in r["path"]]


def test_without_a_token_the_gated_repo_fails_in_one_line(hub, tmp_path):
    result = main_result(weights, args(hub, tmp_path, token=None))
    assert result.get("failed") and "gated" in result["msg"] and "sglang_hf_token" in result["msg"], result
    assert files_in(tmp_path) == set()


def test_a_branch_name_is_refused_before_the_hub_is_asked(hub, tmp_path):
    result = main_result(weights, args(hub, tmp_path, revision="main"))
    assert result.get("failed") and "revision must be a commit" in result["msg"]
    assert hub.requests == []


def test_an_unknown_commit_fails_naming_it(hub, tmp_path):
    result = main_result(weights, args(hub, tmp_path, revision="1" * 40))
    assert result.get("failed") and "no such revision" in result["msg"] and "1" * 40 in result["msg"]


def test_too_little_space_fails_before_downloading(hub, tmp_path, monkeypatch):
    real = os.statvfs

    class Full:
        def __init__(self, st):
            self.f_frsize, self.f_bavail = st.f_frsize, 10

    monkeypatch.setattr(os, "statvfs", lambda p: Full(real(p)))
    result = main_result(weights, args(hub, tmp_path / "tiny"))
    assert result.get("failed") and result["msg"].startswith(f"{tmp_path / 'tiny'}: the download needs "), result
    assert "free" in result["msg"] and not [r for r in hub.requests if "/resolve/" in r["path"]]
