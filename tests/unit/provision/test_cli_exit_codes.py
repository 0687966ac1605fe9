"""docs/json.md's exit codes are the CLI's: the page's list is walked, and each code it documents comes out of
cli.main for the condition the page names; the page names every code the CLI has."""

from __future__ import annotations

import json
import os
import re
import signal
import time

import pytest

from provision import apply as apply_mod
from provision import bench, cli, errors, interrupts
from provision import inventory as inventory_mod
from provision.locks import LockHeld
from provision.runner import HostStats, RunResult
from tests.loaders import REPO

GOOD = (REPO / "inventory" / "prod").as_posix()


def documented() -> dict[int, str]:
    """Each code of the page's "Exit codes:" list, with the words the page gives it."""
    text = (REPO / "docs" / "json.md").read_text().split("\nExit codes:\n", 1)[1].split("\n\n", 1)[0]
    codes = {}
    for item in re.split(r"\n(?=- )", text.strip()):
        head, _, meaning = item.partition(": ")
        for code in re.findall(r"`(\d+)`", head):
            codes[int(code)] = " ".join(meaning.split())
    return codes


def _locked(monkeypatch) -> list[str]:
    def apply(opts, progress=None, kind="apply", playbook=""):
        raise LockHeld("inventory X is locked by run R (pid 1 on c, since t): wait for it to end")

    monkeypatch.setattr(apply_mod, "apply", apply)
    return ["apply", "-i", GOOD, "--yes"]


def _pending(monkeypatch) -> list[str]:
    def apply(opts, progress=None, kind="apply", playbook=""):
        result = RunResult("site.yml", "successful", 0, True, "now", 1.0)
        result.hosts = {"pve-gpu-01": HostStats(ok=3, changed=1), "sglang-01": HostStats(ok=3)}
        result.host_states = apply_mod.host_states(result, ["pve-gpu-01", "sglang-01"])
        return result

    monkeypatch.setattr(apply_mod, "apply", apply)
    return ["plan", "-i", GOOD]


def _regressed(monkeypatch) -> list[str]:
    class Regressed(bench.BenchResult):
        regressed = True
        complete = True

    monkeypatch.setattr(bench, "bench", lambda opts, progress=None: Regressed())
    return ["bench", "-i", GOOD]


def _signal_while_loading(signum: int):
    """The signal itself, sent to this process while the inventory loads (before any run)."""

    def driver(monkeypatch) -> list[str]:
        def load(*args, **kwargs):
            os.kill(os.getpid(), signum)
            time.sleep(10)
            raise AssertionError(f"{signal.Signals(signum).name} did not stop the command")

        monkeypatch.setattr(inventory_mod, "load", load)
        return ["inventory", "check", "-i", GOOD]

    return driver


# what produces each documented code, with a word the page's line for it must hold
CONDITIONS = {
    0: ("success", lambda mp: ["inventory", "check", "-i", GOOD]),
    1: ("another run holds the inventory's lock", _locked),
    2: ("usage or inventory error", lambda mp: ["apply", "-i", "nosuch", "--yes"]),
    3: ("regression", _regressed),
    4: ("changes are pending", _pending),
    130: ("SIGINT", _signal_while_loading(signal.SIGINT)),
    143: ("SIGTERM", _signal_while_loading(signal.SIGTERM)),
    129: ("SIGHUP", _signal_while_loading(signal.SIGHUP)),
}


def test_the_page_lists_every_code_the_cli_has_and_no_other():
    constants = {errors.EXIT_OK, errors.EXIT_FAILED, errors.EXIT_USAGE, errors.EXIT_REGRESSION, errors.EXIT_PENDING}
    signalled = {errors.EXIT_SIGNAL_BASE + s for s in interrupts.SignalTrap.SIGNALS}
    assert set(documented()) == constants | signalled == set(CONDITIONS)


@pytest.mark.parametrize("code", sorted(CONDITIONS))
def test_each_documented_code_comes_out_for_its_condition(code, monkeypatch, capsys, tmp_path):
    words, driver = CONDITIONS[code]
    assert words in documented()[code], f"docs/json.md no longer says {words!r} for exit {code}"
    monkeypatch.chdir(tmp_path)
    assert cli.main([*driver(monkeypatch), "--json"]) == code
    envelope = json.loads(capsys.readouterr().out)
    assert envelope["exit_code"] == code and envelope["ok"] == (code == 0)
