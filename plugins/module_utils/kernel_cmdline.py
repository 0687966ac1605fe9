"""Pure kernel command line merging and GRUB default-file editing, shared by the kernel_cmdline module and
provision's tests.

A command line is a list of arguments separated by whitespace; a value may be double-quoted
and then contain spaces (`dyndbg="file x.c +p"`). The key of `a.b=c` is `a.b`; a bare flag is
its own key. Merging keeps every argument it was not asked to change, in its place:

- an argument to add whose key is already present replaces that value in place (the first
  occurrence; later duplicates of the key are dropped, since the last one would win);
- one that is absent is appended, in the order given;
- an argument to remove given as `key=value` removes exactly that; given as `key`, every
  argument with that key;
- keys that legitimately repeat (console=) are appended, never replaced;
- arguments compare as the kernel reads them (`canonical`), and an argument with whitespace in its
  value is written with the value quoted (`written`), so it stays one argument and converges.

merge(merge(x)) == merge(x) for the same add/remove lists.
"""

from __future__ import annotations

import re

MULTI_VALUE_KEYS = frozenset({"console"})
INVALID_ARGUMENTS = {
    "amd_iommu=on": (
        "amd_iommu=on is not a valid option: the kernel logs \"AMD-Vi: Unknown option - 'on'\" and ignores it "
        "(the AMD IOMMU is on by default when the firmware has an IVRS table); it is kept because the inventory "
        "asks for it"
    ),
}


def split(line: str) -> list[str]:
    """Split a command line into arguments, keeping double-quoted values (and their quotes) intact."""
    args: list[str] = []
    current: list[str] = []
    quoted = False
    for ch in line.strip():
        if ch == '"':
            quoted = not quoted
            current.append(ch)
        elif ch.isspace() and not quoted:
            if current:
                args.append("".join(current))
                current = []
        else:
            current.append(ch)
    if current:
        args.append("".join(current))
    return args


def key(arg: str) -> str:
    """`a.b` of `a.b=c`, `"a.b=c d"` and `a.b="c d"` alike; a bare flag is its own key."""
    return canonical(arg).split("=", 1)[0]


def written(arg: str) -> str:
    """An argument as it is written into the boot configuration: whitespace in its value quoted around the value
    (`dyndbg="module iommu +p"`, however the inventory wrote it: unquoted as one list item, or quoted whole), so
    that it stays one argument in the file, in grub.cfg and on the kernel's command line."""
    plain = canonical(arg)
    if not any(ch.isspace() for ch in plain):
        return plain
    k, sep, value = plain.partition("=")
    return f'{k}="{value}"' if sep else f'"{plain}"'


def _same(arg: str, wanted: str) -> bool:
    return canonical(arg) == canonical(wanted)


def merge(current: str, add: list[str], remove: list[str]) -> dict:
    """Return {'line', 'added', 'replaced', 'removed', 'warnings', 'changed'}."""
    add = [written(a) for a in add]
    args, removed = _without(split(current), remove)
    added: list[str] = []
    replaced: list[str] = []
    for wanted in add:
        _add(args, wanted, added, replaced, removed)
    warnings = [INVALID_ARGUMENTS[a] for a in add if a in INVALID_ARGUMENTS]
    line = " ".join(args)
    return {
        "line": line,
        "added": added,
        "replaced": replaced,
        "removed": removed,
        "warnings": warnings,
        "changed": split(line) != split(current),
    }


def _without(args: list[str], remove: list[str]) -> tuple[list[str], list[str]]:
    """(args kept, args removed): `key=value` removes exactly that argument, a bare `key` every one with that key."""
    removed: list[str] = []
    for target in remove:
        kept = []
        for arg in args:
            if _same(arg, target) or ("=" not in target and key(arg) == key(target)):
                removed.append(arg)
            else:
                kept.append(arg)
        args = kept
    return args, removed


def _add(args: list[str], wanted: str, added: list[str], replaced: list[str], removed: list[str]) -> None:
    """Put one wanted argument into args (in place), noting what it did: nothing when it is there; appended when its
    key is new, repeats (console=) or is a bare flag; else the key's first value replaced and its later ones
    dropped."""
    if any(_same(arg, wanted) for arg in args):
        return
    k = key(wanted)
    repeats = k in MULTI_VALUE_KEYS or "=" not in wanted
    positions = [] if repeats else [i for i, arg in enumerate(args) if key(arg) == k]
    if not positions:
        args.append(wanted)
        added.append(wanted)
        return
    replaced.append(f"{args[positions[0]]} -> {wanted}")
    args[positions[0]] = wanted
    for i in reversed(positions[1:]):
        removed.append(args.pop(i))


def canonical(arg: str) -> str:
    """An argument as the kernel reads it: `"a=b c"` and `a="b c"` are the same (GRUB re-quotes whole words)."""
    if len(arg) >= 2 and arg[0] == '"' and arg[-1] == '"':
        arg = arg[1:-1]
    k, sep, value = arg.partition("=")
    if sep and len(value) >= 2 and value[0] == '"' and value[-1] == '"':
        value = value[1:-1]
    return k + sep + value


def arguments(line: str) -> list[str]:
    """A command line's arguments as the kernel reads them (`canonical`), in order."""
    return [canonical(a) for a in split(line)]


def missing(running: str, add: list[str], remove: list[str]) -> dict:
    """What a running kernel's /proc/cmdline lacks: wanted args absent, removed args still present. Compared as
    the kernel reads them, so an argument with quoted whitespace is there however GRUB quoted it
    (`"dyndbg=a b"` by GRUB 2.06, `dyndbg="a b"` as written): a node that booted the line is not rebooted again."""
    args = arguments(running)
    absent = [a for a in add if canonical(a) not in args]
    present = [a for a in args for r in remove if a == canonical(r) or ("=" not in r and key(a) == key(r))]
    return {"absent": absent, "still_present": present, "ok": not absent and not present}


# ------------------------------------------------------------------ GRUB default files (/etc/default/grub, grub.d)
# They are shell: update-grub sources them. An assignment may share its line with other statements
# (`GRUB_TIMEOUT=5; GRUB_CMDLINE_LINUX_DEFAULT="quiet"`) or a comment; an edit replaces the value's shell word
# and nothing else.
# a reserved word that opens a statement list may come first: `if ...; then X=1; fi`, `{ X=1; }`
_ASSIGNMENT = re.compile(r"\s*(?:(?:then|do|else|\{)\s+)*(?:export\s+)?([A-Za-z_][A-Za-z0-9_]*)=")
_WORD_BREAK = ";&|<>()"


def _word_end(line: str, i: int) -> int | None:
    """Where the shell word starting at i ends (quotes and backslashes followed); None when a quote stays open
    at the end of the line (the value goes on to the next one)."""
    while i < len(line):
        ch = line[i]
        if ch == "'":
            close = line.find("'", i + 1)
            if close < 0:
                return None
            i = close + 1
        elif ch == '"':
            i += 1
            while i < len(line) and line[i] != '"':
                i += 2 if line[i] == "\\" else 1
            if i >= len(line):
                return None
            i += 1
        elif ch == "\\":
            i += 2
        elif ch.isspace() or ch in _WORD_BREAK:
            return i
        else:
            i += 1
    return len(line)


def _next_statement(line: str, i: int) -> int:
    """Where the statement after the one at i starts (past `;`, `&&`, `||`, `|`, `&`), or the end of the line (a
    comment, or nothing more)."""
    word_start = True
    while i < len(line):
        ch = line[i]
        if ch.isspace():
            i, word_start = i + 1, True
        elif ch == "#" and word_start:
            return len(line)
        elif ch in ";&|":
            while i < len(line) and line[i] in ";&|":
                i += 1
            return i
        else:
            end = _word_end(line, i)
            if end is None:
                return len(line)
            i, word_start = max(end, i + 1), False
    return len(line)


def assignments(text: str, var: str) -> list[tuple[int, int, int | None]]:
    """(line index, start, end) of the value word of each assignment of var, in order: at the start of a statement
    (a line, or after `;`, `&&`, `||`, `then`, `do`, `else`, `{`), `export` allowed, never inside a comment or a
    quoted string. `end` is None for a value whose quote is not closed on its line (it goes on: no plain literal
    to edit)."""
    found: list[tuple[int, int, int | None]] = []
    for index, line in enumerate(text.split("\n")):
        i = 0
        while i < len(line):
            m = _ASSIGNMENT.match(line, i)
            if not m:
                i = _next_statement(line, i)
                continue
            end = _word_end(line, m.end())
            if m.group(1) == var:
                found.append((index, m.end(), end))
            if end is None:
                break
            i = end  # `A=1 B=2`: the next word may be another assignment of the same statement
    return found


def assigned_word(text: str, where: tuple[int, int, int | None]) -> str | None:
    """The value word an assignment (from assignments) wrote; None when it goes on past its line."""
    index, start, end = where
    return None if end is None else text.split("\n")[index][start:end]


def literal_value(raw: str) -> str | None:
    """The string a shell word holds when it is a plain literal ('...', "..." without $, ` or \\, plain
    characters, or a mix of them); None when the shell would expand something ($var, $(...), `...`, \\)."""
    value, i = [], 0
    while i < len(raw):
        ch = raw[i]
        if ch == "'":
            close = raw.find("'", i + 1)
            if close < 0:
                return None
            value.append(raw[i + 1 : close])
            i = close + 1
        elif ch == '"':
            close = raw.find('"', i + 1)
            inner = raw[i + 1 : close] if close >= 0 else None
            if inner is None or any(c in inner for c in "$`\\"):
                return None
            value.append(inner)
            i = close + 1
        elif ch in "$`\\" or ch.isspace():
            return None
        else:
            value.append(ch)
            i += 1
    return "".join(value)


def quote(value: str) -> str:
    """A shell word holding value: double quotes where nothing in it is special there, else single quotes."""
    if not any(c in value for c in '"$`\\'):
        return f'"{value}"'
    escaped = value.replace("'", "'\\''")
    return f"'{escaped}'"


def set_assignment(text: str, where: tuple[int, int, int | None], value: str) -> str:
    """text with the value word at `where` (from assignments) replaced by value, quoted; the rest of its line
    (other statements, a comment) and every other line as they were."""
    index, start, end = where
    lines = text.split("\n")
    lines[index] = lines[index][:start] + quote(value) + lines[index][end:]
    return "\n".join(lines)
