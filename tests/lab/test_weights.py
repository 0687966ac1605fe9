"""The model weights from a Hugging Face source: the sglang phase downloads a pinned, gated repo from the
lab's hub (provision/lab/hfhub.py, reached by the container on its link's host side through sglang_hf_endpoint)
with the real huggingface_hub client in the service venv, verifies each file, and a re-run changes nothing; a retire
with --weights would remove what the download put there and nothing else."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from provision.lab import hfhub
from provision.lab.specs import HUB_MODEL_PATH as MODEL_PATH
from provision.lab.specs import hub_model_vars
from tests.conftest import run_provision
from tests.lab.common import apply, ensure_converged, set_host_vars

LAB_CHANGES = {"gpu", "sglang", "ct"}  # tests/lab/conftest.py
LAB_NODES = "nspawn"  # no bootloader, no kernel line changed: nodes as nspawn containers (docs/lab.md)

TOKEN_ENV = "LAB_HUB_ACCESS"  # a name that does not look secret: provision knows it through sglang_hf_token's no_log


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    return tmp_path_factory.mktemp("weights-runs")


@pytest.fixture(scope="module")
def ct(lab, lab_inventory, runs):
    ensure_converged(lab, lab_inventory, runs, "kernel", "gpu")
    yield lab.container()
    lab.stop_hf_hub()
    set_host_vars(lab_inventory, "sglang-01", None)
    if lab.container().ssh("test -e /etc/systemd/system/sglang.service").returncode:  # retired: serve again
        assert apply(lab_inventory, runs, "--tags", "gpu,sglang")[0] == 0


def converge(lab, inv, runs, hub):
    set_host_vars(inv, "sglang-01", hub_model_vars(hub, "{{ lookup('ansible.builtin.env', '" + TOKEN_ENV + "') }}"))
    return apply(inv, runs, "--tags", "sglang", env={TOKEN_ENV: hub["token"]})


def sha256_inside(ct, name: str) -> str:
    return ct.ssh(f"sha256sum {MODEL_PATH}/{name}").stdout.split()[0]


def test_the_repo_is_downloaded_verified_and_a_second_apply_changes_nothing(lab, ct, lab_inventory, runs):
    hub = lab.start_hf_hub()
    rc, _, err = converge(lab, lab_inventory, runs, hub)
    assert rc == 0, err[-3000:]
    # the CLI's progress off a terminal: one line per file as it lands, the whole download's bytes and files
    steps = [line.split(", ")[1] for line in err.splitlines() if line.startswith("  sglang-01: ") and " files" in line]
    assert steps == ["1 of 3 files", "2 of 3 files", "3 of 3 files"], err[-3000:]
    for f in hfhub.tiny_repo().files:
        assert sha256_inside(ct, f.path) == hashlib.sha256(f.data).hexdigest(), f.path
    assert hub["token"] not in "".join(p.read_text(errors="replace") for p in runs.rglob("*") if p.is_file())
    rc, again, err = converge(lab, lab_inventory, runs, hub)
    assert rc == 0, err[-3000:]
    assert again["hosts"]["sglang-01"]["changed"] == 0


def test_a_corrupted_file_is_refused_naming_it_and_nothing_is_left_of_it(lab, ct, lab_inventory, runs):
    ct.ssh(f"rm -rf {MODEL_PATH}")
    hub = lab.start_hf_hub(corrupt=("model.safetensors",))
    rc, result, err = converge(lab, lab_inventory, runs, hub)
    said = err + json.dumps(result)  # the failure's one line, on the console and in the --json result
    assert rc == 1
    assert f"{MODEL_PATH}/model.safetensors" in said and "sha256" in said, said[-3000:]
    assert ct.ssh(f"test -e {MODEL_PATH}/model.safetensors; echo $?").stdout.strip() == "1"


REMOVE_DOWNLOAD = "Remove the files of the download, its record, its staging directory and the client's cache"


def test_retire_weights_removes_the_downloads_files_and_no_other(lab, ct, lab_inventory, runs):
    """`provision retire --weights --check` after a complete download: what it would remove is each file the
    download's record lists, and the record (the staging directory is gone once the download is complete); a file of
    the directory that no download put there is not among them, and nothing is removed. The retire then removes
    those and leaves that file, in its directory."""
    hub = lab.start_hf_hub()
    rc, _, err = converge(lab, lab_inventory, runs, hub)
    assert rc == 0, err[-3000:]
    ct.ssh(f"echo mine > {MODEL_PATH}/notes.txt")
    before = ct.ssh(f"find {MODEL_PATH} -printf '%p %s\\n' | sort").stdout
    args = ("--inventory", str(lab_inventory), "--limit", "sglang-01", "--weights", "--check", "--json")
    proc = run_provision("retire", *args, "--runs-dir", str(runs), env={TOKEN_ENV: hub["token"]}, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout)["result"]
    events = (json.loads(p.read_text()) for p in Path(result["record_dir"]).glob("artifacts/*/job_events/*.json"))
    would = {
        e["event_data"]["res"]["item"]
        for e in events
        if e.get("event") == "runner_item_on_ok"
        and e["event_data"].get("task") == REMOVE_DOWNLOAD
        and e["event_data"]["res"].get("changed")
    }
    cached = {".cache/huggingface"} if ct.ssh(f"test -d {MODEL_PATH}/.cache/huggingface").returncode == 0 else set()
    assert would == {f.path for f in hfhub.tiny_repo().files} | {".provision-weights.json"} | cached, would
    assert any(m.endswith(f"weights at {MODEL_PATH} would be removed") for m in result["reports"]["sglang-01"])
    assert ct.ssh(f"find {MODEL_PATH} -printf '%p %s\\n' | sort").stdout == before

    # the retire itself: the download's files go, the file that is not its stays, and so does the directory with it
    real = [a for a in args if a != "--check"]
    proc = run_provision("retire", *real, "--yes", "--runs-dir", str(runs), env={TOKEN_ENV: hub["token"]}, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    left = ct.ssh(f"cd {MODEL_PATH} && find . -mindepth 1 | sort").stdout.split()
    assert left == ["./notes.txt"], left
