"""What a kept run handed back, read from the run record's artifacts (`runner.run_playbook` copies
ansible-runner's `job_events/` there).

- `run_stats`: the data the playbook's `ansible.builtin.set_stats` tasks handed over (`diag`'s verdicts,
  `verify`'s readings), keyed by what the playbook names it, never by a task's name.
- `task_outcomes`: how one named task ended on each host, for provision/locks.py alone, which says why it keys
  on task names: a raw command that started and never answered has no result, only its task's name.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def _events(record_dir: Path) -> list[dict[str, Any]]:
    """The run's job events in runner's order (their counter, not their file names)."""
    events = []
    for path in (record_dir / "artifacts" / "run" / "job_events").glob("*.json"):
        try:
            events.append(json.loads(path.read_text()))
        except (OSError, ValueError):
            continue
    return sorted(events, key=lambda e: e.get("counter", 0))


def run_stats(record_dir: Path) -> dict[str, Any]:
    """The run's custom stats: what its set_stats tasks handed over (per_host: false, aggregated: a mapping per
    host merges across hosts), as ansible-playbook's last stats event carries it. {} when the playbook never got
    to its stats (it was stopped) or handed nothing over."""
    stats = [e for e in _events(record_dir) if e.get("event") == "playbook_on_stats"]
    data = (stats[-1].get("event_data") or {}).get("artifact_data") if stats else None
    return data if isinstance(data, dict) else {}


def task_outcomes(record_dir: Path, task: str, started: bool = False) -> dict[str, dict[str, Any]]:
    """Per host, how the named task ended:
    {"event": "runner_on_ok" | "runner_on_failed" | "runner_on_unreachable" | ..., "res": {...}}.
    A retried task's last outcome wins. With `started`, a task that started and never ended (an interrupted run)
    is there too, as {"event": "runner_on_start", "res": {}}."""
    found = {}
    for event in _events(record_dir):
        data = event.get("event_data") or {}
        kind = event.get("event", "")
        ended = kind.startswith("runner_on_") and kind not in ("runner_on_start", "runner_on_async_poll")
        if (ended or (started and kind == "runner_on_start")) and data.get("task") == task and data.get("host"):
            found[data["host"]] = {"event": kind, "res": data.get("res") or {}}
    return found
