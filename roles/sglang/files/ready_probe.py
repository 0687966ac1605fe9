"""One readiness probe of the SGLang service, on the host. Prints {"ready": bool, "exits": int, "stopped": bool,
"state": str}.

usage: ready_probe.py UNIT URL KEY_FILE RESTARTS_BEFORE

- ready: the URL answers 200, asked with the API key read from the service's --config file (0640 root:sglang; SGLang
  leaves its health paths open, a sglang_ready_path elsewhere may need the key); no proxy is asked, so the key goes
  only to the server on this host.
- exits: how often the server exited since the wait began: systemd's automatic restarts of the unit
  (`NRestarts`, counted by Restart=on-failure) past RESTARTS_BEFORE, plus one while the unit is `failed`. A server
  that cannot start (Triton without a compiler, a model that does not fit) exits again every RestartSec; the
  role stops waiting after a few exits instead of for sglang_ready_timeout.
- stopped: the unit is down and systemd will not start it again (a clean exit, which Restart=on-failure does not
  restart; a failure past the start limit): waiting longer cannot help.
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
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # never through http_proxy
    try:
        with opener.open(request, timeout=30) as response:
            return response.status == 200
    except (OSError, ValueError):  # refused, reset, timed out, or an HTTP error status
        return False


def unit(name):
    argv = ["systemctl", "show", "-p", "NRestarts", "-p", "ActiveState", "-p", "SubState", name]
    shown = subprocess.run(argv, capture_output=True, text=True).stdout
    props = dict(line.split("=", 1) for line in shown.splitlines() if "=" in line)
    return int(props.get("NRestarts") or 0), props.get("ActiveState", ""), props.get("SubState", "")


def main(name, url, key_file, before):
    restarts, state, sub = unit(name)
    exits = max(0, restarts - int(before)) + (state == "failed")
    stopped = state in ("inactive", "failed") and sub != "auto-restart"
    ready = state == "active" and answers(url, read_key(key_file))
    print(json.dumps({"ready": ready, "exits": exits, "stopped": stopped, "state": state}))
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:5]))
