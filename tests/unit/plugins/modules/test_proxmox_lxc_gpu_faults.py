"""The fault matrix of plugins/modules/proxmox_lxc_gpu.py: every API call it makes, faulted as PVE faults.

The module runs as Ansible runs it (its main(), arguments through ansible's patch_module_args) against fakepve
(PVE's schema, tasks, digests and pending changes) served in this process, with one fault injected at a time:
PVE's own error answers (fakepve's catalogue of the messages in PVE's sources: an expired ticket, a privilege
check, the config lock's timeout), pveproxy's 596 when it loses the request it proxies, a task that fails or
outlasts the wait, and a connection reset before or after PVE has done what was asked.

For each fault the test checks what the user sees (one line naming the CT and node and saying what to do,
or a run that succeeds), the container's configuration after it (untouched, or every entry written: never
part of them), and that runs with the fault gone converge (the next one may still reboot the container for
the change the faulty run left pending; the one after changes nothing).

The container needs its entries and features nesting=1, which waits for a restart, so one run makes every
call: log in, read the config, write it, read the running config, read the status, reboot, poll the task.
"""

from __future__ import annotations

import asyncio
import re
import socket
import struct
import threading
import time
from dataclasses import dataclass

import pytest
from aiohttp import web

from tests.faults import Row
from tests.unit import collection

NODE, VMID = "pve1", 101
HOST_NODES = [
    {"path": "/dev/nvidia0", "type": "char", "mode": "0666"},
    {"path": "/dev/nvidiactl", "type": "char", "mode": "0666"},
    {"path": "/dev/nvidia-uvm", "type": "char", "mode": "0666"},
    {"path": "/dev/nvidia-caps/nvidia-cap1", "type": "char", "mode": "0400"},
]
WANTED = {"/dev/nvidia0", "/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-caps/nvidia-cap1"}
UNRELATED = {"dev0": "/dev/dri/card0,mode=0660", "mp0": "/srv/models,mp=/models"}
CT = rf"/nodes/{NODE}/lxc/{VMID}"


@dataclass(frozen=True)
class Call:
    """One request the module makes: method, path pattern, and whether it asks for the running config."""

    name: str
    method: str
    path: str
    current: bool | None = None

    def matches(self, request) -> bool:
        if request.method != self.method or not re.search(self.path + "$", request.path):
            return False
        return self.current is None or ("current" in request.query) == self.current


LOGIN = Call("login", "POST", "/access/ticket")
GET_CONFIG = Call("GET config", "GET", CT + "/config", current=False)
PUT_CONFIG = Call("PUT config", "PUT", CT + "/config")
GET_RUNNING = Call("GET config current=1", "GET", CT + "/config", current=True)
GET_STATUS = Call("GET status/current", "GET", CT + "/status/current")
REBOOT = Call("POST status/reboot", "POST", CT + "/status/reboot")
TASK_STATUS = Call("GET task status", "GET", rf"/nodes/{NODE}/tasks/[^/]+/status")
CALLS = [LOGIN, GET_CONFIG, PUT_CONFIG, GET_RUNNING, GET_STATUS, REBOOT, TASK_STATUS]
BEFORE_WRITE = {LOGIN, GET_CONFIG}


@dataclass
class Fault:
    """Answer `call` with PVE's error `error` (fakepve's catalogue; one PVE raises in a task makes the task
    fail, as PVE's does), or `status` and `message`, or reset the connection `reset` ("before" PVE acts, or
    "after" it has, before it answers); `times` requests, or every one. `hits` counts the requests faulted."""

    call: Call
    error: str | None = None
    status: int | None = None
    message: str | None = None
    reset: str | None = None
    times: int | None = None
    hits: int = 0


def _reset(request) -> None:
    """Close the connection with a TCP RST, as a peer that went away does."""
    sock = request.transport.get_extra_info("socket")
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    request.transport.abort()


def faulty_pve_class():
    from fakepve import FakePve
    from fakepve.server import error

    class FaultyPve(FakePve):
        """fakepve answering one injected fault (`self.fault`) before its own handlers."""

        fault: Fault | None = None

        def _build_app(self):
            app = super()._build_app()
            app.middlewares.insert(0, self._inject)
            return app

        @web.middleware
        async def _inject(self, request, handler):
            fault = self.fault
            if fault is None or not fault.call.matches(request):
                return await handler(request)
            fault.hits += 1
            if fault.times is not None and fault.hits >= fault.times:
                self.fault = None
            if fault.reset:
                if fault.reset == "after":
                    await handler(request)
                _reset(request)
                raise ConnectionResetError(f"fault: connection reset {fault.reset} PVE acted")
            if fault.error is None:
                return error(fault.status, fault.message)
            (found,) = [e for e in self.errors_for(request.method, request.path) if e["name"] == fault.error]
            if found["in_task"]:  # fakepve starts the task and ends it with PVE's TASK ERROR
                self.fail(request.method, request.path, error=fault.error, times=1)
                return await handler(request)
            return error(found["status"], found["message"], found.get("errors"))

    return FaultyPve


class Served:
    """A FaultyPve on its own event loop in a thread, seeded with one running container."""

    def __init__(self, cafile: str, keyfile: str, pve_class=None):
        self.cafile = cafile
        self.pve = (pve_class or faulty_pve_class())(host="127.0.0.1", port=0)
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.call(self.pve.start(cafile, keyfile))
        self.ct = self.pve.add_ct(VMID, "sglang", node=NODE, status="running", config=dict(UNRELATED))

    def call(self, coro):
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(30)

    def stop(self) -> None:
        self.call(self.pve.stop())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)

    def idle(self, timeout: float = 30) -> None:
        """Wait until no task runs (a reboot the module stopped waiting for goes on in PVE)."""
        deadline = time.monotonic() + timeout
        while any(t["status"] == "running" for t in list(self.pve.tasks.values())):
            assert time.monotonic() < deadline, "a PVE task never ended"
            time.sleep(0.05)

    def reboots(self) -> int:
        return sum(1 for t in list(self.pve.tasks.values()) if t["type"] == "vzreboot")

    def state(self) -> dict:
        """The config with pending changes merged in, as PVE shows it, and what the container runs with."""
        ct = self.ct
        merged = {k: v for k, v in {**ct.config, **ct.pending}.items() if v is not None}
        return {
            "merged": merged,
            "running": dict(ct.config),
            "digest": ct.digest(),
            "status": ct.status,
            "reboots": self.reboots(),
        }


class Clock:
    """The module's `time`: each sleep is recorded and taken 50 times shorter (backoffs, task polls)."""

    monotonic = staticmethod(time.monotonic)
    time = staticmethod(time.time)  # a TOTP code's time step (pve_api.totp)

    def __init__(self):
        self.sleeps: list[float] = []

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        time.sleep(seconds / 50)


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    from fakepve.certs import make_cert

    return make_cert(str(tmp_path_factory.mktemp("pve-pki")), hosts=("127.0.0.1",))[:2]


@pytest.fixture
def served(pki):
    served = Served(*pki)
    yield served
    served.stop()


def clocked(monkeypatch, name: str, clock: Clock):
    """The collection's module `name`, its task polls and the retries' backoff (module_utils/pve_api.py) on `clock`."""
    mod = collection.module(name)
    if hasattr(mod, "time"):  # the task polls are pve_api.wait_task's
        monkeypatch.setattr(mod, "time", clock)
    monkeypatch.setattr(mod.pve_api, "time", clock)
    return mod


def api_args(served: Served) -> dict:
    """The connection arguments every API module takes, for the fakepve `served`."""
    return {
        "api_host": "127.0.0.1",
        "api_port": served.pve.port,
        "api_user": "root@pam",
        "api_password": "secret",
        "ca_file": served.cafile,
    }


@pytest.fixture
def module(monkeypatch):
    return clocked(monkeypatch, "proxmox_lxc_gpu", Clock())


def run(module, served: Served, **params) -> dict:
    """One run of the module, as Ansible starts it: its result (msg and failed on a failure)."""
    args = {**api_args(served), "node": NODE, "vmid": VMID, "nodes": HOST_NODES, **params}
    return collection.main_result(module, args)


def ours(config: dict) -> set[str]:
    return {v.split(",")[0] for k, v in config.items() if re.fullmatch(r"dev\d+", k) and "/dev/nvidia" in v}


@dataclass(frozen=True)
class Case:
    """One row: the fault (built fresh per run), what the user sees (the whole message, `…` for what varies;
    None: the run succeeds, `note` says how), and module parameters."""

    id: str
    label: str
    fault: dict
    sees: str | None
    note: str = ""
    params: tuple = ()
    reboot_s: float = 0.0  # real seconds the container's reboot takes

    @property
    def call(self) -> Call:
        return self.fault["call"]

    @property
    def written(self) -> bool:
        """Whether the faulty run has written the entries (PVE did the PUT)."""
        if self.sees is None:
            return True
        return self.call not in BEFORE_WRITE and (self.call != PUT_CONFIG or self.fault.get("reset") == "after")

    @property
    def in_effect(self) -> bool:
        """Whether the container runs with everything once PVE's tasks have ended: the reboot PVE started goes on
        when the module stops waiting for it, or cannot read its status."""
        return self.sees is None or self.reboot_s > 0 or self.call == TASK_STATUS

    def row(self) -> Row:
        if self.sees is None:
            sees, converges = f"no failure: {self.note}", "yes, in the same run; the next run changes nothing"
        else:
            sees, converges = f"`{PREFIX}{self.sees}`", "yes: " + RERUN[self.written, self.in_effect]
        return Row(
            self.label,
            "gpu",
            sees,
            AFTER[self.written, self.in_effect],
            converges,
            f"tests/unit/plugins/modules/test_proxmox_lxc_gpu_faults.py::test_api_fault[{self.id}]",
            True,
            True,
        )


# the faulty run's state (entries written?, in effect once PVE's tasks ended?): as the doc says it, and the next runs
AFTER = {
    (False, False): "config unchanged (same digest), no reboot",
    (True, False): "every entry written, none in part; nesting=1 pending a restart",
    (True, True): "every entry written and in effect",
}
RERUN = {
    (False, False): "the next run writes the entries and reboots the container, the one after changes nothing",
    (True, False): "the next run reboots the container, the one after changes nothing",
    (True, True): "the next run changes nothing",
}


PREFIX = f"CT {VMID} on {NODE}: "
CHECK_LOGIN = "check proxmox_api_user and proxmox_api_password (or the API token), then run again"
LOGIN_AGAIN = "the login is no longer valid: " + CHECK_LOGIN
GRANT = f"root@pam lacks the privilege PVE names: grant it on /vms/{VMID}, then run again"
RETRIED = "{what} failed 3 times; the PVE API at 127.0.0.1:… keeps failing ({answer}): {todo}"
ANSWERS = "run again once it answers"
LOCKED = f"another task holds CT {VMID}'s lock (a backup, snapshot or migration): run again once it has ended"
BROKEN_PIPE = "596 Errors during TLS negotiation, request sending and header processing: Broken pipe"
LOCK_TIMEOUT = f"500 Internal Server Error: can't lock file '/run/lock/lxc/pve-config-{VMID}.lock' - got timeout"
INVALID_TICKET = "401 Unauthorized: permission denied - invalid PVE ticket"
REBOOT_TASK = "the container's reboot (task UPID:…)"
WHAT = {
    GET_CONFIG: "reading the container config",
    PUT_CONFIG: "writing the container config",
    GET_RUNNING: "reading the running config",
    GET_STATUS: "reading the container status",
    REBOOT: "rebooting the container",
    TASK_STATUS: "reading the status of the container's reboot",
}


def refused(call: Call, answer: str, todo: str) -> str:
    return f"{WHAT[call]} was refused ({answer}): {todo}"


def audit(privilege: str) -> str:
    return f"403 Forbidden: Permission check failed (/vms/{VMID}, {privilege})"


def _faults_everywhere() -> list[Case]:
    """401 and 596 on every call; 403 on each that checks a privilege; the lock timeout where PVE locks."""
    cases = [
        Case(
            "login-401",
            "401 on the login (`authentication failure`)",
            {"call": LOGIN, "error": "authentication_failure"},
            f"authentication failed for root@pam at https://127.0.0.1:…: {CHECK_LOGIN} (…code: 401)",
        ),
        Case(
            "login-596",
            "596 on the login (pveproxy lost pvedaemon)",
            {"call": LOGIN, "status": 596, "message": "Broken pipe"},
            RETRIED.format(what="logging in", answer="596 …code: 596", todo=ANSWERS),
        ),
    ]
    for call in CALLS[1:]:
        cases.append(
            Case(
                f"{_slug(call)}-401",
                f"401 on {call.name} (`invalid PVE ticket`)",
                {"call": call, "error": "invalid_ticket"},
                refused(call, INVALID_TICKET, LOGIN_AGAIN),
            )
        )
        cases.append(
            Case(
                f"{_slug(call)}-596",
                f"596 on {call.name}, every attempt",
                {"call": call, "status": 596, "message": "Broken pipe"},
                RETRIED.format(what=WHAT[call], answer=BROKEN_PIPE, todo=ANSWERS),
            )
        )
    for call, privilege in (
        (GET_CONFIG, "VM.Audit"),
        (GET_RUNNING, "VM.Audit"),
        (GET_STATUS, "VM.Audit"),
        (REBOOT, "VM.PowerMgmt"),
    ):
        cases.append(
            Case(
                f"{_slug(call)}-403",
                f"403 on {call.name} (`Permission check failed`)",
                {"call": call, "error": "permission_denied"},
                refused(call, audit(privilege), GRANT),
            )
        )
    for call in (PUT_CONFIG, REBOOT):
        cases.append(
            Case(
                f"{_slug(call)}-lock-timeout",
                f"500 config lock timeout on {call.name}, every attempt",
                {"call": call, "error": "config_lock_timeout"},
                RETRIED.format(what=WHAT[call], answer=LOCK_TIMEOUT, todo=LOCKED),
            )
        )
    return cases


def _faults_of_writes_and_tasks() -> list[Case]:
    """PVE's devN rule, a CT a backup holds, failing and slow tasks, resets: what is written, and the reboot."""
    devn_403 = "403 Forbidden: Permission check failed (configuring device passthrough is only allowed for root@pam)"
    return [
        Case(
            "put-config-403",
            "403 on PUT config (device passthrough is root@pam's)",
            {"call": PUT_CONFIG, "error": "permission_check_failed_configuring_device"},
            f"PVE refused the devN change ({devn_403}): only root@pam may change devN entries: "
            "set proxmox_api_user: root@pam, then run again",
        ),
        Case(
            "put-config-locked-backup",
            "500 `CT is locked (backup)` on PUT config, every attempt",
            {"call": PUT_CONFIG, "error": "locked"},
            RETRIED.format(
                what=WHAT[PUT_CONFIG], answer="500 Internal Server Error: CT is locked (backup)", todo=LOCKED
            ),
        ),
        Case(
            "put-config-lock-timeout-once",
            "500 config lock timeout on PUT config, once",
            {"call": PUT_CONFIG, "error": "config_lock_timeout", "times": 1},
            None,
            "the PUT is retried after 1 s",
        ),
        Case(
            "reboot-task-error",
            "the reboot task ends in `TASK ERROR: container did not stop`",
            {"call": REBOOT, "error": "did_not_stop"},
            f"{REBOOT_TASK} ended with exitstatus 'container did not stop': …; the devN entries are written and "
            f"wait for a restart: run again, or reboot it yourself (pct reboot {VMID} on {NODE})",
        ),
        Case(
            "reboot-task-slow",
            "a reboot task slower than `task_timeout` (3 s, timeout 1 s)",
            {"call": REBOOT},
            f"{REBOOT_TASK} is still running after 1s; PVE goes on with it: run again once it has ended, "
            "or raise gpu_passthrough_task_timeout",
            params=(("task_timeout", 1),),
            reboot_s=3,
        ),
        Case(
            "reboot-task-slow-within",
            "a slow reboot task (1.5 s) within `task_timeout`",
            {"call": REBOOT},
            None,
            "the task is polled until it ends",
            reboot_s=1.5,
        ),
        Case(
            "put-config-reset-before",
            "connection reset mid-PUT, before PVE wrote the config",
            {"call": PUT_CONFIG, "reset": "before", "times": 1},
            None,
            "the PUT is retried with the same digest",
        ),
        Case(
            "put-config-reset-after",
            "connection reset mid-PUT, after PVE wrote the config",
            {"call": PUT_CONFIG, "reset": "after", "times": 1},
            None,
            "the retried PUT meets `detected modified configuration`, the config is read again and found done",
        ),
        Case(
            "reboot-reset-after",
            "connection reset after PVE started the reboot task",
            {"call": REBOOT, "reset": "after", "times": 1},
            None,
            "the reboot is not asked for again: its effect is found in the running config",
        ),
        Case(
            "reboot-reset-after-slow",
            "connection reset after PVE started a slow reboot task (1.5 s)",
            {"call": REBOOT, "reset": "after", "times": 1},
            None,
            "the reboot is not asked for again: the task is found among the CT's running tasks and waited for",
            reboot_s=1.5,
        ),
        Case(
            "task-status-reset",
            "connection reset on a task status poll",
            {"call": TASK_STATUS, "reset": "before", "times": 1},
            None,
            "the poll is retried",
        ),
    ]


def _slug(call: Call) -> str:
    return re.sub(r"[^a-z0-9]+", "-", call.name.lower()).strip("-")


CASES = _faults_everywhere() + _faults_of_writes_and_tasks()
FAULT_ROWS = [c.row() for c in CASES]


def pattern(sees: str) -> re.Pattern:
    """The message `sees` stands for: `…` is what varies (a port, a UPID, a log tail)."""
    return re.compile(".+?".join(re.escape(part) for part in (PREFIX + sees).split("…")))


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_api_fault(case, served, module):
    before = served.state()
    fault = Fault(**case.fault)
    if case.reboot_s:
        served.pve.time_scale, served.ct.shutdown_secs = 0.05, case.reboot_s / 0.05
    if fault.error or fault.status or fault.reset:
        served.pve.fault = fault
    result = run(module, served, **dict(case.params))
    served.pve.fault = None
    assert served.reboots() <= 1, "the container was rebooted twice"
    _sees(case, result, fault, module.pve_api.time.sleeps)
    served.idle()
    _state_after(case, before, served.state())
    _converges(case, served, module)


def _sees(case: Case, result: dict, fault: Fault, sleeps: list[float]) -> None:
    """The run succeeds, or fails with the one line the case names: after 3 attempts 1 s and 2 s apart, or after
    one for what no retry changes."""
    if case.sees is None:
        assert not result.get("failed") and result["changed"], result.get("msg")
        return
    assert result.get("failed") and "\n" not in result["msg"], result
    assert pattern(case.sees).fullmatch(result["msg"]), result["msg"]
    assert "exception" not in result, "a fault the module knows is no traceback"
    if "keeps failing" in case.sees:
        assert (fault.hits, sleeps) == (3, [1.0, 2.0]), "a bounded retry with backoff"
    elif "was refused" in case.sees:
        assert fault.hits == 1, "no retry of what no retry changes"


def _state_after(case: Case, before: dict, after: dict) -> None:
    """Untouched, or every entry written; unrelated entries kept; in effect when the case says so."""
    assert {k: after["merged"].get(k) for k in UNRELATED} == UNRELATED, "an unrelated entry was touched"
    if not case.written:
        assert after["digest"] == before["digest"], "the config changed although the run stopped before writing"
        assert after["reboots"] == 0, "rebooted for nothing"
        return
    assert ours(after["merged"]) == WANTED and after["merged"]["features"] == "nesting=1", "written in part"
    running = ours(after["running"]) == WANTED and after["running"].get("features") == "nesting=1"
    assert running == case.in_effect, after["running"]


def _converges(case: Case, served: Served, module) -> None:
    """With the fault gone: a run that ends ok and leaves everything in effect, then a run that changes nothing."""
    served.pve.time_scale = 0
    if case.sees is not None:
        first = run(module, served)
        assert not first.get("failed"), first["msg"]
        assert first["changed"] == (not case.in_effect), (
            "the next run after the fault: " + RERUN[case.written, case.in_effect]
        )
    again = run(module, served)
    assert not again.get("failed") and not again["changed"], again
    state = served.state()
    assert ours(state["running"]) == WANTED and state["running"]["features"] == "nesting=1"
    assert state["status"] == "running" and not served.ct.pending
