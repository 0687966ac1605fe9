"""The JSON records provision keeps on a host (service record, diagnostic verdict, ...): read one, or None; and the JSON
object a command run through `ansible.builtin.raw` printed; write one whole."""

from __future__ import annotations

import json
import os


def write_json(path, value, **dump_args):
    """The record at `path`, whole or not at all: written beside it as `<path>.tmp`, synced, then renamed over it."""
    tmp = f"{path}.tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(value, f, **dump_args)
        f.write("\n")
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def read_json(path):
    """The record at `path`, or None when it is missing or not JSON (a record half-written by a crash)."""
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def last_json_line(text):
    """The JSON object on the last non-empty line of a command's output. A raw command's output (ansible.builtin.raw:
    no module runner between) starts with whatever the host's login shell printed first, a greeting from ~/.bashrc
    say, where Ansible's module runner skips what comes before a module's JSON. ValueError when there is none."""
    lines = [line for line in str(text).splitlines() if line.strip()]
    try:
        value = json.loads(lines[-1]) if lines else None
    except ValueError:
        value = None
    if not isinstance(value, dict):
        raise ValueError(f"no JSON object on the last line of the output: {str(text)[-200:]!r}")
    return value
