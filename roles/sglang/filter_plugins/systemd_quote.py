"""Jinja filters that quote values for systemd unit files."""

from __future__ import annotations


def _escape(value, dollar: bool) -> str:
    text = str(value).replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n").replace("%", "%%")
    return text.replace("$", "$$") if dollar else text


def systemd_exec_arg(value) -> str:
    """One ExecStart= argument: double-quoted, so spaces, quotes, `;` and `$` stay literal."""
    return '"%s"' % _escape(value, dollar=True)


def systemd_env_assignment(item) -> str:
    """One Environment= assignment, quoted as a whole ("NAME=value")."""
    name, value = item
    return '"%s=%s"' % (name, _escape(value, dollar=False))


class FilterModule:
    def filters(self):
        return {"systemd_exec_arg": systemd_exec_arg, "systemd_env_assignment": systemd_env_assignment}
