"""sglang_weights and module_utils/model_source.py: a pinned Hugging Face repo downloaded with the real
huggingface_hub client from the lab's hub (provision/lab/hfhub.py) on 127.0.0.1, each file verified.

The module runs as Ansible starts it (tests/unit/collection.py main_result); what the tests look at is the model
directory on disk, the hub's request log and the module's result."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys

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


# ---------------------------------------------------------------- a change of revision


def revisions(hub):
    """Revision A, as served now plus a sharded-checkpoint index and a file in a subdirectory, and B, a later commit
    with another config and other weights and neither of A's extra files. The hub serves A until `to_b()`."""
    a = hub.repos[hfhub.REPO_ID]
    index = hfhub.HubFile("model.safetensors.index.json", b'{"weight_map": {"weight": "model-00001.safetensors"}}\n')
    a = hfhub.HubRepo(a.repo_id, [*a.files, index, hfhub.HubFile("extra/notes.txt", b"revision a\n")])
    b = hfhub.HubRepo(
        a.repo_id,
        [
            hfhub.HubFile(
                "config.json", a.file("config.json").data.replace(b'"hidden_size": 64', b'"hidden_size": 32')
            ),
            a.file("tokenizer.json"),
            hfhub.HubFile("model.safetensors", hfhub.safetensors_blob(60_000), lfs=True),
        ],
    )
    assert a.commit != b.commit
    hub.repos[hfhub.REPO_ID] = a
    return a, b


def tree(path) -> dict:
    """Every file under path, relative, with its sha256 (the record, the staging and the client's records aside)."""
    aside = {".cache", ms.STAGING}
    return {
        str(p.relative_to(path)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(path.rglob("*"))
        if p.is_file() and p.name != ms.MANIFEST and not aside & set(p.relative_to(path).parts)
    }


def as_served(repo) -> dict:
    return {f.path: f.sha256 for f in repo.files}


def test_a_new_revision_replaces_the_old_ones_files_and_removes_those_it_does_not_list(hub, tmp_path):
    a, b = revisions(hub)
    assert main_result(weights, args(hub, tmp_path))["changed"] is True
    assert tree(tmp_path) == as_served(a)
    hub.repos[hfhub.REPO_ID] = b
    result = main_result(weights, args(hub, tmp_path, revision=b.commit))
    assert not result.get("failed"), result
    assert tree(tmp_path) == as_served(b), "the files of revision B, and nothing of A's that B does not list"
    assert not (tmp_path / "extra").exists() and not (tmp_path / ms.STAGING).exists()
    assert {f["name"]: f["action"] for f in result["files"]} == {
        "config.json": "downloaded",
        "tokenizer.json": "present",
        "model.safetensors": "downloaded",
        "extra/notes.txt": "removed",
        "model.safetensors.index.json": "removed",
    }
    assert json.loads((tmp_path / ms.MANIFEST).read_text())["revision"] == b.commit
    again = main_result(weights, args(hub, tmp_path, revision=b.commit))
    assert again["changed"] is False, again


def test_check_mode_of_a_new_revision_names_what_would_go_and_changes_nothing(hub, tmp_path):
    a, b = revisions(hub)
    main_result(weights, args(hub, tmp_path))
    hub.repos[hfhub.REPO_ID] = b
    result = main_result(weights, args(hub, tmp_path, revision=b.commit, _ansible_check_mode=True))
    assert result["changed"] is True
    assert {f["name"] for f in result["files"] if f["action"] == "would_remove"} == {
        "extra/notes.txt",
        "model.safetensors.index.json",
    }
    assert tree(tmp_path) == as_served(a) and not (tmp_path / ms.STAGING).exists()


def test_a_failed_download_of_a_new_revision_leaves_the_old_one_whole(hub, tmp_path):
    a, b = revisions(hub)
    main_result(weights, args(hub, tmp_path))
    hub.repos[hfhub.REPO_ID] = b
    hub.corrupt(hfhub.REPO_ID, "model.safetensors")
    result = main_result(weights, args(hub, tmp_path, revision=b.commit))
    assert result.get("failed") and f"{tmp_path / 'model.safetensors'}: " in result["msg"], result
    assert "sha256" in result["msg"] and "\n" not in result["msg"]
    # config.json of B was downloaded and verified before the failure: none of it reached the model directory, and
    # it waits in the staging directory for the next run of B
    assert tree(tmp_path) == as_served(a) and (tmp_path / ms.STAGING / "config.json").is_file()
    assert json.loads((tmp_path / ms.MANIFEST).read_text())["revision"] == a.commit
    hub.repos[hfhub.REPO_ID] = a
    hub.requests.clear()
    back = main_result(weights, args(hub, tmp_path))
    assert back["changed"] is False and hub.requests == [], "A is still recorded complete: the hub is not asked"
    assert not (tmp_path / ms.STAGING).exists(), "B's staging outlived a run of another revision"


def test_a_failed_download_keeps_what_it_verified_and_the_next_run_fetches_only_the_rest(hub, tmp_path):
    """A hub error on the last file (on the scenario's 244 GB checkpoint, shard 50 of 50): the files verified before it
    stay in the staging directory, the message says so, and the next run downloads only the file that failed."""
    repo = hub.repos[hfhub.REPO_ID]
    names = [f.path for f in repo.files]
    hub.corrupt(hfhub.REPO_ID, names[-1])
    failed = main_result(weights, args(hub, tmp_path))
    staging = tmp_path / ms.STAGING
    assert failed.get("failed") and failed["msg"].endswith(
        f"; {len(names) - 1} verified file(s) kept in {staging} for the next run"
    ), failed
    assert tree(tmp_path) == {} and sorted(p.name for p in staging.iterdir() if p.is_file()) == sorted(
        [ms.STAGING_RECORD, *names[:-1]]
    )
    hub.corrupt(hfhub.REPO_ID, names[-1], on=False)
    hub.requests.clear()
    done = main_result(weights, args(hub, tmp_path))
    assert done["changed"] is True and tree(tmp_path) == as_served(repo) and not staging.exists()
    fetched = [r["path"] for r in hub.requests if "/resolve/" in r["path"] and r["method"] == "GET"]
    assert len(fetched) == 1 and fetched[0].endswith("/" + names[-1]), fetched
    assert done["downloaded_bytes"] == len(repo.file(names[-1]).data), "the space check counted the staged files"


def test_a_transfer_cut_in_file_k_of_n_keeps_the_files_before_it_and_the_next_run_fetches_k_to_n(hub, tmp_path):
    """The hub cuts every transfer of one file halfway (the client's own resumes included): the run fails naming it,
    keeps the files verified before it, and the next run asks the hub for that file and the ones after it only."""
    repo = hub.repos[hfhub.REPO_ID]
    names = [f.path for f in repo.files]
    k = 1  # the second of three: a file before it and one after
    hub.cut(hfhub.REPO_ID, names[k])
    failed = main_result(weights, args(hub, tmp_path))
    staging = tmp_path / ms.STAGING
    assert failed.get("failed") and names[k] in failed["msg"], failed
    assert failed["msg"].endswith(f"; {k} verified file(s) kept in {staging} for the next run"), failed
    assert sorted(p.name for p in staging.iterdir() if p.is_file()) == sorted([ms.STAGING_RECORD, *names[:k]])
    hub.cut(hfhub.REPO_ID, names[k], on=False)
    hub.requests.clear()
    done = main_result(weights, args(hub, tmp_path))
    assert done["changed"] is True and tree(tmp_path) == as_served(repo) and not staging.exists()
    fetched = [r["path"].rsplit("/", 1)[-1] for r in hub.requests if "/resolve/" in r["path"] and r["method"] == "GET"]
    assert fetched == names[k:], hub.requests


def resolved(hub) -> list[str]:
    """The files the hub was asked for (their downloads), in order."""
    return [r["path"].rsplit("/", 1)[-1] for r in hub.requests if "/resolve/" in r["path"] and r["method"] == "GET"]


def test_files_stages_only_the_named_ones_and_says_where_the_whole_download_stands(hub, tmp_path):
    """One call per file, as the role makes them: each stages its file verified and leaves the model directory as it
    was; `progress` counts files and bytes over the whole revision; the run without `files` then fetches nothing more
    and puts the revision in place."""
    repo = hub.repos[hfhub.REPO_ID]
    sizes = {f.path: len(f.data) for f in repo.files}
    names = list(sizes)
    for k, name in enumerate(names, start=1):
        hub.requests.clear()
        step = main_result(weights, args(hub, tmp_path, files=[name]))
        assert step["changed"] is True and resolved(hub) == [name] and tree(tmp_path) == {}, step
        assert step["files"] == [{"name": name, "size": sizes[name], "action": "staged"}]
        seconds = step["progress"].pop("seconds")
        assert seconds >= 0 and step["progress"] == {
            "files": len(names),
            "files_staged": k,
            "bytes": sum(sizes.values()),
            "bytes_staged": sum(sizes[n] for n in names[:k]),
            "downloaded_bytes": sizes[name],
        }
    hub.requests.clear()
    done = main_result(weights, args(hub, tmp_path))
    assert done["changed"] is True and resolved(hub) == [] and done["downloaded_bytes"] == 0, done
    assert tree(tmp_path) == as_served(repo) and not (tmp_path / ms.STAGING).exists()


def test_a_staged_file_is_hashed_once_and_one_changed_since_is_fetched_again(hub, tmp_path, monkeypatch):
    """The staging record keeps each verified file's stat: a second call trusts an unchanged file without reading it,
    and a file written over since (same size, new contents) is hashed, found wrong and fetched again."""
    repo = hub.repos[hfhub.REPO_ID]
    first = repo.files[0].path
    assert main_result(weights, args(hub, tmp_path, files=[first]))["changed"] is True
    hashed = []
    digests = ms.file_digests
    monkeypatch.setattr(ms, "file_digests", lambda path: hashed.append(os.path.basename(path)) or digests(path))
    again = main_result(weights, args(hub, tmp_path, files=[first]))
    assert again["changed"] is False and hashed == [] and again["progress"]["files_staged"] == 1, (again, hashed)
    staged_file = tmp_path / ms.STAGING / first
    staged_file.write_bytes(b"x" * staged_file.stat().st_size)
    hub.requests.clear()
    done = main_result(weights, args(hub, tmp_path))
    assert not done.get("failed") and first in resolved(hub) and tree(tmp_path) == as_served(repo), done


def test_files_naming_a_file_the_revision_does_not_list_fails_in_one_line(hub, tmp_path):
    result = main_result(weights, args(hub, tmp_path, files=["nope.bin"]))
    assert result.get("failed") and result["msg"].endswith("lists no file nope.bin (files)"), result
    assert not (tmp_path / ms.STAGING).exists()


def test_a_file_no_download_put_there_is_left_with_a_warning(hub, tmp_path, capsys):
    (tmp_path / "NOTES.local").write_text("mine\n")
    result = main_result(weights, args(hub, tmp_path))
    assert not result.get("failed") and (tmp_path / "NOTES.local").read_text() == "mine\n", result
    assert f"{tmp_path / 'NOTES.local'} is not a file of {hfhub.REPO_ID} at " in capsys.readouterr().err


def test_a_record_naming_a_file_outside_the_directory_removes_nothing_there(hub, tmp_path):
    outside = tmp_path / "outside.txt"
    outside.write_text("not the model's\n")
    model = tmp_path / "model"
    model.mkdir()
    (model / ms.MANIFEST).write_text(
        json.dumps({"repo": "x/y", "revision": "0" * 40, "files": {"../outside.txt": {"size": 16}}})
    )
    result = main_result(weights, args(hub, model))
    assert not result.get("failed") and outside.exists(), result


# ---------------------------------------------------------------- check mode before the client is installed


def test_check_mode_without_the_client_reports_the_download_pending(hub, tmp_path, monkeypatch):
    """A fresh container in `provision plan`: the venv that gets huggingface_hub does not exist yet, so the module
    runs under a Python without it (roles/sglang tasks/weights.yml)."""
    monkeypatch.setitem(sys.modules, "huggingface_hub", None)  # `import huggingface_hub` raises ImportError
    target = tmp_path / "tiny"
    result = main_result(weights, args(hub, target, _ansible_check_mode=True))
    assert not result.get("failed"), result
    assert result["changed"] is True and result["client_version"] is None and result["files"] == []
    assert result["msg"].startswith(f"the download of {hfhub.REPO_ID} at ") and "pending" in result["msg"]
    assert not target.exists() and hub.requests == []
    applied = main_result(weights, args(hub, target))
    assert applied.get("failed") and applied["msg"].startswith("huggingface_hub is not installed for "), applied


def test_check_mode_without_the_client_finds_a_recorded_complete_download_up_to_date(hub, tmp_path, monkeypatch):
    main_result(weights, args(hub, tmp_path))
    monkeypatch.setitem(sys.modules, "huggingface_hub", None)
    result = main_result(weights, args(hub, tmp_path, _ansible_check_mode=True))
    assert result["changed"] is False and {f["action"] for f in result["files"]} == {"present"}, result


def test_a_loop_hashes_each_wrong_file_in_place_once_and_a_failed_step_counts_what_is_kept(hub, tmp_path, monkeypatch):
    """The role's order over a model directory whose files are all wrong (a new revision of the same names): the
    listing (check mode) hashes each file in place once; the steps and the final run hash none of them again, only
    what they download. A step whose transfer is cut names how many verified files the staging keeps."""
    repo = hub.repos[hfhub.REPO_ID]
    names = [f.path for f in repo.files]
    for name in names:
        (tmp_path / name).write_bytes(b"an earlier revision's bytes")
    hashed = []
    digests = ms.file_digests
    monkeypatch.setattr(ms, "file_digests", lambda path: hashed.append(path) or digests(path))
    plan = main_result(weights, args(hub, tmp_path, _ansible_check_mode=True))
    assert [f["action"] for f in plan["files"]] == ["would_download"] * len(names), plan
    hub.cut(hfhub.REPO_ID, names[-1])
    for name in names[:-1]:
        assert main_result(weights, args(hub, tmp_path, files=[name]))["changed"] is True
    cut = main_result(weights, args(hub, tmp_path, files=[names[-1]]))
    assert cut.get("failed") and cut["msg"].endswith(
        f"; {len(names) - 1} verified file(s) kept in {tmp_path / ms.STAGING} for the next run"
    ), cut
    hub.cut(hfhub.REPO_ID, names[-1], on=False)
    assert main_result(weights, args(hub, tmp_path, files=[names[-1]]))["changed"] is True
    done = main_result(weights, args(hub, tmp_path))
    assert not done.get("failed") and tree(tmp_path) == as_served(repo), done
    in_place = sorted(os.path.basename(p) for p in hashed if os.path.dirname(p) == str(tmp_path))
    assert in_place == sorted(names), "each file in place hashed once, by the listing"


def test_a_step_says_already_staged_changes_nothing_and_check_mode_says_would_stage(hub, tmp_path):
    repo = hub.repos[hfhub.REPO_ID]
    first, second = repo.files[0].path, repo.files[1].path
    assert main_result(weights, args(hub, tmp_path, files=[first]))["changed"] is True
    again = main_result(weights, args(hub, tmp_path, files=[first]))
    assert again["changed"] is False and again["files"][0]["action"] == "already_staged", again
    would = main_result(weights, args(hub, tmp_path, files=[second], _ansible_check_mode=True))
    assert would["changed"] is True and would["files"][0]["action"] == "would_stage", would
    assert not (tmp_path / ms.STAGING / second).exists()
    assert main_result(weights, args(hub, tmp_path))["changed"] is True
    complete = main_result(weights, args(hub, tmp_path, files=[second]))
    assert complete["changed"] is False and [f["action"] for f in complete["files"]] == ["present"], complete
    assert complete["progress"]["files"] == 0 and complete["progress"]["bytes"] == 0, complete
