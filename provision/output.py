"""Where a command's output goes: stdout for the console or, with --json, for the one envelope alone.

With --json, whatever this process or its children write to descriptor 1 while the command runs (Ansible's lines
under ANSIBLE_DEBUG, a library's stray print) goes to stderr, and the envelope to the real stdout
(`envelope_stream`). A stdout that cannot be written (a closed pipe, a full disk, a closed descriptor) is a
`StdoutLost`, which the CLI words in one line (`lost`), never taken for a bug.
"""

from __future__ import annotations

import contextlib
import errno
import os
import sys
import threading
from collections.abc import Iterator
from typing import Any, Protocol


class Writer(Protocol):
    def write(self, text: str) -> Any: ...

    def flush(self) -> None: ...


class StdoutLost(Exception):
    """stdout cannot be written: its reader went away, or the file it names is full, failing or closed."""


class Stdout:
    """sys.stdout, looked up at each write (None where Python started with descriptor 1 closed); a failed write is
    a StdoutLost carrying the OSError."""

    def __getattr__(self, name: str) -> Any:
        return getattr(sys.stdout, name)

    def write(self, text: str) -> int:
        if sys.stdout is None:
            raise StdoutLost(OSError(errno.EBADF, "stdout is closed"))
        try:
            return sys.stdout.write(text)
        except OSError as exc:
            raise StdoutLost(exc) from exc

    def flush(self) -> None:
        try:
            if sys.stdout is not None:
                sys.stdout.flush()
        except OSError as exc:
            raise StdoutLost(exc) from exc


class _Descriptor:
    """Text written straight to a descriptor: nothing buffered that a failed write would leave to be written later."""

    def __init__(self, fd: int):
        self.fd = fd

    def write(self, text: str) -> None:
        data = text.encode()
        while data:
            data = data[os.write(self.fd, data) :]

    def flush(self) -> None:
        pass


@contextlib.contextmanager
def envelope_stream(want_json: bool) -> Iterator[Writer | None]:
    """With --json, the stream the envelope goes to, descriptor 1 pointing at stderr until the command ends; None
    without. In another thread, or where sys.stdout is not descriptor 1 (a caller's own stream) or descriptor 2 is
    closed, nothing is moved and the envelope goes to sys.stdout."""
    if not want_json:
        yield None
        return
    if threading.current_thread() is not threading.main_thread() or not _on_descriptor_1() or not _open(2):
        yield Stdout()
        return
    held = None
    try:
        _flush()
        held = os.dup(1)
        os.dup2(2, 1)
        yield _Descriptor(held)
    finally:
        if held is not None:
            _flush()  # what a stray print left in the buffer goes where the command's output went: stderr
            os.dup2(held, 1)
            os.close(held)


def cause(exc: BaseException) -> OSError:
    """The OSError behind a failed write of stdout."""
    return exc.args[0] if isinstance(exc, StdoutLost) else exc  # type: ignore[return-value]


def lost(what: str, error: OSError) -> str:
    """One line for `what` (the output, the JSON envelope) that stdout did not take."""
    if error.errno == errno.EPIPE:
        return f"stdout was closed before {what} was written"
    return f"stdout could not be written ({error.strerror or error}): {what} is not there"


def gone(fd: int = 1) -> None:
    """stdout's reader is gone: point its descriptor at /dev/null, so that nothing written later (nor the
    interpreter's flush at exit) fails again."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, fd)
    os.close(devnull)


def _on_descriptor_1() -> bool:
    try:
        return sys.stdout is not None and sys.stdout.fileno() == 1
    except (OSError, ValueError, AttributeError):  # io.UnsupportedOperation is both
        return False


def _open(fd: int) -> bool:
    try:
        os.fstat(fd)
    except OSError:
        return False
    return True


def _flush() -> None:
    with contextlib.suppress(ValueError, OSError, AttributeError):  # closed, failing, or None
        sys.stdout.flush()
