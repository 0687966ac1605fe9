"""What the sglang role asks of its service on the host, where the API key is: two commands.

usage: service_probe.py tail UNIT KEY_FILE LINES
       service_probe.py ready UNIT URL KEY_FILE RESTARTS_BEFORE
       service_probe.py stale UNIT PATHS_JSON

`tail` prints the last journal lines of the unit with the SGLang API key replaced. SGLang 0.5.23 logs its resolved
arguments, `api_key` included, at startup (sglang/srt/entrypoints/engine.py l.173-174, 1185), so a raw journal tail
holds the key. The key is read here from the service's --config file (0640 root:sglang), so it is scrubbed whatever
name or vault it came from on the controller, and the raw tail never leaves the host.

`ready` is one readiness probe; it prints {"ready": bool, "exits": int, "stopped": bool, "state": str}:
- ready: the URL answers 200, asked with the API key from the same file (SGLang leaves its health paths open, a
  sglang_ready_path elsewhere may need the key); no proxy is asked, so the key goes only to the server on this host.
- exits: how often the server exited since the wait began: systemd's automatic restarts of the unit
  (`NRestarts`, counted by Restart=on-failure) past RESTARTS_BEFORE, plus one while the unit is `failed`. A server
  that cannot start (Triton without a compiler, a model that does not fit) exits again every RestartSec; the
  role stops waiting after a few exits instead of for sglang_ready_timeout.
- stopped: the unit is down and systemd will not start it again (a clean exit, which Restart=on-failure does not
  restart; a failure past the start limit): waiting longer cannot help.

`stale` prints {"active": bool, "newer": [path]}: of the paths (glob patterns, a JSON list), those changed since the
running unit's main process started. A run stopped between writing the unit, its configuration or its packages and
restarting the server leaves them newer than the server: the restart is still due, whatever the stopped run noted.
The start is systemd's ExecMainStartTimestampMonotonic, on the clock Python's time.monotonic() reads.
"""

import base64
import glob
import json
import os
import subprocess
import sys
import time
import urllib.parse
import urllib.request

PLACEHOLDER = "<redacted>"


def spellings(secret):
    """The secret as logs and URLs write it: literal, JSON- and repr-escaped, URL-quoted, base64."""
    forms = {secret, json.dumps(secret)[1:-1], repr(secret)[1:-1], urllib.parse.quote(secret, safe="")}
    encoded = base64.b64encode(secret.encode()).decode()
    forms.update({encoded, encoded.rstrip("=")})
    return sorted((f for f in forms if f), key=len, reverse=True)


def scrub(text, secrets):
    for secret in secrets:
        if secret:
            for form in spellings(secret):
                text = text.replace(form, PLACEHOLDER)
    return text


def read_key(path):
    try:
        with open(path) as f:
            return str(json.load(f).get("api-key") or "")
    except (OSError, ValueError, AttributeError):
        return ""


def tail(unit, key_file, lines):
    text = subprocess.run(
        ["journalctl", "-u", unit, "-n", str(int(lines)), "--no-pager", "-o", "cat"],
        capture_output=True,
        text=True,
        errors="replace",
        check=False,
    ).stdout
    sys.stdout.write(scrub(text, [read_key(key_file)]))
    return 0


def answers(url, key):
    request = urllib.request.Request(url, headers={"Authorization": f"Bearer {key}"} if key else {})
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # never through http_proxy
    try:
        with opener.open(request, timeout=30) as response:
            return response.status == 200
    except (OSError, ValueError):  # refused, reset, timed out, or an HTTP error status
        return False


def unit(name):
    argv = ["systemctl", "show", "-p", "NRestarts", "-p", "ActiveState", "-p", "SubState", name]
    shown = subprocess.run(argv, capture_output=True, text=True, check=False).stdout
    props = dict(line.split("=", 1) for line in shown.splitlines() if "=" in line)
    return int(props.get("NRestarts") or 0), props.get("ActiveState", ""), props.get("SubState", "")


def ready(name, url, key_file, before):
    restarts, state, sub = unit(name)
    exits = max(0, restarts - int(before)) + (state == "failed")
    stopped = state in ("inactive", "failed") and sub != "auto-restart"
    serving = state == "active" and answers(url, read_key(key_file))
    print(json.dumps({"ready": serving, "exits": exits, "stopped": stopped, "state": state}))
    return 0


def stale(name, paths_json):
    argv = ["systemctl", "show", "-p", "ActiveState", "-p", "ExecMainStartTimestampMonotonic", name]
    shown = subprocess.run(argv, capture_output=True, text=True, check=False).stdout
    props = dict(line.split("=", 1) for line in shown.splitlines() if "=" in line)
    started_monotonic = int(props.get("ExecMainStartTimestampMonotonic") or 0) / 1e6
    active = props.get("ActiveState") == "active" and started_monotonic > 0
    started = started_monotonic + time.time() - time.monotonic()
    found = sorted({path for pattern in json.loads(paths_json) for path in glob.glob(pattern)})
    newer = [path for path in found if active and os.stat(path).st_mtime > started]
    print(json.dumps({"active": active, "newer": newer}))
    return 0


COMMANDS = {"tail": (tail, 3), "ready": (ready, 4), "stale": (stale, 2)}


if __name__ == "__main__":
    command, count = COMMANDS[sys.argv[1]]
    sys.exit(command(*sys.argv[2 : 2 + count]))
