"""Pure kernel command line merging, shared by the kernel_cmdline module and provision's tests.

A command line is a list of arguments separated by whitespace; a value may be double-quoted
and then contain spaces (`dyndbg="file x.c +p"`). The key of `a.b=c` is `a.b`; a bare flag is
its own key. Merging keeps every argument it was not asked to change, in its place:

- an argument to add whose key is already present replaces that value in place (the first
  occurrence; later duplicates of the key are dropped, since the last one would win);
- one that is absent is appended, in the order given;
- an argument to remove given as `key=value` removes exactly that; given as `key`, every
  argument with that key;
- keys that legitimately repeat (console=) are appended, never replaced.

merge(merge(x)) == merge(x) for the same add/remove lists.
"""

from __future__ import annotations

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
    return arg.split("=", 1)[0]


def merge(current: str, add: list[str], remove: list[str]) -> dict:
    """Return {'line', 'added', 'replaced', 'removed', 'warnings', 'changed'}."""
    args = split(current)
    removed: list[str] = []
    for target in remove:
        kept = []
        for arg in args:
            if arg == target or ("=" not in target and key(arg) == target):
                removed.append(arg)
            else:
                kept.append(arg)
        args = kept
    added: list[str] = []
    replaced: list[str] = []
    for wanted in add:
        k = key(wanted)
        if wanted in args:
            continue
        if k in MULTI_VALUE_KEYS or "=" not in wanted:
            args.append(wanted)
            added.append(wanted)
            continue
        positions = [i for i, arg in enumerate(args) if key(arg) == k]
        if not positions:
            args.append(wanted)
            added.append(wanted)
            continue
        replaced.append(f"{args[positions[0]]} -> {wanted}")
        args[positions[0]] = wanted
        for i in reversed(positions[1:]):
            removed.append(args.pop(i))
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


def canonical(arg: str) -> str:
    """An argument as the kernel reads it: `"a=b c"` and `a="b c"` are the same (GRUB re-quotes whole words)."""
    if len(arg) >= 2 and arg[0] == '"' and arg[-1] == '"':
        arg = arg[1:-1]
    k, sep, value = arg.partition("=")
    if sep and len(value) >= 2 and value[0] == '"' and value[-1] == '"':
        value = value[1:-1]
    return k + sep + value


def missing(running: str, add: list[str], remove: list[str]) -> dict:
    """What a running kernel's /proc/cmdline lacks: wanted args absent, removed args still present."""
    args = [canonical(a) for a in split(running)]
    absent = [a for a in add if canonical(a) not in args]
    present = [a for a in args for r in remove if a == canonical(r) or ("=" not in r and key(a) == r)]
    return {"absent": absent, "still_present": present, "ok": not absent and not present}
