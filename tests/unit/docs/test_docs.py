"""The Markdown pages hold to what they promise: troubleshooting's messages are the code's own, every relative link
resolves, no page or source file reads like a work diary, every page is in the docs index, and the prose keeps
short sentences (tests/prose.py measures them)."""

from __future__ import annotations

import re
import subprocess

import pytest

from tests import prose

ROOT = prose.ROOT
SOURCES = ("provision", "plugins", "roles")
SOURCE_SUFFIXES = (".py", ".yml", ".yaml", ".j2", ".sh")


def _tracked(*paths: str) -> list:
    out = subprocess.run(["git", "ls-files", *paths], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    return [ROOT / p for p in out.split()]


def _code_text() -> str:
    """The source's text with its whitespace collapsed (YAML folds a message over lines)."""
    files = [p for p in _tracked(*SOURCES) if p.suffix in SOURCE_SUFFIXES or p.parent.name in ("bin", "sbin")]
    return " ".join(" ".join(p.read_text(errors="replace").split()) for p in files if p.is_file())


def _quoted_messages() -> list[tuple[str, str]]:
    """(entry, quoted text) of every code span on a `**You see:**` line of docs/troubleshooting.md."""
    found, entry, seeing = [], "", False
    for line in (ROOT / "docs" / "troubleshooting.md").read_text().splitlines():
        if line.startswith("### "):
            entry = line[4:]
        seeing = line.startswith("**You see:**") or (seeing and bool(line.strip()))
        if seeing:
            found += [(entry, span) for span in re.findall(r"`([^`]+)`", line)]
    return found


def test_every_message_troubleshooting_quotes_is_the_codes_own():
    code = _code_text()
    quoted = _quoted_messages()
    assert len({entry for entry, _ in quoted}) >= 12
    missing = [
        f"{entry}: {fragment!r}"
        for entry, span in quoted
        for fragment in (part.strip() for part in span.split("…"))
        if len(fragment) >= 8 and " ".join(fragment.split()) not in code
    ]
    said = "messages quoted in docs/troubleshooting.md that the code no longer says:\n"
    assert not missing, said + "\n".join(missing)


def _pages() -> list:
    return [*prose.pages(), *sorted(ROOT.glob("roles/*/README.md"))]


def test_no_relative_link_is_dead():
    dead = [line for page in _pages() for line in prose.dead_links(page)]
    assert not dead, "links to files that do not exist:\n" + "\n".join(dead)


def test_no_page_or_source_file_reads_like_a_work_diary():
    files = [
        p
        for p in _tracked("README.md", "docs", "roles", "provision", "plugins", "playbooks", "tests", "inventory")
        if p.suffix in (".md", ".py", ".yml", ".yaml", ".j2", ".sh", ".cfg") and p.is_file()
    ]
    files = [p for p in files if p != ROOT / "tests" / "prose.py"]  # it spells the patterns out
    found = [line for path in files for line in prose.diary_lines(path)]
    assert not found, "history belongs in CHANGELOG.md and git, not here:\n" + "\n".join(found)


def test_the_docs_index_names_every_page():
    index = (ROOT / "docs" / "README.md").read_text()
    pages = sorted(p.name for p in (ROOT / "docs").glob("*.md") if p.name != "README.md")
    assert [p for p in pages if f"({p})" not in index] == []


def test_the_prose_keeps_short_sentences():
    found = [s for page in prose.pages() for s in prose.sentences(page)]
    assert prose.mean(found) <= prose.MEAN_LIMIT, f"{prose.mean(found):.1f} words a sentence: `python -m tests.prose`"
    first = [s for s in found if s.page in prose.FIRST_READ and s.words > prose.LONGEST_FIRST_READ]
    assert not first, "\n".join(f"{s.page}:{s.line}: {s.words} words: {s.text[:100]}" for s in first)


@pytest.mark.parametrize("page", prose.FIRST_READ)
def test_the_pages_read_first_exist(page):
    assert (ROOT / page).is_file()


def _inventory_table() -> dict[str, str]:
    """name -> type cell of the table under docs/reference.md's `## Inventory`."""
    text = (ROOT / "docs" / "reference.md").read_text().split("## Inventory\n", 1)[1].split("\n## ", 1)[0]
    rows = [line.split("|")[1:-1] for line in text.splitlines() if line.startswith("| `")]
    return {cells[0].strip().strip("`"): cells[2].strip() for cells in rows if len(cells) >= 4}


def test_the_inventory_tables_types_are_the_argument_specs():
    """Every variable the table lists that a role declares has the type its argument spec gives it."""
    from provision import arg_specs

    declared = {
        name: spec.get("type", "str") for options in arg_specs.role_options().values() for name, spec in options.items()
    }
    table = _inventory_table()
    assert len(table) >= 15
    wrong = {name: (cell, declared[name]) for name, cell in table.items() if cell != declared.get(name, cell)}
    assert wrong == {}, "type in docs/reference.md, type in the argument spec"
    assert "sglang_model_path" in table and "proxmox_api_password" in table
