"""What the Markdown pages say, measured: sentence lengths of their prose, their relative links, and the
patterns of a work diary that the docs and the source must not carry.

    python -m tests.prose                 # words per sentence for README.md and docs/*.md, page by page
    python -m tests.prose FILE.md ...     # the same for the files named, with their longest sentences

Prose is what a reader reads as sentences: paragraphs and list items. Code blocks, tables, headings and
HTML comments are left out. A sentence ends at `.`, `!` or `?` before a space or the line's end, unless the
word it ends is an abbreviation (`e.g.`, `i.e.`, `etc.`, `vs.`) or a number's point. Inline code counts as one
word. tests/unit/docs/test_docs.py holds the pages to the limits below.
"""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MEAN_LIMIT = 22  # README.md and docs/*.md together, words per sentence
LONGEST_FIRST_READ = 40  # no sentence longer in what a user reads first (FIRST_READ)
FIRST_READ = ("README.md", "docs/README.md", "docs/real-host.md", "docs/troubleshooting.md")

ABBREVIATIONS = ("e.g.", "i.e.", "etc.", "vs.", "cf.", "approx.", "no.")
_CODE_SPAN = re.compile(r"`[^`\n]+`")
_LINK = re.compile(r"\[([^\]]*)\]\([^)]*\)")
_END = re.compile(r"(?<=[.!?])[\"')\]]*\s+")


@dataclass(frozen=True)
class Sentence:
    page: str
    line: int
    text: str

    @property
    def words(self) -> int:
        return len(self.text.split())


def pages() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def _prose_blocks(text: str) -> list[tuple[int, str]]:
    """(first line number, text) of each paragraph or list item, outside code fences, tables and comments."""
    blocks: list[tuple[int, str]] = []
    current: list[str] = []
    start = 0
    fenced = commented = False

    def flush() -> None:
        if current:
            blocks.append((start, " ".join(current)))
            current.clear()

    for n, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if line.startswith(("```", "~~~")):
            fenced = not fenced
            flush()
            continue
        if "<!--" in line:
            commented = "-->" not in line
            flush()
            continue
        if commented:
            commented = "-->" not in line
            continue
        if fenced or not line or line.startswith(("|", "#", "<")):
            flush()
            continue
        item = re.match(r"^([-*+]|\d+\.)\s+", line)
        if item:
            flush()
            line = line[item.end() :]
        if not current:
            start = n
        current.append(line)
    flush()
    return blocks


def _split(text: str) -> list[str]:
    text = _LINK.sub(r"\1", _CODE_SPAN.sub("CODE", text))
    parts, sentence = [], ""
    for piece in _END.split(text):
        sentence = f"{sentence} {piece}".strip()
        last = sentence.split()[-1].lower().lstrip("([\"'") if sentence.split() else ""
        if last in ABBREVIATIONS or re.fullmatch(r"\d+\.", last):
            continue
        parts.append(sentence)
        sentence = ""
    if sentence:
        parts.append(sentence)
    return [p for p in parts if re.search(r"[A-Za-z]", p)]


def sentences(path: Path) -> list[Sentence]:
    page = str(path.relative_to(ROOT))
    return [Sentence(page, n, s) for n, block in _prose_blocks(path.read_text()) for s in _split(block)]


def mean(found: list[Sentence]) -> float:
    return sum(s.words for s in found) / len(found) if found else 0.0


# Relative links: [text](target) and [text]: target, outside code
_MD_LINK = re.compile(r"\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)|^\[[^\]]+\]:\s*(\S+)", re.MULTILINE)


def relative_links(path: Path) -> list[tuple[int, str]]:
    """(line, target) of each link to a file of this repository or a heading of this page (not a URL)."""
    text = re.sub(r"```.*?```", lambda m: "\n" * m.group(0).count("\n"), path.read_text(), flags=re.DOTALL)
    text = _CODE_SPAN.sub("", text)
    found = []
    for m in _MD_LINK.finditer(text):
        target = m.group(1) or m.group(2)
        if re.match(r"^[a-z][a-z0-9+.-]*:", target):
            continue
        found.append((text.count("\n", 0, m.start()) + 1, target))
    return found


def anchors(path: Path) -> set[str]:
    """The anchors a Markdown page's headings get, as GitHub makes them."""
    found = set()
    for line in path.read_text().splitlines():
        if line.startswith("#"):
            title = _CODE_SPAN.sub(lambda m: m.group(0).strip("`"), line.lstrip("#").strip())
            found.add(re.sub(r"[^\w\- ]", "", title.lower()).replace(" ", "-"))
    return found


def dead_links(path: Path) -> list[str]:
    """Each relative link to a file that does not exist, or to a heading its Markdown page does not have."""
    dead = []
    for line, target in relative_links(path):
        file, _, anchor = target.partition("#")
        where = (path.parent / file) if file else path
        if not where.exists() or (anchor and where.suffix == ".md" and anchor not in anchors(where)):
            dead.append(f"{path.relative_to(ROOT)}:{line}: {target}")
    return dead


# A work diary in docs or source: numbered work periods and stops, this project's own issue numbers; in the docs, also
# scratch paths under /tmp/ (the tests' own commands may use a container's /tmp).
# A citation of another project's issue names that project, as owner/repo or as a project of PROJECTS before the word
# issue or PR, and is taken out of the line before the bare patterns are looked for.
PROJECTS = (
    r"sglang|triton|ansible(?:-core)?|ansible-runner|pve-[\w-]+|proxmox[\w-]*|nccl|pytorch|linux|systemd|openssh"
    r"|kubespray|molecule|testinfra|mitogen|nvidia[\w-]*|qemu|debian"
)
CITATION = re.compile(
    rf"[\w.-]+/[\w.-]+(?: (?:issue|PR|pull request|bug)s?)? ?#\d+"
    rf"|\b(?:{PROJECTS}) (?:issue|PR|pull request|bug)s? #?\d+",
    re.IGNORECASE,
)
DIARY = re.compile(
    r"\bsession \d+|\bwork period|\bstops? \d+\b(?! (?:of|and|more|seconds?)\b)|\bissue #?\d+"
    r"|(?<![\w/&])#\d{1,4}\b(?![\w-])",
    re.IGNORECASE,
)


SCRATCH = re.compile(r"/tmp/")


def diary_lines(path: Path) -> list[str]:
    found = []
    for n, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
        if DIARY.search(CITATION.sub("", line)) or (path.suffix == ".md" and SCRATCH.search(line)):
            found.append(f"{path.relative_to(ROOT)}:{n}: {line.strip()[:160]}")
    return found


def _report(paths: list[Path], longest: int) -> None:
    everything = []
    for path in paths:
        found = sentences(path)
        everything += found
        print(f"{mean(found):5.1f} words/sentence {len(found):5d} sentences  {path.relative_to(ROOT)}")
        for s in sorted(found, key=lambda s: -s.words)[:longest]:
            print(f"      {s.words:3d} words, line {s.line}: {s.text[:140]}")
    over = sum(s.words > LONGEST_FIRST_READ for s in everything)
    total = f"{mean(everything):5.1f} words/sentence {len(everything):5d} sentences"
    print(f"{total}  all; {over} over {LONGEST_FIRST_READ}")


if __name__ == "__main__":
    named = [Path(a).resolve() for a in sys.argv[1:]]
    _report(named or pages(), 3 if named else 0)
