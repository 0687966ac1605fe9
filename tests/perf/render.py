"""docs/performance.md's current figures, rendered from the harness's JSON (tests/perf/harness.py --json):
docs/performance-lab.json (the VM lab) and docs/performance-fleet.json (the fleet).

    .venv/bin/python -m tests.perf.render     # rewrites the block between the markers in docs/performance.md

The block holds the harness's own tables (harness.as_table, harness.fleet_table) and the targets they are held to.
tests/unit/docs/test_performance_doc.py fails while the page's block differs from what this renders.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tests.perf.harness import as_table, fleet_table

REPO = Path(__file__).resolve().parents[2]
DOC = REPO / "docs" / "performance.md"
LAB_JSON = REPO / "docs" / "performance-lab.json"
FLEET_JSON = REPO / "docs" / "performance-fleet.json"
BEGIN = "<!-- performance-table:begin -->"
END = "<!-- performance-table:end -->"
COMMAND = ".venv/bin/python -m tests.perf.render"
NOTE = f"<!-- rendered from performance-lab.json and performance-fleet.json by `{COMMAND}`: do not edit by hand -->"
FLOOR_TIMES = 3.0  # a no-op apply, and verify, take at most this many times the floor
GROWTH = 1.5  # from the fewest containers to the most, a no-op apply and verify grow at most this much
STOCK_TIMES = 3.0  # stock ansible-playbook settings take at least this many times provision's time


def run_date(path: Path, data: dict) -> str:
    """The day the harness run started (its `date`); for a file written before the harness recorded one, the day of
    the file's last commit."""
    if data.get("date"):
        return str(data["date"])
    proc = subprocess.run(
        ["git", "log", "-1", "--format=%cs", "--", path.name],
        cwd=path.parent,
        capture_output=True,
        text=True,
        stdin=subprocess.DEVNULL,
    )
    return proc.stdout.strip() or "an unrecorded day"


def _row(target: str, figure: str, met: bool) -> str:
    return f"| {target} | {figure} | {'yes' if met else 'no'} |"


def floor_rows(lab: dict) -> list[str]:
    s = lab["seconds"]
    return [
        _row(
            f"{what} ≤ {FLOOR_TIMES:g}× the floor",
            f"{lab['ratios'][key + '/floor']}× ({s[key]} s against {s['floor']} s)",
            lab["ratios"][key + "/floor"] <= FLOOR_TIMES,
        )
        for key, what in (("apply_noop", "no-op apply"), ("verify", "verify"))
    ]


def growth_rows(fleet: dict) -> list[str]:
    first, last = fleet["points"][0], fleet["points"][-1]
    span = f"{first['containers']} to {last['containers']} containers"
    return [
        _row(
            f"{what} grows ≤ {GROWTH:g}× from {span}",
            f"{fleet['growth'][key]}× ({first[key]} → {last[key]} s)",
            fleet["growth"][key] <= GROWTH,
        )
        for key, what in (("apply_noop_s", "no-op apply"), ("verify_s", "verify"))
    ]


def stock_rows(lab: dict) -> list[str]:
    s, r = lab["seconds"], lab["ratios"]
    readings = (
        ("every phase's tasks run in both", "stock_full_noop", "full_noop"),
        ("both skip the converged phases", "stock_noop", "apply_noop"),
        ("stock runs every task, provision skips", "stock_full_noop", "apply_noop"),
    )
    return [
        _row(
            f"stock settings take ≥ {STOCK_TIMES:g}× provision's time: {how}",
            f"{r[f'{stock}/{ours}']}× ({s[stock]} s against {s[ours]} s)",
            r[f"{stock}/{ours}"] >= STOCK_TIMES,
        )
        for how, stock, ours in readings
    ]


def targets_table(lab: dict, fleet: dict) -> str:
    lines = ["| target | measured | met |", "|---|---|---|"]
    return "\n".join([*lines, *floor_rows(lab), *growth_rows(fleet), *stock_rows(lab)])


def block(lab_path: Path = LAB_JSON, fleet_path: Path = FLEET_JSON) -> str:
    """What the page holds between its markers, markers included."""
    lab, fleet = json.loads(lab_path.read_text()), json.loads(fleet_path.read_text())
    median = f", median of {fleet['repeat']}" if "repeat" in fleet else ""
    return "\n".join(
        [
            BEGIN,
            NOTE,
            "",
            f"VM lab, run of {run_date(lab_path, lab)} ([`performance-lab.json`](performance-lab.json)):",
            "",
            as_table(lab),
            "",
            f"Fleet, run of {run_date(fleet_path, fleet)} ([`performance-fleet.json`](performance-fleet.json)), "
            f"tags `{fleet['tags']}`{median}:",
            "",
            fleet_table(fleet),
            "",
            "Targets, held against these two runs:",
            "",
            targets_table(lab, fleet),
            "",
            END,
        ]
    )


def current(text: str) -> str:
    """The block between the page's markers, markers included ('' where the page has none)."""
    start, end = text.find(BEGIN), text.find(END)
    return text[start : end + len(END)] if 0 <= start < end else ""


def rewrite(doc: Path = DOC) -> None:
    """Put the rendered block in place of the one `doc` holds; the rest of the page stays."""
    text = doc.read_text()
    found = current(text)
    if not found:
        raise SystemExit(f"{doc}: no {BEGIN} ... {END} block to rewrite")
    doc.write_text(text.replace(found, block(), 1))


if __name__ == "__main__":
    rewrite(Path(sys.argv[1]) if len(sys.argv) > 1 else DOC)
