"""The JSON records provision keeps on a host (service record, diagnostic verdict, ...): read one, or None."""

from __future__ import annotations

import json


def read_json(path):
    """The record at `path`, or None when it is missing or not JSON (a record half-written by a crash)."""
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except (OSError, ValueError):
        return None
