"""docs/reliability.md is the fault matrix of tests/faults.py: the same table, the same counts, and every row's
test exists."""

from __future__ import annotations

import os
import subprocess
import sys

from tests import faults
from tests.loaders import REPO

DOC = REPO / "docs" / "reliability.md"


def test_the_doc_holds_the_table_and_its_counts():
    text = DOC.read_text()
    table = faults.rows()
    assert faults.table(table) in text, "docs/reliability.md's table is not tests/faults.py's: render it again"
    for name, value in faults.counts(table).items():
        assert f"- {name}: **{value}**\n" in text, name
    for gap in faults.NOT_YET:
        assert f"- {gap}\n" in text


def test_the_matrix_has_at_least_25_rows_each_its_own_test():
    tests = [row.test for row in faults.rows()]
    assert len(tests) >= 25 and len(set(tests)) == len(tests)


def test_every_row_names_a_test_that_exists():
    table = faults.rows()
    files = sorted({row.test.split("::")[0] for row in table})
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", *files],
        cwd=REPO,
        capture_output=True,
        text=True,
        env={k: v for k, v in os.environ.items() if k != "PYTEST_ADDOPTS"},
    )
    collected = {line.strip() for line in proc.stdout.splitlines() if "::" in line}
    missing = [row.test for row in table if row.test not in collected]
    assert missing == [], proc.stdout[-2000:] + proc.stderr[-2000:]
