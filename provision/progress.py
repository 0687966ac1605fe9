"""What an API function tells its caller while it runs: nothing, unless the caller asks.

`apply`, `verify`, `capacity_report`, `diag` and `bench` take a `progress`; left out, they are silent and only
return their result. The CLI passes `present.ConsoleProgress`, which draws each playbook's live table and
prints notes and warnings on stderr. A caller of its own subclasses `Progress`.
"""

from __future__ import annotations

from typing import Any, Protocol


class PlaybookProgress(Protocol):
    """One playbook run's progress, as `runner.run_playbook` drives it: start, every runner event, stop."""

    def start(self) -> None: ...

    def update(self, kind: str, data: dict[str, Any]) -> None: ...

    def stop(self) -> None: ...


class Progress:
    """Silent: a Python caller that asked for nothing gets nothing printed."""

    def playbook(self, title: str) -> PlaybookProgress | None:
        """The progress of one playbook run under this title, or None for none."""
        return None

    def note(self, message: str) -> None:
        """One line for the operator while the command runs."""

    def warning(self, message: str) -> None:
        """One line the operator should act on."""


SILENT = Progress()
