"""What Ansible's loader tells about a value it loaded: where it came from, whether it came out of a vault, whether it
is a template; and Ansible's warnings, collected instead of printed. Read by the inventory's checks and by the
secret scrubber alike."""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterator
from typing import Any


def origin(value: Any) -> str | None:
    """`file:line` that ansible-core 2.19+ tags on every value it loaded; None where unknown."""
    # ansible-core has no public API for a value's origin: its data tags are internal (ansible._internal._datatag)
    try:
        from ansible._internal._datatag._tags import Origin
    except ImportError:  # older ansible-core: no origins
        return None
    tag = value if isinstance(value, Origin) else Origin.get_tag(value)
    if tag is None or not tag.path:
        return None
    return f"{tag.path}:{tag.line_num}" if tag.line_num else tag.path


@contextlib.contextmanager
def captured_warnings() -> Iterator[list[tuple[str, BaseException | None]]]:
    """Ansible reports each plugin's parse failure as a warning on stderr; collect them instead."""
    from ansible.utils.display import Display

    caught: list[tuple[str, BaseException | None]] = []
    saved = Display.warning, Display.error_as_warning, Display.deprecated
    Display.warning = lambda self, msg, *a, **k: caught.append((str(msg), None))
    Display.error_as_warning = lambda self, msg, exception, **k: caught.append((str(msg), exception))
    Display.deprecated = lambda self, *a, **k: None  # e.g. "could not be decoded as utf-8": its failure says it
    try:
        yield caught
    finally:
        Display.warning, Display.error_as_warning, Display.deprecated = saved


def is_template(value: Any) -> bool:
    return isinstance(value, str) and ("{{" in value or "{%" in value)


@functools.cache
def _vaulted_file(path: str) -> bool:
    try:
        with open(path, "rb") as handle:
            return handle.read(14) == b"$ANSIBLE_VAULT"
    except OSError:
        return False


def from_vault(value: Any) -> bool:
    """An inline `!vault` value, or any value read from a whole-file vaulted vars file."""
    if type(value).__name__ == "EncryptedString":
        return True
    where = origin(value)
    return where is not None and _vaulted_file(where.rsplit(":", 1)[0] if where.count(":") else where)
