"""The JSONL that SGLang's benchmark client writes, without the server's credentials.

The client copies the server's `/server_info` into every line it writes (sglang/benchmark/serving.py), and
SGLang 0.5.23's `/server_info` carries the API key twice: as `api_key` and inside `launch_command`, where a key
given in a config file comes back as `--api-key VALUE` (srt/server_args.py l.683-719, srt/utils/common.py
l.3589-3591). One rule for both copies of the file: the sglang_bench_results module rewrites it on the container
right after the sweep, and `provision bench` reads it through this rule on the controller.
"""

from __future__ import annotations

import json
import re

SECRET_SERVER_INFO_KEYS = ("api_key", "admin_api_key")
REDACTED = "<redacted>"
# `--api-key VALUE`, `--api-key=VALUE`, VALUE shell-quoted or not (launch_command is the argv joined by spaces)
_SECRET_FLAG = re.compile(r"""(--(?:admin-)?api-key)(=|\s+)('[^']*'|"[^"]*"|\S+)""")


def scrub_launch_command(command):
    """`command` with the value of every --api-key / --admin-api-key replaced."""
    return _SECRET_FLAG.sub(lambda m: m.group(1) + m.group(2) + REDACTED, command)


def scrub_row(row):
    """One parsed JSONL line, its server_info's credentials replaced (in place); returns the row."""
    info = row.get("server_info")
    if isinstance(info, dict):
        for key in SECRET_SERVER_INFO_KEYS:
            if info.get(key):
                info[key] = REDACTED
        if isinstance(info.get("launch_command"), str):
            info["launch_command"] = scrub_launch_command(info["launch_command"])
    return row


def scrub_jsonl(text):
    """(the JSONL without credentials, the numbers of the lines left out). A line that is not a JSON object (a
    last line cut short) is left out, since what cannot be parsed cannot have its credentials taken out."""
    lines, bad = [], []
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except ValueError:
            row = None
        if not isinstance(row, dict):
            bad.append(number)
            continue
        lines.append(json.dumps(scrub_row(row)))
    return "\n".join(lines) + ("\n" if lines else ""), bad
