"""The one place that runs ansible-runner and turns its events into progress and a result.

Every run gets a fresh private data dir (runner's env/ files are sticky, §a.6 of the
ecosystem notes), the user's own ansible.cfg with provision's settings only where it is
silent (provision/ansible_config.py), and the `ansible-playbook` of the interpreter running
us. What is kept afterwards goes to a run record directory, copied from the private data dir
with secrets redacted; the private data dir is removed, and no process of the run outlives it:
SIGINT or SIGTERM stops them all, and ssh's ControlPersist masters end with the run
(provision/interrupts.py).
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from provision import ansible_config, child_warnings, interrupts, watchdog
from provision.errors import Interrupted, ProvisionError, one_line
from provision.inventory import VaultOptions
from provision.paths import collections_path, playbooks_dir, plugins_dir, roles_dir
from provision.record import RunRecord


@dataclass
class HostStats:
    ok: int = 0
    changed: int = 0
    failed: int = 0
    unreachable: int = 0
    skipped: int = 0
    rescued: int = 0
    ignored: int = 0

    @property
    def status(self) -> str:
        if self.unreachable:
            return "unreachable"
        if self.failed:
            return "failed"
        return "changed" if self.changed else "ok"


@dataclass
class RunResult:
    playbook: str
    status: str  # runner's status: successful, failed, timeout, canceled
    rc: int
    check: bool
    started: str
    duration_s: float
    hosts: dict[str, HostStats] = field(default_factory=dict)
    changed_tasks: list[dict[str, Any]] = field(default_factory=list)
    failures: list[dict[str, Any]] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    # per host, what the tasks reported (REPORT_KEY: bootloader path, reboot pending, findings)
    reports: dict[str, list[str]] = field(default_factory=dict)
    host_durations_s: dict[str, float] = field(default_factory=dict)
    record_dir: str = ""
    # Ansible stopped the playbook (a serial batch failed): hosts not in `last_play_hosts` were not reached
    aborted: bool = False
    last_play_hosts: list[str] = field(default_factory=list)
    host_states: dict[str, str] = field(default_factory=dict)  # apply.host_states, for the hosts in scope
    # per host, the last task that started on it: {"task", "role", "finished"}
    last_tasks: dict[str, dict[str, Any]] = field(default_factory=dict)
    interrupted: str = ""  # SIGINT or SIGTERM when a signal stopped the run (status "interrupted")

    @property
    def succeeded(self) -> bool:
        return (
            self.rc == 0
            and self.status == "successful"
            and not any(h.failed or h.unreachable for h in self.hosts.values())
        )

    def changed_by_host(self) -> dict[str, list[str]]:
        """Per host, the tasks that changed (in check mode: would change)."""
        per_host: dict[str, list[str]] = {h: [] for h in self.hosts}
        for item in self.changed_tasks:
            per_host.setdefault(item["host"], []).append(item["task"])
        return per_host

    def host_warnings(self) -> list[str]:
        """The run's warnings about a host (a module's, such as unverified TLS to the PVE API), for the console; the
        summary keeps Ansible's own notices too (deprecations, our playbooks' empty host patterns)."""
        return [w for w in self.warnings if w.split(": ", 1)[0] in self.hosts]

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["succeeded"] = self.succeeded
        data["hosts"] = {name: {**asdict(s), "status": s.status} for name, s in self.hosts.items()}
        return data


class EventCollector:
    """Counts what ran, per host, from runner events.

    `handle` is runner's event_handler: it must stay tiny (a slow handler stalls runner's
    output loop) and must return True (else the event is not written to job_events).
    """

    def __init__(self, on_update: Callable[[str, dict[str, Any]], None] | None = None):
        self.changed_tasks: list[dict[str, Any]] = []
        self.failures: list[dict[str, Any]] = []
        self.warnings: list[str] = []
        self.reports: dict[str, list[str]] = {}
        self.current_task = ""
        self.current_play = ""
        self.host_seconds: dict[str, float] = {}
        self.live: dict[str, HostStats] = {}
        # hosts that answered in the play running when Ansible gave up ("NO MORE HOSTS LEFT")
        self.play_hosts: set[str] = set()
        self.aborted = False
        self.last_tasks: dict[str, dict[str, Any]] = {}
        self._on_update = on_update
        # a host's last failure, and those after which the host ran on: a rescue's candidates (_drop_rescued)
        self._last_failure: dict[str, tuple[dict[str, Any], bool]] = {}  # and whether it was an unreachable
        self._ran_on: dict[str, list[dict[str, Any]]] = {}

    def _report(self, host: str, res: dict[str, Any]) -> None:
        messages = _report_messages(res)
        if messages:
            self.reports.setdefault(host, []).extend(messages)

    def _module_warnings(self, host: str, res: dict[str, Any]) -> None:
        """A module's warnings (module.warn) travel in its result, not as events of their own."""
        items = res.get("results") if isinstance(res.get("results"), list) else []
        for item in [res, *items]:
            warnings = item.get("warnings") if isinstance(item, dict) else None
            for warning in warnings if isinstance(warnings, list) else ():
                line = f"{host}: {one_line(warning)}"
                if line not in self.warnings:
                    self.warnings.append(line)

    def handle(self, event: dict[str, Any]) -> bool:
        kind = event.get("event", "")
        data = event.get("event_data") or {}
        host = data.get("host", "")
        if kind.startswith("playbook_on_"):
            self._playbook_event(kind, data)
        elif kind == "runner_on_start" and host:
            self.last_tasks[host] = {"task": data.get("task", ""), "role": data.get("role") or "", "finished": False}
            self._ran_on_after(host)
        elif kind.startswith("runner_on_") and host and kind != "runner_on_async_poll":
            self._host_result(kind, host, data)
        elif kind in ("warning", "deprecated") and event.get("stdout"):
            self.warnings.append(_strip_ansi(event["stdout"]).strip())
        if self._on_update is not None:
            self._on_update(kind, data)
        return True

    def _playbook_event(self, kind: str, data: dict[str, Any]) -> None:
        """A play or task starting, Ansible giving up, or the run's closing stats."""
        if kind == "playbook_on_play_start":
            self.current_play = data.get("name", "")
            self.play_hosts = set()
        elif kind == "playbook_on_no_hosts_remaining":
            self.aborted = True
        elif kind == "playbook_on_task_start":
            self.current_task = data.get("task", "")
        elif kind == "playbook_on_stats":
            self._drop_rescued(data.get("rescued") or {})

    def _host_result(self, kind: str, host: str, data: dict[str, Any]) -> None:
        """A task's outcome on one host: counted, and its changes, failure, warnings and report kept."""
        task = data.get("task", "")
        self.last_tasks[host] = {"task": task, "role": data.get("role") or "", "finished": True}
        stats = self.live.setdefault(host, HostStats())
        self.play_hosts.add(host)
        res = data.get("res") or {}
        self._module_warnings(host, res)
        self.host_seconds[host] = self.host_seconds.get(host, 0.0) + float(data.get("duration") or 0)
        if kind in ("runner_on_ok", "runner_on_async_ok"):
            self._ok(host, task, stats, res)
        elif kind in ("runner_on_failed", "runner_on_async_failed"):
            self._failed(host, task, stats, res, ignored=bool(data.get("ignore_errors")))
        elif kind == "runner_on_unreachable":
            stats.unreachable += 1
            failure = {"host": host, "task": task, "message": unreachable_message(str(res.get("msg", "")))}
            self._last_failure[host] = (failure, True)
            self.failures.append(failure)
        elif kind == "runner_on_skipped":
            stats.skipped += 1

    def _ok(self, host: str, task: str, stats: HostStats, res: dict[str, Any]) -> None:
        stats.ok += 1
        if res.get("changed"):
            stats.changed += 1
            change = {"host": host, "task": task, "play": self.current_play}
            self.changed_tasks.append({**change, "diff": _diffs(res)} if _diffs(res) else change)
        self._report(host, res)

    def _failed(self, host: str, task: str, stats: HostStats, res: dict[str, Any], ignored: bool) -> None:
        if ignored:
            stats.ignored += 1
        else:
            stats.failed += 1
            failure = {"host": host, "task": task, "message": _failure_message(res)}
            self._last_failure[host] = (failure, False)
            self.failures.append(failure)

    def _ran_on_after(self, host: str) -> None:
        """The host ran another task after its last failure: a rescue's (_drop_rescued), or an unreachable result
        the task ignored (ignore_unreachable; Ansible takes a host that was unreachable out of the play otherwise)."""
        failure, unreachable = self._last_failure.pop(host, (None, False))
        if failure is None:
            return
        if unreachable:
            self.failures.remove(failure)
            self.live[host].unreachable -= 1
            self.live[host].ignored += 1
        else:
            self._ran_on.setdefault(host, []).append(failure)

    def _drop_rescued(self, rescued: dict[str, int]) -> None:
        """A failure a block's rescue handled is not the run's: Ansible's stats count each host's rescues, and the
        failures they were are among those after which the host ran on (an `always` runs on too, but is no rescue)."""
        for host, count in rescued.items():
            for failure in self._ran_on.get(host, [])[: int(count)]:
                self.failures.remove(failure)
                self.live[host].failed -= 1
                self.live[host].rescued += 1


# A task reports to the operator by returning this key in its msg (`ansible.builtin.debug` with
# `msg: {provision_report: ...}`): the roles' "Report ..." tasks. Read from what the task returned, never from
# its name, so renaming a task loses nothing.
REPORT_KEY = "provision_report"


def _report_messages(res: dict[str, Any]) -> list[str]:
    """What one task result reports (one message per loop item that has one)."""
    items = res.get("results") if isinstance(res.get("results"), list) else [res]
    msgs = [i.get("msg") for i in items if isinstance(i, dict)]
    return [one_line(m[REPORT_KEY]) for m in msgs if isinstance(m, dict) and m.get(REPORT_KEY)]


# Mitogen's words when the host went away in the middle of a task; its "please file a bug" misleads an operator
# whose container was stopped or whose node rebooted
_MITOGEN_LOST = "Mitogen was disconnected from the remote environment while a call was in-progress"


def unreachable_message(msg: str) -> str:
    """The one line for a host that became unreachable: the connection's own words, or for a connection lost in
    the middle of a task, what that means and what to do."""
    msg = one_line(msg)
    if _MITOGEN_LOST in msg:
        cause = msg.rsplit("Original error was:", 1)[-1].strip()
        return (
            "unreachable: the connection was lost while the task ran (the host stopped, rebooted or lost its "
            f"network: {cause}); run apply again once it answers ssh"
        )
    return "unreachable: " + msg


def _diffs(res: dict[str, Any]) -> list[dict[str, Any]]:
    """What a task's --diff said (one entry per diff; loops give one per item)."""
    items = res.get("results") if isinstance(res.get("results"), list) else [res]
    found = []
    for item in items:
        diff = item.get("diff") if isinstance(item, dict) else None
        found += [d for d in (diff if isinstance(diff, list) else [diff]) if isinstance(d, dict) and d]
    return found


# what ssh adds to a raw command's stderr when its shared connection's session ends
_SSH_CLOSED = re.compile(r"(Shared )?[Cc]onnection to \S+ closed\.")


def command_said(res: dict[str, Any], tail: int = 500) -> str:
    """What a failed command printed about its failure: its stderr; for ansible.builtin.raw over ssh, where the
    pseudo-terminal merges the command's stderr into its stdout and stderr holds only ssh's "Shared connection to
    ... closed.", the end of its stdout."""
    stderr = str(res.get("stderr") or "")
    if _SSH_CLOSED.sub("", stderr).strip():
        return stderr
    return str(res.get("stdout") or "")[-tail:] or stderr


def _failure_message(res: dict[str, Any]) -> str:
    items = res.get("results") if isinstance(res.get("results"), list) else []
    failed = [_failure_message(i) for i in items if isinstance(i, dict) and i.get("failed")]
    if failed:  # a loop's own msg only says that one or more items failed: each failed item's says which and why
        return "; ".join(failed)
    said = command_said(res) if res.get("rc") not in (None, 0) else str(res.get("stderr") or "")
    msg = res.get("msg") or said or res.get("reason") or "failed"
    if said and res.get("msg") and said not in str(msg):
        msg = f"{msg}: {said}"
    return one_line(msg)  # whatever the module or the connection printed


_ANSI = re.compile(r"\x1b\[[0-9;]*m")


def _strip_ansi(text: str) -> str:
    return _ANSI.sub("", text)


@functools.cache
def release() -> str:
    """This release and a digest of the code the playbooks run (playbooks, roles, plugins, the package's
    own Python): a phase's recorded fingerprint only holds for the same code (roles/provision_state)."""
    from provision import __version__

    sha = hashlib.sha256()
    package = Path(__file__).resolve().parent
    for root in (playbooks_dir(), roles_dir(), plugins_dir(), package):
        for path in sorted(p for p in root.rglob("*") if p.is_file() and "__pycache__" not in p.parts):
            sha.update(f"{path.relative_to(root)}\0".encode() + path.read_bytes())
    return f"{__version__}+{sha.hexdigest()[:16]}"


def base_extravars() -> dict[str, Any]:
    """Facts about provision itself that every playbook may use."""
    from provision import __version__

    return {
        "provision_version": __version__,
        "provision_release": release(),
    }


def _environment(pdd: Path, host_count: int, host_key_checking: bool) -> dict[str, str]:
    """ansible-playbook's environment for a run in this private data dir."""
    control_dir = pdd / "cp"
    control_dir.mkdir(mode=0o700)
    return {
        **ansible_config.environment(ansible_config.forks_for(host_count), host_key_checking, control_dir),
        # runner finds ansible-playbook through PATH: use the one beside our interpreter
        "PATH": str(Path(sys.executable).parent) + os.pathsep + os.environ.get("PATH", ""),
        "ANSIBLE_FORCE_COLOR": "0",
        "ANSIBLE_NOCOLOR": "1",
        "ANSIBLE_LOCAL_TEMP": str(pdd / "tmp"),
        "PROVISION_PYTHON": sys.executable,
        "PYTHONWARNINGS": child_warnings(),
        # every process of the run inherits it: interrupts.stop_run finds them all by it
        interrupts.RUN_MARKER: str(pdd),
        # the playbooks name their roles and modules as the collection provision.pve_sglang: this one
        "ANSIBLE_COLLECTIONS_PATH": collections_path(pdd / "collections"),
    }


@contextlib.contextmanager
def adhoc_environment(host_count: int, host_key_checking: bool = True, vault: VaultOptions | None = None):
    """The environment of Ansible used by another program, with a run's settings (the user's ansible.cfg,
    provision's where it is silent, the collection, vault): verify's checks, whose testinfra commands run through
    the hosts' Ansible connection plugins. Its directory (ssh's control sockets, Ansible's temp) and every process
    started with it are gone on exit, as after a playbook run. Provision's Mitogen strategy is left out: no play
    runs in it."""
    with private_data_dir() as pdd:
        env = _environment(pdd, host_count, host_key_checking)
        for setting in (ansible_config.STRATEGY, ansible_config.STRATEGY_PLUGINS):
            env.pop(ansible_config.ENV[setting], None)
        yield {**env, **(vault or VaultOptions()).environment()}


@contextlib.contextmanager
def private_data_dir():
    """A run's private data dir (0700, in $TMPDIR), under a watchdog: should provision die without a word, the
    watchdog stops the run's processes and removes it. On exit every process of the run is stopped (what a cancel
    left, and ssh's ControlPersist masters) and the dir removed."""
    pdd = Path(tempfile.mkdtemp(prefix=watchdog.PREFIX))
    with watchdog.watched(pdd):
        try:
            yield pdd
        finally:
            interrupts.stop_run(str(pdd))
            shutil.rmtree(pdd, ignore_errors=True)


def private_file(path: Path, text: str) -> Path:
    """`text` in a new file readable by its owner alone (a run's values that may hold a secret, kept off every
    command line)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as handle:
        handle.write(text)
    return path


def _prepare(pdd: Path) -> None:
    """runner's settings file: look at the cancel callback every second, not every 5 (its default), so that a
    signal stops the run at once. (runner drops a `settings` argument when this file is missing.)"""
    (pdd / "env").mkdir()
    (pdd / "env" / "settings").write_text(json.dumps({"pexpect_timeout": 1}))


@dataclass(frozen=True)
class UserOptions:
    """ansible-playbook's own options, as the user gave them to provision: --extra-vars (above every inventory value;
    an @FILE made absolute), --skip-tags (phases), -v (its verbosity), -u and -b (below the inventory's
    ansible_user and ansible_become, as in ansible-playbook)."""

    extra_vars: tuple[str, ...] = ()
    skip_tags: tuple[str, ...] = ()
    verbosity: int = 0
    remote_user: str | None = None  # -u: the user to connect as, where the inventory names none
    become: bool = False  # -b: become root for every task, where the inventory does not say

    def extra_vars_files(self, pdd: Path) -> list[str]:
        """--extra-vars for ansible-playbook, each as `@FILE`: an inline value (which may hold a secret) is written to
        a file of the run's private data dir, so that it is on no command line; key=value pairs as the JSON mapping
        Ansible makes of them (strings, as parse_kv gives them)."""
        from ansible.parsing.splitter import parse_kv

        found = []
        for i, value in enumerate(self.extra_vars):
            if value.startswith("@"):
                found.append(value)
                continue
            text = value if value[:1] in ("[", "{") else json.dumps(parse_kv(value))
            found.append(f"@{private_file(pdd / f'extra-vars-{i}.yml', text)}")
        return found


@dataclass
class PlaybookConfig:
    """One run's settings, as ansible-runner's RunnerConfig holds them; `runner_args` makes them the arguments
    of ansible_runner.run in a private data dir."""

    playbook: str
    inventory: Path
    host_count: int
    limit: str | None = None
    tags: list[str] | None = None
    check: bool = False
    diff: bool = False
    extravars: dict[str, Any] | None = None
    host_key_checking: bool = True
    vault: VaultOptions | None = None
    # the user's own ansible-playbook options: --extra-vars (absolute @FILE), --skip-tags, -v
    user: UserOptions | None = None

    @property
    def playbook_path(self) -> Path:
        return playbooks_dir() / self.playbook

    def runner_args(self, pdd: Path) -> dict[str, Any]:
        """ansible_runner.run's arguments, all but its callbacks; writes the private data dir's env/ and cp/."""
        envvars = _environment(pdd, self.host_count, self.host_key_checking)
        _prepare(pdd)
        cmdline = (["--check"] if self.check else []) + (["--diff"] if self.diff else [])
        cmdline += (self.vault or VaultOptions()).playbook_args()
        user = self.user or UserOptions()
        cmdline += [a for value in user.extra_vars_files(pdd) for a in ("--extra-vars", value)]
        cmdline += (["--user", user.remote_user] if user.remote_user else []) + (["--become"] if user.become else [])
        return {
            "private_data_dir": str(pdd),
            "project_dir": str(playbooks_dir()),
            "playbook": str(self.playbook_path),
            "inventory": str(self.inventory),
            "envvars": envvars,
            "extravars": {**base_extravars(), **(self.extravars or {})},
            "limit": self.limit,
            "tags": ",".join(self.tags) if self.tags else None,
            "skip_tags": ",".join(user.skip_tags) if user.skip_tags else None,
            "verbosity": user.verbosity or None,
            "cmdline": shlex.join(cmdline) or None,  # runner splits it with shlex
            "suppress_env_files": True,
            "quiet": not user.verbosity,  # -v: Ansible's own output too
            "ident": "run",
        }


def playbook_tasks(config: PlaybookConfig) -> str:
    """`ansible-playbook --list-tasks` with the run's arguments, environment and collection: the plays and tasks
    Ansible would run, in its own listing (a dynamic include is listed as the include task). Nothing connects."""
    with private_data_dir() as pdd:
        args = config.runner_args(pdd)
        extravars = private_file(pdd / "extravars.json", json.dumps(args["extravars"]))
        cmd = ["ansible-playbook", "--list-tasks", "--inventory", args["inventory"], "--extra-vars", f"@{extravars}"]
        for flag in ("limit", "tags", "skip_tags"):
            cmd += [f"--{flag.replace('_', '-')}", args[flag]] if args[flag] else []
        cmd += ["-" + "v" * args["verbosity"]] if args["verbosity"] else []
        cmd += [*shlex.split(args["cmdline"] or ""), args["playbook"]]
        env = {**os.environ, **args["envvars"]}
        proc = subprocess.run(
            cmd, env=env, cwd=args["project_dir"], capture_output=True, text=True, check=False, timeout=300
        )
    if proc.returncode:
        said = [line.strip() for line in proc.stderr.splitlines() if line.strip()]
        errors = [line for line in said if line.startswith(("[ERROR]", "ERROR!"))]
        raise ProvisionError(f"ansible-playbook --list-tasks failed: {(errors or said or [proc.returncode])[0]}")
    return proc.stdout


def run_playbook(
    playbook: str,
    inventory: Path,
    *,
    record: RunRecord,
    host_count: int,
    limit: str | None = None,
    tags: list[str] | None = None,
    check: bool = False,
    diff: bool = False,
    extravars: dict[str, Any] | None = None,
    host_key_checking: bool = True,
    vault: VaultOptions | None = None,
    progress: Any = None,
    raise_interrupt: bool = True,
    cancel: Callable[[], bool] | None = None,
    user: UserOptions | None = None,
) -> RunResult:
    """Run one packaged playbook against an inventory directory and return what happened.

    Secrets must never be in `extravars` (they would be on ansible-playbook's command
    line): inventories read them from the environment or vault. What the run said (failures, reports,
    diffs, warnings) comes back scrubbed by the record's redactor, and its artifacts are kept in the record.

    SIGINT or SIGTERM while it runs stops every process of the run (provision/interrupts.py); the artifacts are
    kept, and then Interrupted is raised, or with `raise_interrupt=False` the result says `interrupted`. So does
    `cancel()` turning true (a run in another thread, which no signal reaches), with runner's status `canceled`.
    """
    config = PlaybookConfig(
        playbook, inventory, host_count, limit, tags, check, diff, extravars, host_key_checking, vault, user
    )
    if not config.playbook_path.is_file():
        raise ProvisionError(f"{config.playbook_path}: packaged playbook not found")
    watchdog.sweep()  # the private data dirs of runs killed with their watchdog
    with private_data_dir() as pdd:
        started = (time.monotonic(), datetime.now(UTC).isoformat(timespec="seconds"))
        collector = EventCollector(on_update=progress.update if progress else None)
        try:
            args = config.runner_args(pdd)
            if progress:
                progress.start()
            runner, trap = _run(args, collector, cancel)
            result = _artifacts(config, pdd, runner, trap, collector, started, record)
            if trap.signum is not None and raise_interrupt:
                raise Interrupted(f"interrupted by {trap.name}: run record {record.path}", trap.signum)
            return result
        finally:
            if progress:
                progress.stop()


def _run(args: dict[str, Any], collector: EventCollector, cancel=None) -> tuple[Any, interrupts.SignalTrap]:
    """ansible_runner.run with the collector as its event handler, SIGINT and SIGTERM trapped to cancel it."""
    import ansible_runner

    with interrupts.SignalTrap() as trap:
        runner = ansible_runner.run(
            **args,
            event_handler=collector.handle,
            cancel_callback=trap.cancel_callback(args["private_data_dir"], cancel),
        )
    return runner, trap


def _artifacts(config, pdd, runner, trap, collector, started, record) -> RunResult:
    """What the run in `pdd` leaves: its result, and runner's artifacts kept in the record."""
    result = _result(config.playbook, runner, collector, config.check, *started, record)
    result.interrupted = trap.name
    if trap.signum is not None:
        result.status = "interrupted"
    elif runner.status != "successful" and not result.failures:
        message = record.redact(_stdout_tail(pdd)) or runner.status
        result.failures.append({"host": "", "task": "", "message": message})
    record.keep_artifacts(pdd / "artifacts")
    return result


def _result(playbook, runner, collector, check, started, started_at, record) -> RunResult:
    """The run's result; every text that came from the hosts (failures built from their logs included) scrubbed."""
    return RunResult(
        playbook=playbook,
        status=runner.status,
        rc=runner.rc,
        check=check,
        started=started_at,
        duration_s=round(time.monotonic() - started, 2),
        hosts=_final_stats(runner.stats, collector),
        changed_tasks=record.redact(collector.changed_tasks),
        failures=record.redact(collector.failures),
        warnings=record.redact(collector.warnings),
        reports=record.redact(collector.reports),
        host_durations_s={h: round(s, 2) for h, s in collector.host_seconds.items()},
        record_dir=str(record.path),
        aborted=collector.aborted,
        last_play_hosts=sorted(collector.play_hosts),
        last_tasks=record.redact(collector.last_tasks),
    )


def _stdout_tail(pdd: Path) -> str:
    """Why a run with no host failure failed (a playbook Ansible could not load, say), as one line: from Ansible's
    last `ERROR!` on (it names the file and line), else the end of what it printed."""
    stdout = pdd / "artifacts" / "run" / "stdout"
    tail = _strip_ansi(stdout.read_text(errors="replace")[-2000:]) if stdout.is_file() else ""
    return one_line(tail[tail.rfind("ERROR!") :] if "ERROR!" in tail else tail[-600:], 600)


def _final_stats(stats: dict[str, dict[str, int]] | None, collector: EventCollector) -> dict[str, HostStats]:
    if not stats:
        return collector.live
    hosts: dict[str, HostStats] = {}
    names = set(collector.live)
    for key in ("ok", "changed", "failures", "dark", "skipped", "rescued", "ignored"):
        names |= set((stats.get(key) or {}).keys())
    for name in sorted(names):
        hosts[name] = HostStats(
            ok=stats.get("ok", {}).get(name, 0),
            changed=stats.get("changed", {}).get(name, 0),
            failed=stats.get("failures", {}).get(name, 0),
            unreachable=stats.get("dark", {}).get(name, 0),
            skipped=stats.get("skipped", {}).get(name, 0),
            rescued=stats.get("rescued", {}).get(name, 0),
            ignored=stats.get("ignored", {}).get(name, 0),
        )
    return hosts
