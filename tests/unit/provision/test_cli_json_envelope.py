"""Every command's --json is the one envelope of docs/json.md, errors included."""

from __future__ import annotations

import json
import re

import jsonschema
import pytest

from provision import cli
from tests.loaders import REPO

DOC = REPO / "docs" / "json.md"
SCHEMA = json.loads(re.search(r"```json\n(.*?)```", DOC.read_text(), re.S).group(1))
GOOD = (REPO / "inventory" / "prod").as_posix()


def _envelope(argv, capsys) -> dict:
    code = cli.main([*argv, "--json"])
    data = json.loads(capsys.readouterr().out)
    jsonschema.validate(data, SCHEMA)
    assert data["exit_code"] == code and data["ok"] == (code == 0)
    return data


def test_schema_is_valid():
    jsonschema.Draft202012Validator.check_schema(SCHEMA)


@pytest.mark.parametrize(
    "argv",
    [
        ["inventory", "check", "-i", GOOD],
        ["inventory", "check", "-i", "nosuch"],
        ["plan", "-i", "nosuch"],
        ["apply", "-i", GOOD, "--tags", "nosuch"],
        ["verify", "-i", GOOD, "--limit", "nosuch"],
        ["capacity", "-i", GOOD, "--session-tokens", "abc"],
        ["diag", "-i", GOOD, "--limit", "nosuch"],
        ["bench", "-i", GOOD, "--concurrency", "0"],
        ["rollback", "-i", GOOD, "--yes"],
        ["frobnicate"],
    ],
    ids=lambda argv: "-".join(argv[:2]),
)
def test_every_command_prints_the_envelope(argv, capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    data = _envelope(argv, capsys)
    assert data["command"] == (argv[0] if argv[0] in cli.COMMANDS else "provision")
    if data["exit_code"]:
        assert data["errors"] and all("\n" not in e for e in data["errors"])
    else:
        assert data["hosts"] == {"pve-gpu-01": "valid", "sglang-01": "valid"}


def test_plan_envelope_from_a_run(monkeypatch, capsys, tmp_path):
    """A plan that ran: per-host states and exit 4 with changes pending (the run itself stubbed:
    tests/test_apply_ssh.py runs real ones)."""
    from provision import apply as apply_mod
    from provision.runner import HostStats, RunResult

    def fake_apply(opts, progress=None, kind="apply", playbook=""):
        result = RunResult("site.yml", "successful", 0, True, "now", 1.0)
        result.hosts = {"pve-gpu-01": HostStats(ok=3, changed=1), "sglang-01": HostStats(ok=3)}
        result.changed_tasks = [{"host": "pve-gpu-01", "task": "Write X", "play": "p", "diff": [{"before": "a"}]}]
        result.host_states = apply_mod.host_states(result, ["pve-gpu-01", "sglang-01"])
        return result

    monkeypatch.setattr(apply_mod, "apply", fake_apply)
    monkeypatch.chdir(tmp_path)
    data = _envelope(["plan", "-i", GOOD], capsys)
    assert data["exit_code"] == 4 and data["hosts"] == {"pve-gpu-01": "changes pending", "sglang-01": "up to date"}
    assert data["result"]["would_change"] == {"pve-gpu-01": ["Write X"], "sglang-01": []}


def test_interrupted_and_locked_envelopes(monkeypatch, capsys, tmp_path):
    """SIGINT during a run: exit 130, the run's summary and one error line naming the record; another run
    holding the inventory: exit 1 and the error line naming it (the runs themselves are in tests/test_apply_ssh.py)."""
    from provision import apply as apply_mod
    from provision.errors import Interrupted
    from provision.locks import LockHeld

    def interrupted(opts, progress=None, kind="apply", playbook=""):
        raise Interrupted("interrupted by SIGINT: run record R", 2, {"stopped_at": {}}, {"pve-gpu-01": "interrupted"})

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(apply_mod, "apply", interrupted)
    data = _envelope(["apply", "-i", GOOD, "--yes"], capsys)
    assert (data["exit_code"], data["errors"], data["result"]) == (
        130,
        ["interrupted by SIGINT: run record R"],
        {"stopped_at": {}},
    )
    assert data["hosts"] == {"pve-gpu-01": "interrupted"}

    def locked(opts, progress=None, kind="apply", playbook=""):
        raise LockHeld("inventory X is locked by run R (pid 1 on c, since t): wait for it to end")

    monkeypatch.setattr(apply_mod, "apply", locked)
    data = _envelope(["apply", "-i", GOOD, "--yes"], capsys)
    assert data["exit_code"] == 1 and data["errors"] == [
        "inventory X is locked by run R (pid 1 on c, since t): wait for it to end"
    ]
