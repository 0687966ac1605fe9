"""docs/performance.md's current figures are the harness's JSON (docs/performance-lab.json,
docs/performance-fleet.json) as tests/perf/render.py renders them: a figure edited by hand fails here."""

from __future__ import annotations

import json

from tests.perf import render

RERENDER = f"docs/performance.md's figures are not what the harness's JSON renders: run `{render.COMMAND}`"


def test_the_page_holds_the_figures_its_json_renders():
    text = render.DOC.read_text()
    assert text.count(render.BEGIN) == 1 and text.count(render.END) == 1, RERENDER
    assert render.current(text) == render.block(), RERENDER


def test_rendering_replaces_the_block_and_keeps_the_rest_of_the_page(tmp_path):
    page = tmp_path / "performance.md"
    stale = render.block().replace("| 5.58 |", "| 4.58 |", 1)
    page.write_text(f"# Before\n\n{stale}\n\nAfter.\n")
    render.rewrite(page)
    assert page.read_text() == f"# Before\n\n{render.block()}\n\nAfter.\n"


def test_a_run_dated_by_the_harness_shows_its_date(tmp_path):
    lab, fleet = tmp_path / "lab.json", tmp_path / "fleet.json"
    lab.write_text(json.dumps({**json.loads(render.LAB_JSON.read_text()), "date": "2030-01-02"}))
    fleet.write_text(json.dumps({**json.loads(render.FLEET_JSON.read_text()), "date": "2030-01-03", "repeat": 2}))
    text = render.block(lab, fleet)
    assert "VM lab, run of 2030-01-02 " in text and "Fleet, run of 2030-01-03 " in text and "median of 2:" in text


def test_a_target_missed_reads_no():
    lab = json.loads(render.LAB_JSON.read_text())
    lab["ratios"]["apply_noop/floor"] = render.FLOOR_TIMES + 0.1
    assert render.floor_rows(lab)[0].endswith("| no |")
