"""What may be rendered into a systemd unit, its environment file, a GRUB default file or a kernel command line.

A newline in a unit file starts a new directive (an injected `ExecStartPre=`), and in /etc/default/grub a new
shell statement; the other control characters have no business in an argument, a path, an environment value or
a kernel argument either. One rule, used by the roles' preflight (the `rendered_value_problems` filter), the
kernel_cmdline module, and `provision inventory check` before any host is contacted. Messages name the variable
(and the list index or environment name), never the value, which may be a secret.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

CONTROL = re.compile(r"[\x00-\x1f\x7f]")
ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
WHY = "holds a control character (newline, tab, ...)"


def value_problems(values: Mapping) -> list[str]:
    """One message per value that must not be rendered: {variable name: value (a string, a list, or a mapping of
    environment names to values)}."""
    problems = []
    for var, value in values.items():
        if isinstance(value, Mapping):
            for name, item in value.items():
                if not ENV_NAME.match(str(name)):
                    problems.append(f"{var}: {str(name)!r} is not a variable name ([A-Za-z_][A-Za-z0-9_]*)")
                elif CONTROL.search(str(item)):
                    problems.append(f"{var}.{name} {WHY}")
        elif isinstance(value, (list, tuple)):
            problems += [f"{var}[{i}] {WHY}" for i, item in enumerate(value) if CONTROL.search(str(item))]
        elif value is not None and CONTROL.search(str(value)):
            problems.append(f"{var} {WHY}")
    return problems
