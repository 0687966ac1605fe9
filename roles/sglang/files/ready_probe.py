"""One readiness probe of the SGLang service, on the host. Prints {"ready": bool, "exits": int, "state": str}.

usage: ready_probe.py UNIT URL KEY_FILE RESTARTS_BEFORE

- ready: the URL answers 200, asked with the API key read from the service's root-only --config file (SGLang
  leaves its health paths open, a sglang_ready_path elsewhere may need the key); the key never leaves the host.
- exits: how often the server exited since the wait began: systemd's automatic restarts of the unit
  (`NRestarts`, counted by Restart=on-failure) past RESTARTS_BEFORE, plus one while the unit is `failed`. A server
  that cannot start (Triton without a compiler, a model that does not fit) exits again every RestartSec; the
  role stops waiting after a few exits instead of for sglang_ready_timeout.
"""

import json
import subprocess
import sys
import urllib.error
import urllib.request


def read_key(path):
    try:
        with open(path) as f:
            return str(json.load(f).get("api-key") or "")
    except (OSError, ValueError, AttributeError):
        return ""


def answers(url, key):
    request = urllib.request.Request(url, headers={"Authorization": f"Bearer {key}"} if key else {})
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status == 200
    except (OSError, ValueError):  # refused, reset, timed out, or an HTTP error status
        return False


def unit(name):
    shown = subprocess.run(
        ["systemctl", "show", "-p", "NRestarts", "-p", "ActiveState", name], capture_output=True, text=True
    ).stdout
    props = dict(line.split("=", 1) for line in shown.splitlines() if "=" in line)
    return int(props.get("NRestarts") or 0), props.get("ActiveState", "")


def main(name, url, key_file, before):
    restarts, state = unit(name)
    exits = max(0, restarts - int(before)) + (state == "failed")
    ready = state == "active" and answers(url, read_key(key_file))
    print(json.dumps({"ready": ready, "exits": exits, "state": state}))
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:5]))
