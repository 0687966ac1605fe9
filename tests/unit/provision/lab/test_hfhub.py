"""The lab's hub (provision/lab/hfhub.py) against the real huggingface_hub client (1.33.0, the version the lab's
wheelhouse resolves for SGLang 0.5.23), on 127.0.0.1: each route the client calls answers as the client reads it,
and each refusal is the one the client turns into its own error."""

from __future__ import annotations

import errno
import hashlib
import io
import ipaddress
import os
import socket
import stat
import subprocess
import time
from pathlib import Path

import huggingface_hub as hf  # the test extras pin the version the lab serves (pyproject.toml)
import pytest
from huggingface_hub import errors

from provision.lab import hfhub
from tests.unit.conftest import HF_TOKEN

TOKEN = HF_TOKEN


def api(hub, token=TOKEN):
    return hf.HfApi(endpoint=hub.url, token=token)


def test_model_info_with_files_metadata_reports_sizes_blob_ids_and_lfs_sha256(hub):
    repo = hub.repos[hfhub.REPO_ID]
    info = api(hub).model_info(hfhub.REPO_ID, revision=repo.commit, files_metadata=True)
    assert info.sha == repo.commit and info.gated == "manual"
    by_name = {s.rfilename: s for s in info.siblings}
    assert set(by_name) == {"config.json", "tokenizer.json", "model.safetensors"}
    weights = repo.file("model.safetensors")
    assert by_name["model.safetensors"].lfs.sha256 == hashlib.sha256(weights.data).hexdigest()
    assert by_name["model.safetensors"].size == len(weights.data) > 200_000
    assert by_name["config.json"].lfs is None and by_name["config.json"].blob_id == repo.file("config.json").blob_id


def test_the_tree_route_lists_the_same_files(hub):
    repo = hub.repos[hfhub.REPO_ID]
    tree = list(api(hub).list_repo_tree(hfhub.REPO_ID, revision=repo.commit, recursive=True))
    assert {f.path: (f.size, f.lfs.sha256 if f.lfs else None) for f in tree} == {
        f.path: (len(f.data), f.sha256 if f.lfs else None) for f in repo.files
    }


def test_snapshot_download_gets_every_file_byte_for_byte(hub, tmp_path):
    repo = hub.repos[hfhub.REPO_ID]
    hf.snapshot_download(hfhub.REPO_ID, revision=repo.commit, local_dir=tmp_path, token=TOKEN, endpoint=hub.url)
    for f in repo.files:
        assert (tmp_path / f.path).read_bytes() == f.data
    assert {r["method"] for r in hub.requests} == {"GET", "HEAD"}


def test_a_branch_resolves_to_the_commit_and_the_header_says_which(hub):
    repo = hub.repos[hfhub.REPO_ID]
    url = hf.hf_hub_url(hfhub.REPO_ID, "config.json", revision="main", endpoint=hub.url)
    meta = hf.get_hf_file_metadata(url, token=TOKEN)
    assert meta.commit_hash == repo.commit and meta.etag == repo.file("config.json").blob_id
    weights = hf.get_hf_file_metadata(hf.hf_hub_url(hfhub.REPO_ID, "model.safetensors", endpoint=hub.url), token=TOKEN)
    assert weights.etag == repo.file("model.safetensors").sha256
    assert weights.size == len(repo.file("model.safetensors").data)


def test_the_gated_repo_refuses_a_client_without_a_token(hub, tmp_path):
    repo = hub.repos[hfhub.REPO_ID]
    with pytest.raises(errors.GatedRepoError):
        api(hub, token=False).model_info(hfhub.REPO_ID, revision=repo.commit)
    with pytest.raises(errors.GatedRepoError):
        hf.hf_hub_download(
            hfhub.REPO_ID, "config.json", revision=repo.commit, local_dir=tmp_path, token=False, endpoint=hub.url
        )
    assert not (tmp_path / "config.json").exists()


def test_a_wrong_token_is_refused(hub):
    with pytest.raises(errors.HfHubHTTPError) as refused:
        api(hub, token="hf_notthetoken").model_info(hfhub.REPO_ID)
    assert refused.value.response.status_code == 401


def test_an_unknown_revision_is_404_revision_not_found(hub):
    with pytest.raises(errors.RevisionNotFoundError):
        api(hub).model_info(hfhub.REPO_ID, revision="0" * 40)


def test_an_unknown_file_is_entry_not_found(hub, tmp_path):
    repo = hub.repos[hfhub.REPO_ID]
    with pytest.raises(errors.EntryNotFoundError):
        hf.hf_hub_download(
            hfhub.REPO_ID, "nope.bin", revision=repo.commit, local_dir=tmp_path, token=TOKEN, endpoint=hub.url
        )


def test_an_unknown_repo_is_refused_as_not_found(hub):
    with pytest.raises(errors.RepositoryNotFoundError):
        api(hub).model_info("provision-lab/other")


def test_a_transfer_resumes_with_a_range_request(hub):
    """http_get's resume (file_download.py l.376-378): Range from what it has, 206, the rest appended."""
    repo = hub.repos[hfhub.REPO_ID]
    data = repo.file("model.safetensors").data
    url = hf.hf_hub_url(hfhub.REPO_ID, "model.safetensors", revision=repo.commit, endpoint=hub.url)
    part = io.BytesIO(data[:1000])
    part.seek(1000)
    from huggingface_hub.file_download import http_get

    http_get(url, part, resume_size=1000, headers={"authorization": f"Bearer {TOKEN}"}, expected_size=len(data))
    assert part.getvalue() == data


def test_a_corrupted_file_has_its_size_and_the_true_sha256_in_the_headers_but_other_bytes(hub, tmp_path):
    repo = hub.repos[hfhub.REPO_ID]
    hub.corrupt(hfhub.REPO_ID, "model.safetensors")
    got = hf.hf_hub_download(
        hfhub.REPO_ID, "model.safetensors", revision=repo.commit, local_dir=tmp_path, token=TOKEN, endpoint=hub.url
    )
    data = Path(got).read_bytes()
    expected = repo.file("model.safetensors")
    assert len(data) == len(expected.data) and hashlib.sha256(data).hexdigest() != expected.sha256


UNASSIGNED = "10.213.250.1"  # no interface here has it: a lab link (10.213.<n>.1) before its veth exists


def test_the_hub_binds_an_address_no_interface_has_yet_only_with_freebind():
    """IP_FREEBIND (ip(7)): the hub of a bare lab listens on a link the apply's CT brings up later."""
    assert UNASSIGNED not in subprocess.run(["ip", "-o", "addr"], capture_output=True, text=True).stdout
    with pytest.raises(OSError) as refused:
        hfhub.Hub([hfhub.tiny_repo()], {TOKEN}).start(UNASSIGNED, 0)
    assert refused.value.errno == errno.EADDRNOTAVAIL
    hub = hfhub.Hub([hfhub.tiny_repo()], {TOKEN}).start(UNASSIGNED, 0, freebind=True)
    try:
        assert hub.url.startswith(f"http://{UNASSIGNED}:") and _listening(os.getpid(), UNASSIGNED, hub.url)
    finally:
        hub.stop()


def _listening(pid: int, address: str, url: str) -> bool:
    """Whether process `pid` has a TCP socket listening on address and url's port (/proc/<pid>/net/tcp, state 0A)."""
    port = int(url.rsplit(":", 1)[1])
    local = f"{socket.htonl(int(ipaddress.IPv4Address(address))):08X}:{port:04X}"
    rows = [line.split() for line in Path(f"/proc/{pid}/net/tcp").read_text().splitlines()[1:]]
    return any(row[1] == local and row[3] == "0A" for row in rows)


def test_the_lab_starts_its_hub_on_its_first_link_before_the_link_exists_and_stops_it(tmp_path):
    """What `provision lab up --bare` starts (and `lab down` stops): the hub on the host side of the link its
    sglang-01 will get, the token in a 0600 file of the lab and never on the hub's command line."""
    from provision.lab.lab import Lab

    lab = Lab(dir=tmp_path, net_index=250)
    try:
        hub = lab.start_hf_hub()
        pid = int((tmp_path / "hfhub.pid").read_text())
        assert hub["url"].startswith(f"http://{UNASSIGNED}:") and _listening(pid, UNASSIGNED, hub["url"])
        assert (hub["repo"], hub["commit"]) == (hfhub.REPO_ID, hfhub.tiny_repo().commit)
        assert stat.S_IMODE(lab.hf_token_file.stat().st_mode) == 0o600
        assert lab.hf_token_file.read_text().strip() == hub["token"]
        assert hub["token"] not in Path(f"/proc/{pid}/cmdline").read_text()
    finally:
        lab.stop_hf_hub()
    deadline = time.monotonic() + 10
    while _alive(pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _alive(pid) and not (tmp_path / "hfhub.pid").exists()


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"  # a zombie has exited
    except OSError:
        return False
