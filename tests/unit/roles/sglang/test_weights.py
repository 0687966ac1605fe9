"""The sglang role's weights step (roles/sglang/tasks/weights.yml) run through ansible-playbook on this machine
against the lab's Hugging Face hub (provision/lab/hfhub.py) on 127.0.0.1: `provision plan` on a fresh container
(no venv yet) reports the download pending instead of failing, and the client's install asks the same package
sources as SGLang's own install (plugins/module_utils/pip_args.py), the extra index included."""

from __future__ import annotations

import http.server
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from provision.lab import hfhub
from tests.playbooks import role_outcome_playbook, run_role_playbook
from tests.unit.collection import COLLECTIONS
from tests.unit.conftest import HF_TOKEN

pip_args = __import__("ansible_collections.provision.pve_sglang.plugins.module_utils.pip_args", fromlist=["x"])

PLAYBOOK = role_outcome_playbook(
    "sglang",
    "The weights step",
    tasks_from="weights.yml",
    extra_outcome=", 'weights': _sglang_weights | default(None), "
    "'staged': _sglang_weights_staged.results | default([]) | map(attribute='files') | list",
    handlers=False,  # the service restart the download notifies: this machine runs no systemd
)
# a fresh container's Python: the one that makes the venv, without huggingface_hub
SYSTEM_PYTHON = Path("/usr/bin/python3")


def has_client(python: Path) -> bool:
    return subprocess.run([str(python), "-c", "import huggingface_hub"], capture_output=True).returncode == 0


def outcome(tmp_path: Path, hub, check: bool, env: dict | None = None, **overrides) -> dict:
    repo = hub.repos[hfhub.REPO_ID]
    extra = {
        "sglang_model_source": {"type": "huggingface", "repo": repo.repo_id, "revision": repo.commit},
        "sglang_model_path": str(tmp_path / "models" / "tiny"),
        "sglang_venv_dir": str(tmp_path / "venv"),
        "sglang_python": str(SYSTEM_PYTHON),
        "sglang_hf_token": HF_TOKEN,
        "sglang_hf_endpoint": hub.url,
        "proxmox_host": "localhost",  # the node_dir block names it (its delegate_to is templated first)
        **overrides,
    }

    def sh(command: str, check: bool) -> subprocess.CompletedProcess:
        command = command.replace(" -i ", " --check -i ", 1) if check_mode else command
        return subprocess.run(
            ["bash", "-c", command], capture_output=True, text=True, check=check, env={**os.environ, **(env or {})}
        )

    check_mode = check
    # the task's own interpreter must win, as it does over an inventory's
    return run_role_playbook(sh, tmp_path, PLAYBOOK, extra, COLLECTIONS, interpreter_var="inventory")


@pytest.mark.skipif(not SYSTEM_PYTHON.exists() or has_client(SYSTEM_PYTHON), reason="needs a Python without the client")
def test_plan_on_a_fresh_container_reports_the_download_pending(hub, tmp_path):
    found = outcome(tmp_path, hub, check=True)
    assert found["failed"] is None, found
    weights = found["weights"]
    assert weights["changed"] is True and "pending" in weights["msg"], weights
    assert not (tmp_path / "venv").exists() and not (tmp_path / "models").exists()
    assert hub.requests == [], "nothing to ask the hub with before the client is installed"


def test_each_missing_file_is_fetched_once_in_its_own_step_and_a_second_run_fetches_none(hub, tmp_path):
    """The role with the client installed (this test's own venv stands for the service's): the listing, one loop
    step per missing file (what the console's progress follows), then the revision put in place; the hub is asked
    for each file once. A second run lists the files and downloads nothing."""
    import huggingface_hub

    repo = hub.repos[hfhub.REPO_ID]
    venv = {
        "sglang_python": sys.executable,
        "sglang_venv_dir": sys.prefix,
        "sglang_hf_client_package": f"huggingface_hub=={huggingface_hub.__version__}",
    }
    first = outcome(tmp_path, hub, check=False, **venv)
    assert first["failed"] is None and first["weights"]["changed"] is True, first
    model = tmp_path / "models" / "tiny"
    assert {f.path: (model / f.path).read_bytes() == f.data for f in repo.files} == {f.path: True for f in repo.files}
    gets = [r["path"] for r in hub.requests if "/resolve/" in r["path"] and r["method"] == "GET"]
    fetched = sorted(path.rsplit("/", 1)[-1] for path in gets)
    assert fetched == sorted(f.path for f in repo.files), hub.requests
    assert first["staged"] == [[{"name": f.path, "size": len(f.data), "action": "staged"}] for f in repo.files]
    hub.requests.clear()
    again = outcome(tmp_path, hub, check=False, **venv)
    assert again["failed"] is None and again["weights"]["changed"] is False and again["staged"] == [], again
    assert [r for r in hub.requests if "/resolve/" in r["path"]] == [], hub.requests


class Index(http.server.BaseHTTPRequestHandler):
    """A package index that has nothing: it only records which of its URLs pip asked for."""

    asked: list[str] = []  # noqa: RUF012 (one server per test)

    def do_GET(self):
        Index.asked.append(self.path)
        self.send_response(404)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args):
        pass


@pytest.fixture
def index():
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Index)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    Index.asked = []
    yield f"http://127.0.0.1:{server.server_port}"
    server.shutdown()


def test_the_clients_install_asks_the_extra_index_too(hub, tmp_path, index):
    # only the sources the role gives: no pip.conf of this machine, no wheelhouse of its environment
    env = {"PIP_CONFIG_FILE": os.devnull, "PIP_FIND_LINKS": "", "PIP_RETRIES": "0"}
    found = outcome(
        tmp_path,
        hub,
        check=False,
        env=env,
        sglang_python=sys.executable,
        sglang_pip_index_url=f"{index}/main/",
        sglang_pip_extra_index_url=f"{index}/extra/",
    )
    assert found["failed"], "neither index has the client: the install fails"
    assert "/main/huggingface-hub/" in Index.asked and "/extra/huggingface-hub/" in Index.asked, Index.asked


@pytest.mark.parametrize(
    ("sources", "args"),
    [
        ({}, []),
        ({"index_url": "https://m/simple"}, ["--index-url", "https://m/simple"]),
        ({"find_links": "/srv/w"}, ["--no-index", "--find-links", "/srv/w"]),
        (
            {"index_url": "https://m/simple", "find_links": "/srv/w"},
            ["--index-url", "https://m/simple", "--find-links", "/srv/w"],
        ),
        (
            {"extra_index_url": "https://e/simple", "find_links": "/srv/w"},
            ["--extra-index-url", "https://e/simple", "--find-links", "/srv/w"],
        ),
    ],
    ids=["pypi", "index", "offline-wheelhouse", "index-and-wheelhouse", "extra-index-is-not-dropped-by-no-index"],
)
def test_pip_source_args(sources, args):
    assert pip_args.pip_source_args(**sources) == args
