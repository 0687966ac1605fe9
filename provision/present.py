"""Everything the CLI shows: the live progress of a playbook run and each command's result, with rich.

The API modules (apply, verify, diag, bench) return data and print nothing; `provision.cli` renders their
results here, on the console it chose, and passes `ConsoleProgress` for what they say while they run.

`LiveProgress`: runner calls `update` synchronously for every event, so it only queues a tuple; a background
thread renders. On a terminal that is a live table (one row per host with its current task and counts);
elsewhere (CI logs, pipes) it is one line per task and per failure.
"""

from __future__ import annotations

import contextlib
import difflib
import json
import queue
import threading
import time
from typing import TYPE_CHECKING, Any

from rich.console import Console
from rich.live import Live
from rich.markup import escape
from rich.table import Table

from provision.bench_report import format_ms
from provision.progress import Progress
from provision.runner import HostStats, RunResult

if TYPE_CHECKING:  # the results rendered here; their modules are loaded by the command that made them
    from provision.bench import BenchResult
    from provision.diag import DiagReport
    from provision.verify import VerifyReport

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
        self._events: queue.Queue[tuple[str, str, str, bool, bool, dict | None]] = queue.Queue()
        self._hosts: dict[str, HostStats] = {}
        self._task: dict[str, str] = {}
        self._detail: dict[str, str] = {}  # a loop's progress within the host's current task
        self._transfer: dict[str, tuple[int, float]] = {}  # per host: the task's bytes so far, and when it started
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
                res.get("progress") if kind == "runner_item_on_ok" and isinstance(res, dict) else None,
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

    def _apply(self, item: tuple[str, str, str, bool, bool, dict | None]) -> str | None:
        kind, host, task, changed, ignored, progress = item
        if kind == "playbook_on_task_start":
            self._play_task = task
            return f"TASK {task}"
        if kind == "runner_on_start" and host:
            self._task[host] = task
            self._hosts.setdefault(host, HostStats())
            self._detail.pop(host, None)
            self._transfer[host] = (0, time.monotonic())
            return None
        if isinstance(progress, dict) and host:
            return self._progress(host, progress)
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

    def _progress(self, host: str, progress: dict) -> str | None:
        """A loop item's `progress` (a download's, as sglang_weights reports it): the host's detail line, with the
        rate since the task started (each step's own work, the listing and the hashing, included) and the time left
        at that rate."""
        done, started = self._transfer.get(host, (0, time.monotonic()))
        with contextlib.suppress(TypeError, ValueError):
            done += int(progress.get("downloaded_bytes", 0))
        self._transfer[host] = (done, started)
        seconds = time.monotonic() - started
        line = download_line(progress, done / seconds if done and seconds > 0 else None)
        if line is None:
            return None
        self._detail[host] = line
        return f"  {host}: {line}"

    def _table(self) -> Table:
        elapsed = time.monotonic() - self._started
        table = Table(title=f"{self.title}  [{elapsed:5.0f}s]", expand=False)
        for col in ("host", "current task", "ok", "changed", "failed", "unreachable", "skipped"):
            table.add_column(col, justify="left" if col in ("host", "current task") else "right")
        for host in sorted(self._hosts):
            s = self._hosts[host]
            table.add_row(
                host,
                escape(self._task.get(host, "") + (f" ({self._detail[host]})" if host in self._detail else "")),
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


def download_line(progress: dict, rate: float | None) -> str | None:
    """'1.2 GB of 3.4 GB, 2 of 5 files, 98.1 MB/s, 0:00:22 left' from a download's progress and its rate in bytes per
    second (None before a byte has moved); None when `progress` is not a download's."""
    try:
        staged, total = int(progress["bytes_staged"]), int(progress["bytes"])
        files, of = int(progress["files_staged"]), int(progress["files"])
    except (KeyError, TypeError, ValueError):
        return None
    line = f"{_size(staged)} of {_size(total)}, {files} of {of} files"
    if rate:
        left = int((total - staged) / rate)
        line += f", {_size(rate)}/s, {left // 3600}:{left // 60 % 60:02d}:{left % 60:02d} left"
    return line


def _size(n: float) -> str:
    """Bytes in decimal units, as the hub and df -H print them."""
    for unit in ("B", "kB", "MB", "GB"):
        if n < 1000:
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return f"{n:.1f} TB"


class ConsoleProgress(Progress):
    """What an API function says while it runs, on a console (stderr for the CLI): the live table, notes, warnings."""

    def __init__(self, console: Console):
        self.console = console

    def playbook(self, title: str) -> LiveProgress:
        return LiveProgress(self.console, title)

    def note(self, message: str) -> None:
        self.console.print(message, highlight=False, markup=False)

    def warning(self, message: str) -> None:
        self.console.print(f"[yellow]warning:[/] {escape(message)}", highlight=False)


def diff_lines(diff: dict[str, Any]) -> list[str]:
    """One task's --diff as unified diff lines (Ansible's before/after form, or its prepared text)."""
    if diff.get("prepared"):
        return str(diff["prepared"]).splitlines()
    before, after = diff.get("before", ""), diff.get("after", "")
    if not isinstance(before, str) or not isinstance(after, str):
        before, after = json.dumps(before, indent=2, sort_keys=True), json.dumps(after, indent=2, sort_keys=True)
    return list(
        difflib.unified_diff(
            before.splitlines(),
            after.splitlines(),
            str(diff.get("before_header") or "before"),
            str(diff.get("after_header") or "after"),
            lineterm="",
        )
    )


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


def print_diffs(console: Console, result: RunResult) -> None:
    """Each pending change's diff, per host and task (scrubbed of secrets by the run)."""
    for change in result.changed_tasks:
        for diff in change.get("diff", []):
            console.print(f"--- {escape(change['host'])}: {escape(change['task'])}", highlight=False)
            for line in diff_lines(diff):
                style = "green" if line.startswith("+") else "red" if line.startswith("-") else None
                console.print(escape(line), style=style, highlight=False)


def print_apply(console: Console, result: RunResult, title: str, show_diff: bool = False) -> None:
    """apply, plan, rollback and retire: the diffs (with --diff), the per-host table, reports, warnings, failures and
    states."""
    if show_diff:
        print_diffs(console, result)
    console.print(summary_table(result, title))
    for host, messages in sorted(result.reports.items()):
        for message in messages:
            console.print(f"{escape(host)}: {escape(message)}", highlight=False)
    for warning in result.host_warnings():
        console.print(f"[yellow]warning:[/] {escape(warning)}", highlight=False)
    for failure in result.failures:
        where = f"{failure['host']}: " if failure["host"] else ""
        task = f"[{failure['task']}] " if failure["task"] else ""
        console.print(f"[red]FAILED[/] {escape(where + task + failure['message'])}", highlight=False)
    pending = result.changed_by_host() if result.check else {}
    for host, state in sorted(result.host_states.items()):
        console.print(f"{escape(host)}: {state}", highlight=False)
        for task in pending.get(host, []):
            console.print(f"  ~ {task}", highlight=False, markup=False)
    console.print(f"run record: {result.record_dir}", highlight=False)


def print_verify(console: Console, report: VerifyReport) -> None:
    """One table of checks per host, the reboots (--after-reboot), the capacity and the verdict."""
    hosts = sorted({c.host for c in report.checks})
    if not hosts:
        console.print("no hosts matched: nothing was verified", style="red")
    for host in hosts:
        table = Table(title=f"verify {host}")
        for col in ("suite", "check", "result", "reason"):
            table.add_column(col)
        for c in (c for c in report.checks if c.host == host):
            table.add_row(c.suite, c.name, "[green]pass[/]" if c.passed else "[red]FAIL[/]", escape(c.reason))
        console.print(table)
    for host, messages in sorted(report.reboots.items()):
        for message in messages:
            console.print(f"{escape(host)}: {escape(message)}")
    for failure in report.reboot_failures:
        console.print(f"[red]REBOOT FAILED[/] {escape(failure['host'] + ': ' + failure['message'])}")
    print_next_boot(console, report)
    print_capacity(console, report)
    verdict = "[green]all checks passed[/]" if report.passed else "[red]verification failed[/]"
    console.print(f"{verdict}; record: {escape(report.record_dir)}")


def print_next_boot(console: Console, report: VerifyReport) -> None:
    """Per node the kernel it boots next and its NVIDIA module, each line it may boot and what that does to the
    IOMMU, and what each container's unit starts with there."""
    for host, boot in sorted(report.next_boot.items()):
        console.print(escape(f"next boot {host}: kernel {boot['kernel']}, NVIDIA module {boot['nvidia_module']}"))
        for i, line in enumerate(boot["lines"]):
            said = f"  {line['source']}: {line['iommu']['source']}"
            said += " (pending: not this boot's)" if line["pending"] else ""
            said += f"; lacks {' '.join(line['lacks'])}" if line["lacks"] else ""
            console.print(escape(said), highlight=False)
            for ct, starts in sorted(boot["containers"].items()):
                if i < len(starts):
                    console.print(escape(f"    {ct}: P2P {starts[i]['p2p']} ({starts[i]['why']})"), highlight=False)


def print_capacity(console: Console, report: VerifyReport) -> None:
    """Each container's capacity: the sentence, the figures it rests on, the predictions."""
    for host, cap in sorted(report.capacity.items()):
        console.print(f"capacity {escape(host)}: {escape(cap['summary'])}")
        details = f"  kv cache {cap['kv_cache_dtype']}, context {cap['context_length']:,}"
        details += f", max_running_requests {cap['max_running_requests']}"
        if cap.get("kv_bytes_per_token_per_gpu"):
            details += f", {cap['kv_bytes_per_token_per_gpu']:,} KV bytes/token/GPU ({cap['kv_pool_gib_per_gpu']} GiB)"
        console.print(escape(details))
        for p in cap.get("predictions", []):
            console.print(escape(f"  {prediction_line(p)}"))
    for host, cap in sorted(report.fleet_capacity.items()):
        console.print(f"capacity {escape(host)} (gateway): {escape(cap['summary'])}")


def prediction_line(p: dict) -> str:
    """One capacity prediction in words, for each shape capacity.predict returns: it fits (tokens and sessions), it
    does not fit (fits False), or it cannot be told (fits None); the last two with their reason."""
    if p.get("fits"):
        return f"{p['what']}: {p['max_total_num_tokens']:,} tokens, {p['full_context_sessions']} sessions"
    said = "does not fit" if p.get("fits") is False else "cannot be predicted"
    return f"{p['what']}: {said}: {p.get('why') or 'no reason given'}"


def print_capacity_run(console: Console, report: VerifyReport) -> None:
    """`provision capacity`: the capacity, then why a container has none."""
    print_capacity(console, report)
    for check in report.checks:
        if not check.passed:
            console.print(f"[red]{escape(check.host)}[/]: {escape(check.reason)}", highlight=False)


def print_diag(console: Console, report: DiagReport) -> None:
    """One row per host: verdict, GPUs, NCCL transports with P2P on and off, the sglang_p2p it recommends."""
    table = Table(title="GPU peer-to-peer / NCCL diagnostic")
    for col in ("host", "verdict", "GPUs", "NCCL transport (P2P on / off)", "sglang_p2p", "reason"):
        table.add_column(col)
    for host, r in sorted(report.results.items()):
        tests = r.get("tests") or {}
        on = (tests.get("nccl_allreduce_p2p") or {}).get("transports") or []
        off = (tests.get("nccl_allreduce_p2p_disabled") or {}).get("transports") or []
        colour = "green" if r.get("verdict") == "healthy" else "red"
        table.add_row(
            host,
            f"[{colour}]{escape(str(r.get('verdict')))}[/]",
            str(r.get("gpu_count", "")),
            escape(f"{','.join(on) or '-'} / {','.join(off) or '-'}"),
            str(r.get("recommended_sglang_p2p") or "-"),
            escape(str(r.get("reason", ""))),
        )
    console.print(table)
    for failure in report.run.failures if report.run else []:
        console.print(f"[red]FAILED[/] {escape(failure['host'] + ': ' + failure['message'])}")
    if report.run:
        console.print(f"record: {escape(report.run.record_dir)}")


def print_bench(console: Console, result: BenchResult) -> None:
    """Per host a table per level, the capacity, levels above the server's limit, problems, regressions."""
    for host, hb in sorted(result.hosts.items()):
        table = Table(title=f"bench {host}")
        for col in ("C", "output tok/s", "total tok/s", "req/s", "TTFT p50/p99 ms", "ITL p50/p99 ms", "done/sent"):
            table.add_column(col, justify="right")
        for lv in hb.levels:
            done = f"{lv.completed}/{lv.sent}" + (f" [red]{lv.failed} FAILED[/]" if lv.failed else "")
            table.add_row(
                str(lv.concurrency),
                f"{lv.output_throughput:,.1f}",
                f"{lv.total_throughput:,.1f}",
                f"{lv.request_throughput:,.2f}",
                f"{format_ms(lv.median_ttft_ms)} / {format_ms(lv.p99_ttft_ms)}",
                f"{format_ms(lv.median_itl_ms)} / {format_ms(lv.p99_itl_ms)}",
                done,
            )
        for c in hb.missing:
            table.add_row(str(c), "-", "-", "-", "-", "-", f"[red]0/{hb.sent_per_level.get(c, 0)}: all failed[/]")
        console.print(table)
        if hb.capacity:
            console.print(f"capacity: {escape(hb.capacity)}", highlight=False)
        if hb.above_limit:
            levels = ", ".join(f"C={c}" for c in hb.above_limit)
            console.print(
                f"[yellow]above max_running_requests={hb.max_running_requests}[/]: {levels} "
                "(the excess requests queue)",
                highlight=False,
            )
        for problem in hb.problems:
            console.print(f"[red]problem[/] {escape(problem)}", highlight=False)
        for regression in hb.regressions:
            console.print(f"[red]REGRESSION[/] {escape(regression.describe())}", highlight=False)
        if hb.report:
            console.print(f"report: {escape(hb.report)}", highlight=False)
    for failure in result.run.failures if result.run else []:
        console.print(f"[red]FAILED[/] {escape(failure['host'] + ': ' + failure['message'])}")
    console.print(f"record: {escape(result.record_dir)}", highlight=False)


def print_warnings(console: Console, warnings: list[str]) -> None:
    """The inventory's warnings (a secret in plain text, TLS not verified), before anything runs."""
    for warning in warnings:
        console.print(f"warning: {warning}", highlight=False, markup=False)


def print_inventory_check(console: Console, inv: Any) -> None:
    console.print(
        f"{inv.path}: ok ({len(inv.proxmox_hosts)} proxmox_hosts, {len(inv.gpu_containers)} gpu_containers)",
        highlight=False,
    )


def print_lab_status(console: Console, status: dict[str, Any]) -> None:
    console.print_json(json.dumps(status))
