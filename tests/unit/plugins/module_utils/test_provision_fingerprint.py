"""The host lock as the facts step takes it on each host (plugins/module_utils/provision_fingerprint.py): the
decision, the file it writes, and the script as the raw command runs it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from time import time as time_now

import pytest

from provision.paths import module_util
from tests.loaders import REPO

script = module_util("provision_fingerprint")
SCRIPT = Path(script.__file__)
NOW = 1_000_000.0


def _holder(run_id="20250101T000000-apply", controller="ctl-a", pid=4242, **more):
    return {
        "run_id": run_id,
        "controller": controller,
        "pid": pid,
        "since": "2025-01-01T00:00:00+00:00",
        "pid_ns": "boot/1",
        "command": "provision apply",
        **more,
    }


def _record(taken_at=NOW - 60, lease_s=3600, **more):
    return {**_holder(**more), "taken_at": taken_at, "lease_s": lease_s}


OTHER = _holder(run_id="20250101T010101-apply", controller="ctl-b", pid=7, pid_ns="boot/2")
# another run of the holder's own controller (same pid namespace): only it can tell whether the holder is alive
SAME_CONTROLLER = _holder(run_id="20250101T010101-apply", pid=7)


@pytest.mark.parametrize(
    ("current", "request_", "decision"),
    [
        (None, OTHER, "free"),
        (_record(), _holder(), "ours"),
        (_record(), OTHER, "held"),
        (_record(), {**OTHER, "break": True}, "broken"),
        (_record(taken_at=NOW - 3601), OTHER, "expired"),
        (_record(taken_at=NOW - 3601), {**OTHER, "break": True}, "expired"),
        (_record(), {**OTHER, "take_over": _holder()}, "stale"),
        # a take-over names the run it found gone: a lock that changed hands since is not taken
        (_record(), {**OTHER, "take_over": _holder(pid=1)}, "held"),
        # the same run id from another controller is another run
        (_record(), _holder(controller="ctl-b"), "held"),
        # the lease is the holder's own, not the asker's
        (_record(taken_at=NOW - 100, lease_s=60), {**OTHER, "lease_s": 99999}, "expired"),
        ({"run_id": "unreadable /x", "taken_at": NOW - 10}, OTHER, "held"),
        # --break-lock never breaks a run of this controller: gone, it is taken over as stale; alive, it holds
        (_record(), {**SAME_CONTROLLER, "break": True}, "held"),
        (_record(), {**SAME_CONTROLLER, "break": True, "take_over": _holder()}, "stale"),
    ],
    ids=[
        "free",
        "ours",
        "held",
        "broken",
        "expired",
        "expired-not-broken",
        "stale",
        "stale-changed-hands",
        "other-controller",
        "holders-lease",
        "unreadable",
        "break-not-a-run-of-this-controller",
        "break-a-gone-run-of-this-controller",
    ],
)
def test_lock_decision(current, request_, decision):
    assert script.lock_decision(current, request_, NOW) == decision


def test_take_writes_a_root_only_record_and_names_the_holder_to_the_next_run(tmp_path):
    state = tmp_path / "state"
    first = script.take_lock(str(state), {**_holder(), "lease_s": 3600}, now=NOW)
    assert first == {"decision": "free", "taken": True, "holder": None, "holder_text": ""}
    lock = state / "lock.json"
    assert oct(lock.stat().st_mode & 0o777) == "0o600"
    assert json.loads(lock.read_text()) == {**_holder(), "taken_at": NOW, "lease_s": 3600}
    second = script.take_lock(str(state), OTHER, now=NOW + 1)
    assert (second["decision"], second["taken"]) == ("held", False)
    assert second["holder_text"] == "run 20250101T000000-apply (pid 4242 on ctl-a, since 2025-01-01T00:00:00+00:00)"
    assert json.loads(lock.read_text())["run_id"] == "20250101T000000-apply", "a held lock was overwritten"


def test_break_takes_it_and_names_whose_it_was(tmp_path):
    script.take_lock(str(tmp_path), _holder(), now=NOW)
    out = script.take_lock(str(tmp_path), {**OTHER, "break": True}, now=NOW + 1)
    assert (out["decision"], out["taken"], out["holder"]["run_id"]) == ("broken", True, "20250101T000000-apply")
    assert json.loads((tmp_path / "lock.json").read_text())["controller"] == "ctl-b"


def test_a_lock_is_written_anew_over_what_a_crashed_write_left(tmp_path):
    """The lock is written to lock.json.tmp, then renamed: a leftover there (another mode, a link) is not reused."""
    target = tmp_path / "elsewhere"
    target.write_text("keep")
    (tmp_path / "lock.json.tmp").symlink_to(target)
    script.take_lock(str(tmp_path), _holder(), now=NOW)
    assert target.read_text() == "keep"
    assert json.loads((tmp_path / "lock.json").read_text())["run_id"] == _holder()["run_id"]
    (tmp_path / "lock.json.tmp").write_text("{}")
    (tmp_path / "lock.json.tmp").chmod(0o644)
    script.renew_lock(str(tmp_path), _holder(), now=NOW + 1)
    assert (tmp_path / "lock.json").stat().st_mode & 0o777 == 0o600
    assert not (tmp_path / "lock.json.tmp").exists()


RELEASE = REPO / "roles" / "provision_state" / "files" / "release_lock.sh"


def _release_argv(state_dir, holder) -> list[str]:
    """The release as tasks/unlock.yml runs it: sh -c <file> with the holder's run id and controller as JSON."""
    args = [str(state_dir), json.dumps(holder["run_id"]), json.dumps(holder["controller"]), str(holder["pid"])]
    return ["sh", "-c", RELEASE.read_text(), "release_lock", *args]


def _release(state_dir, holder) -> bool:
    proc = subprocess.run(_release_argv(state_dir, holder), capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)["lock"]["released"]


def test_release_removes_only_the_callers_lock(tmp_path):
    script.take_lock(str(tmp_path), _holder(), now=NOW)
    for other in (OTHER, _holder(pid=42), _holder(pid=424), _holder(controller="ctl"), _holder(run_id="2025")):
        assert _release(tmp_path, other) is False, other
    assert (tmp_path / "lock.json").exists()
    assert _release(tmp_path, _holder()) is True
    assert not (tmp_path / "lock.json").exists()
    assert _release(tmp_path, _holder()) is False
    assert _release(tmp_path / "none", _holder()) is False
    assert not (tmp_path / "none").exists(), "a release must not make the state directory"


def test_release_waits_for_the_state_directorys_flock(tmp_path):
    """take_lock decides and writes under an flock of the directory: the release takes the same one."""
    import fcntl

    script.take_lock(str(tmp_path), _holder(), now=NOW)
    fd = os.open(tmp_path, os.O_RDONLY)
    fcntl.flock(fd, fcntl.LOCK_EX)
    proc = subprocess.Popen(_release_argv(tmp_path, _holder()), stdout=subprocess.PIPE, text=True)
    try:
        with pytest.raises(subprocess.TimeoutExpired):
            proc.wait(timeout=0.5)
        assert (tmp_path / "lock.json").exists()
    finally:
        os.close(fd)
    assert json.loads(proc.communicate(timeout=10)[0])["lock"]["released"] is True


def _run_script(*args: str) -> dict:
    proc = subprocess.run([sys.executable, "-c", SCRIPT.read_text(), *args], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def test_the_raw_command_reads_and_locks_in_one_process(tmp_path):
    """What tasks/facts.yml runs: without a request nothing is written; with one, the lock rides along."""
    state = tmp_path / "state"
    state.mkdir()
    assert set(_run_script("read", str(state))) == {"fingerprints", "boot_id"}
    assert os.listdir(state) == []
    out = _run_script("read", str(state), json.dumps(_holder()))
    assert out["lock"]["taken"] is True and "fingerprints" in out
    held = _run_script("read", str(state), json.dumps(OTHER))["lock"]
    assert held["taken"] is False and "pid 4242 on ctl-a" in held["holder_text"]
    stale = _run_script("lock", str(state), json.dumps({**OTHER, "take_over": _holder()}))["lock"]
    assert stale["decision"] == "stale"
    assert _release(state, OTHER) is True
    assert os.listdir(state) == []


# Renewal: the running apply re-stamps the leases of the host locks it holds (provision/locks.py LeaseRenewal,
# roles/provision_state/tasks/renew.yml). Clock: NOW is when the lock was taken, lease 3600 s.
LEASE = 3600


def _take(state, now=NOW, holder=None):
    return script.take_lock(str(state), {**(holder or _holder()), "lease_s": LEASE}, now=now)


def test_a_renewed_lock_outlives_the_lease_it_was_taken_with(tmp_path):
    """A run that lasts three leases keeps its lock while it renews every quarter lease; another run is refused
    throughout, and takes it only a lease after the last renewal."""
    _take(tmp_path)
    renewals = [NOW + i * LEASE / 4 for i in range(1, 13)]
    for when in renewals:
        assert script.renew_lock(str(tmp_path), {**_holder(), "lease_s": LEASE}, now=when)["renewed"] is True
        later = script.take_lock(str(tmp_path), OTHER, now=when + LEASE - 1)
        assert (later["decision"], later["taken"]) == ("held", False), when
    assert json.loads((tmp_path / "lock.json").read_text()) == {**_holder(), "taken_at": renewals[-1], "lease_s": LEASE}
    assert script.take_lock(str(tmp_path), OTHER, now=renewals[-1] + LEASE)["decision"] == "expired"


@pytest.mark.parametrize(
    ("current", "why"),
    [
        (None, "no lock: a renewal never takes one"),
        (_record(**OTHER), "another run's lock is never extended"),
        (_record(pid=1), "the same run id and controller with another pid is another run"),
        (
            _record(**OTHER, taken_at=NOW - 7200),
            "not even once its lease ran out: the next run takes it, not a renewal",
        ),
    ],
    ids=["free", "other-run", "other-pid", "other-expired"],
)
def test_a_renewal_never_takes_or_extends_another_runs_lock(tmp_path, current, why):
    state = tmp_path / "state"
    state.mkdir()
    if current is not None:
        (state / "lock.json").write_text(json.dumps(current))
    before = sorted(os.listdir(state)), (state / "lock.json").read_text() if current else None
    out = script.renew_lock(str(state), {**_holder(), "lease_s": LEASE}, now=NOW)
    assert out["renewed"] is False, why
    assert (sorted(os.listdir(state)), (state / "lock.json").read_text() if current else None) == before, why


def test_a_renewal_makes_no_state_directory(tmp_path):
    assert script.renew_lock(str(tmp_path / "none"), _holder(), now=NOW)["renewed"] is False
    assert not (tmp_path / "none").exists()


def test_a_renewal_keeps_a_lease_that_ran_out_when_nobody_took_it(tmp_path):
    """Its own lock past its lease (the controller could not reach the host for a while) is still this run's
    until another run takes it: the renewal re-stamps it."""
    _take(tmp_path)
    assert script.renew_lock(str(tmp_path), {**_holder(), "lease_s": LEASE}, now=NOW + 2 * LEASE)["renewed"] is True
    assert script.take_lock(str(tmp_path), OTHER, now=NOW + 2 * LEASE + 1)["decision"] == "held"


def test_the_raw_command_renews_in_one_process(tmp_path):
    """What tasks/renew.yml runs."""
    _take(tmp_path, now=time_now() - 100)
    out = _run_script("renew", str(tmp_path), json.dumps({**_holder(), "lease_s": LEASE}))
    assert out["lock"]["renewed"] is True
    assert json.loads((tmp_path / "lock.json").read_text())["taken_at"] > time_now() - 60
    assert _run_script("renew", str(tmp_path), json.dumps(OTHER))["lock"]["renewed"] is False
