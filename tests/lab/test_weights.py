"""The model weights from a Hugging Face source: the sglang phase downloads a pinned, gated repo from the
lab's hub (provision/lab/hfhub.py, reached by the container on its link's host side through sglang_hf_endpoint)
with the real huggingface_hub client in the service venv, verifies each file, and a re-run changes nothing."""

from __future__ import annotations

import hashlib
import json

import pytest

from provision.lab import hfhub
from provision.lab.specs import HUB_MODEL_PATH as MODEL_PATH
from provision.lab.specs import hub_model_vars
from tests.lab.common import apply, ensure_converged, set_host_vars

LAB_CHANGES = {"sglang", "ct"}  # tests/lab/conftest.py
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
