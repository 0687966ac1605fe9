"""The console report: each capacity prediction shape prints, the ones that do not fit with their reason."""

import io
import re
import shutil
import sys

import yaml
from rich.console import Console

from provision import present, runner
from provision.capacity import compute
from provision.lab import hfhub
from provision.present import ConsoleProgress, print_capacity
from provision.record import RunRecord
from provision.verify import VerifyReport
from tests.unit.conftest import HF_TOKEN
from tests.unit.provision.test_capacity import QWEN35, QWEN35_WEIGHTS, SCENARIO_INFO, SCENARIO_MODELS


def printed(**predict) -> list[str]:
    cap = compute(SCENARIO_INFO, SCENARIO_MODELS, model_config=QWEN35, **predict)
    out = io.StringIO()
    print_capacity(Console(file=out, width=300), VerifyReport("lab", capacity={"sglang-01": cap.to_dict()}))
    return out.getvalue().splitlines()[2:]


def test_every_prediction_shape_prints_with_its_figures_or_its_reason():
    fits, too_big = printed(weights_bytes=QWEN35_WEIGHTS, predict_tp=(4, 1))
    assert fits == "  tp=4, same GPUs and mem_fraction_static: 3,459,451 tokens, 13.2 sessions"
    assert too_big.startswith("  tp=1, same GPUs and mem_fraction_static: does not fit: ")
    assert "weights 232.8 GiB per GPU at tp=1" in too_big
    assert printed(predict_tp=(4,)) == [
        "  tp=4, same GPUs and mem_fraction_static: cannot be predicted: weights size unknown (no safetensors index)"
    ]


def test_a_download_loop_shows_files_bytes_rate_and_time_left_on_a_terminal_and_in_a_log(hub, tmp_path, monkeypatch):
    """The real sglang_weights module, one loop item per file as the sglang role runs it, through ansible-runner:
    on a terminal the live table's row shows where the download stands; elsewhere each file prints one line."""
    repo = hub.repos[hfhub.REPO_ID]
    playbooks = tmp_path / "playbooks"
    playbooks.mkdir()
    weights = {
        "repo": repo.repo_id,
        "revision": repo.commit,
        "path": str(tmp_path / "model"),
        "endpoint": hub.url,
        "token": HF_TOKEN,
        "files": ["{{ item }}"],
    }
    tasks = [
        # a second between items: the table, drawn four times a second, shows each step
        {
            "name": "Stage",
            "provision.pve_sglang.sglang_weights": weights,
            "loop": [f.path for f in repo.files],
            "loop_control": {"pause": 1},
        },
    ]
    (playbooks / "t.yml").write_text(yaml.safe_dump([{"hosts": "all", "gather_facts": False, "tasks": tasks}]))
    (tmp_path / "hosts.yml").write_text(
        yaml.safe_dump(
            {"all": {"hosts": {"h1": {"ansible_connection": "local", "ansible_python_interpreter": sys.executable}}}}
        )
    )
    monkeypatch.setattr(runner, "playbooks_dir", lambda: playbooks)
    total = sum(len(f.data) for f in repo.files)
    for terminal in (True, False):
        out = io.StringIO()
        console = Console(file=out, width=250, force_terminal=terminal, color_system=None)
        with RunRecord(tmp_path / "runs", "test") as record:
            result = runner.run_playbook(
                "t.yml",
                tmp_path / "hosts.yml",
                record=record,
                host_count=1,
                progress=ConsoleProgress(console).playbook("t"),
            )
        assert result.succeeded, result.failures
        shown = out.getvalue()
        if terminal:
            rows = re.findall(
                rf"│ h1 +│ Stage \(([0-9.]+ k?B) of {present._size(total)}, (\d) of 3 files, "
                r"[0-9.]+ [kMG]?B/s, \d:\d\d:\d\d left\)",
                shown,
            )
            assert {"1", "2"} <= {k for _, k in rows}, shown
        else:
            lines = [line for line in shown.splitlines() if line.startswith("  h1: ")]
            assert [line.split(", ")[1] for line in lines] == ["1 of 3 files", "2 of 3 files", "3 of 3 files"], shown
        shutil.rmtree(tmp_path / "model")


def test_a_download_line_gives_rate_and_time_left_once_bytes_have_moved():
    progress = {"files": 50, "files_staged": 12, "bytes": 244_000_000_000, "bytes_staged": 60_100_000_000}
    assert present.download_line(progress, None) == "60.1 GB of 244.0 GB, 12 of 50 files"
    assert present.download_line(progress, 98_100_000) == (
        "60.1 GB of 244.0 GB, 12 of 50 files, 98.1 MB/s, 0:31:14 left"
    )
    assert present.download_line({"msg": "not a download"}, 1.0) is None
