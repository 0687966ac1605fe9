"""Live progress while a playbook runs, and the per-host table printed at the end.

runner calls `update` synchronously for every event, so it only queues a tuple; a
background thread renders. On a terminal that is a live table (one row per host with its
current task and counts); elsewhere (CI logs, pipes) it is one line per task and per failure.
"""

from __future__ import annotations

import queue
import threading
import time
from typing import Any

from rich.console import Console
from rich.live import Live
from rich.table import Table

from provision.runner import HostStats, RunResult

_COUNTED = {
    "runner_on_ok": "ok",
    "runner_on_async_ok": "ok",
    "runner_on_failed": "failed",
    "runner_on_async_failed": "failed",
    "runner_on_unreachable": "unreachable",
    "runner_on_skipped": "skipped",
}


class LiveProgress:
    def __init__(self, console: Console, title: str):
        self.console = console
        self.title = title
        self._events: queue.Queue[tuple[str, str, str, bool, bool]] = queue.Queue()
        self._hosts: dict[str, HostStats] = {}
        self._task: dict[str, str] = {}
        self._play_task = ""
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self._started = 0.0

    # called from runner's event handler: keep it cheap
    def update(self, kind: str, data: dict[str, Any]) -> None:
        res = data.get("res") or {}
        self._events.put(
            (
                kind,
                data.get("host", ""),
                data.get("task", ""),
                bool(isinstance(res, dict) and res.get("changed")),
                bool(data.get("ignore_errors")),
            )
        )

    def start(self) -> None:
        self._started = time.monotonic()
        self._thread = threading.Thread(target=self._render_loop, name="provision-progress", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread:
            self._thread.join(timeout=5)

    def _apply(self, item: tuple[str, str, str, bool, bool]) -> str | None:
        kind, host, task, changed, ignored = item
        if kind == "playbook_on_task_start":
            self._play_task = task
            return f"TASK {task}"
        if kind == "runner_on_start" and host:
            self._task[host] = task
            self._hosts.setdefault(host, HostStats())
            return None
        counter = _COUNTED.get(kind)
        if not counter or not host:
            return None
        stats = self._hosts.setdefault(host, HostStats())
        if counter == "failed" and ignored:
            stats.ignored += 1
            return None
        setattr(stats, counter, getattr(stats, counter) + 1)
        if counter == "ok" and changed:
            stats.changed += 1
            return f"  changed: {host}"
        if counter in ("failed", "unreachable"):
            return f"  {counter.upper()}: {host} ({task})"
        return None

    def _table(self) -> Table:
        elapsed = time.monotonic() - self._started
        table = Table(title=f"{self.title}  [{elapsed:5.0f}s]", expand=False)
        for col in ("host", "current task", "ok", "changed", "failed", "unreachable", "skipped"):
            table.add_column(col, justify="left" if col in ("host", "current task") else "right")
        for host in sorted(self._hosts):
            s = self._hosts[host]
            table.add_row(
                host,
                self._task.get(host, ""),
                str(s.ok),
                str(s.changed),
                str(s.failed),
                str(s.unreachable),
                str(s.skipped),
            )
        return table

    def _drain(self, lines: bool) -> None:
        while True:
            try:
                item = self._events.get_nowait()
            except queue.Empty:
                return
            line = self._apply(item)
            if lines and line:
                self.console.print(line, markup=False, highlight=False)

    def _render_loop(self) -> None:
        if self.console.is_terminal:
            with Live(self._table(), console=self.console, refresh_per_second=4, transient=True) as live:
                while not self._stop.is_set():
                    self._drain(lines=False)
                    live.update(self._table())
                    time.sleep(0.25)
                self._drain(lines=False)
        else:
            while not self._stop.wait(0.2):
                self._drain(lines=True)
            self._drain(lines=True)


def summary_table(result: RunResult, title: str) -> Table:
    table = Table(title=title)
    for col in ("host", "status", "ok", "changed", "failed", "unreachable", "skipped", "time"):
        table.add_column(col, justify="left" if col in ("host", "status") else "right")
    for host, s in sorted(result.hosts.items()):
        colour = {"ok": "green", "changed": "yellow", "failed": "red", "unreachable": "red"}[s.status]
        table.add_row(
            host,
            f"[{colour}]{s.status}[/]",
            str(s.ok),
            str(s.changed),
            str(s.failed),
            str(s.unreachable),
            str(s.skipped),
            f"{result.host_durations_s.get(host, 0):.1f}s",
        )
    table.caption = f"{result.playbook}: {result.status} in {result.duration_s:.1f}s"
    return table
