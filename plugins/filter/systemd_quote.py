"""Jinja filters that quote values for systemd unit files and check what may reach one."""

from __future__ import annotations

import re
from collections.abc import Mapping

# A newline in a unit file starts a new directive (an injected ExecStartPre=, say); the other
# control characters have no business in an argument, a path or an environment value either.
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
# Flags that put a secret on argv (where `ps` shows it); argparse also takes a unique prefix
_SECRET_FLAGS = ("--api-key", "--admin-api-key")


def _escape(value, dollar: bool) -> str:
    text = str(value).replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n").replace("%", "%%")
    return text.replace("$", "$$") if dollar else text


def systemd_exec_arg(value) -> str:
    """One ExecStart= argument: double-quoted, so spaces, quotes, `;` and `$` stay literal."""
    return f'"{_escape(value, dollar=True)}"'


def systemd_env_assignment(item) -> str:
    """One Environment= assignment, quoted as a whole ("NAME=value")."""
    name, value = item
    return f'"{name}={_escape(value, dollar=False)}"'


def systemd_env_file_line(item) -> str:
    """One EnvironmentFile= line, NAME="value": inside double quotes systemd's parser takes `\\`
    followed by one of `"\\`$` as that character, and nothing else is special (no `%` specifiers,
    no expansion)."""
    name, value = item
    escaped = re.sub(r'(["\\`$])', r"\\\1", str(value))
    return f'{name}="{escaped}"'


def unit_value_problems(values: Mapping) -> list[str]:
    """One message per value that must not be rendered into a unit or its environment file:
    {variable name: value (str, list or mapping of names to values)}. Messages name the variable
    (and the list index or environment name), never the value, which may be a secret."""
    problems = []
    for var, value in values.items():
        if isinstance(value, Mapping):
            for name, item in value.items():
                if not _ENV_NAME.match(str(name)):
                    problems.append(f"{var}: {str(name)!r} is not a variable name ([A-Za-z_][A-Za-z0-9_]*)")
                elif _CONTROL.search(str(item)):
                    problems.append(f"{var}.{name} holds a control character (newline, tab, ...)")
        elif isinstance(value, (list, tuple)):
            problems += [f"{var}[{i}] holds a control character (newline, tab, ...)"
                         for i, item in enumerate(value) if _CONTROL.search(str(item))]  # fmt: skip
        elif value is not None and _CONTROL.search(str(value)):
            problems.append(f"{var} holds a control character (newline, tab, ...)")
    return problems


def secret_flags(args) -> list[str]:
    """The arguments that name --api-key or --admin-api-key (or a prefix argparse would expand to one)."""
    found = []
    for arg in args:
        option = str(arg).split("=", 1)[0]
        if len(option) >= len("--api") and any(flag.startswith(option) for flag in _SECRET_FLAGS):
            found.append(option)
    return found


class FilterModule:
    def filters(self):
        return {
            "systemd_exec_arg": systemd_exec_arg,
            "systemd_env_assignment": systemd_env_assignment,
            "systemd_env_file_line": systemd_env_file_line,
            "sglang_unit_value_problems": unit_value_problems,
            "sglang_secret_flags": secret_flags,
        }
