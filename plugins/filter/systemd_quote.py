"""Jinja filters that quote values for systemd unit files and check what may reach one."""

from __future__ import annotations

import re

from ansible_collections.provision.pve_sglang.plugins.module_utils.rendered_values import value_problems

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
            # control characters in what reaches a unit, a GRUB file or a kernel command line (module_utils)
            "rendered_value_problems": value_problems,
            "sglang_secret_flags": secret_flags,
        }
