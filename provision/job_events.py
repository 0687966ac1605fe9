"""What the tasks of a kept run returned, read back from the run record's job events.

`runner.run_playbook` copies ansible-runner's `job_events/` into the record; commands whose
playbook computes a result on each host (`diag`, `verify`) read it back from there by task name.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def task_outcomes(record_dir: Path, task: str, started: bool = False) -> dict[str, dict[str, Any]]:
    """Per host, how the named task ended:
    {"event": "runner_on_ok" | "runner_on_failed" | "runner_on_unreachable" | ..., "res": {...}}.
    Events are taken in runner's order (their counter, not their file names), so a retried task's
    last outcome wins. With `started`, a task that started and never ended (an interrupted run) is
    there too, as {"event": "runner_on_start", "res": {}}."""
    events = []
    for path in (record_dir / "artifacts" / "run" / "job_events").glob("*.json"):
        try:
            event = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        data = event.get("event_data") or {}
        kind = event.get("event", "")
        ended = kind.startswith("runner_on_") and kind not in ("runner_on_start", "runner_on_async_poll")
        if (ended or (started and kind == "runner_on_start")) and data.get("task") == task and data.get("host"):
            events.append((event.get("counter", 0), data["host"], kind, data.get("res") or {}))
    return {host: {"event": kind, "res": res} for _, host, kind, res in sorted(events, key=lambda e: e[0])}
