"""Print the last journal lines of a unit with the SGLang API key replaced, on the host itself.

SGLang 0.5.23 logs its resolved arguments, `api_key` included, at startup
(sglang/srt/entrypoints/engine.py l.173-174, 1185), so a raw journal tail holds the key. The key is
read here from the service's root-only --config file, so it is scrubbed whatever name or vault it
came from on the controller, and the raw tail never leaves the host.

usage: journal_tail.py UNIT KEY_FILE LINES
"""

import base64
import json
import subprocess
import sys
import urllib.parse

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


def main(unit, key_file, lines):
    tail = subprocess.run(
        ["journalctl", "-u", unit, "-n", str(int(lines)), "--no-pager", "-o", "cat"],
        capture_output=True, text=True, errors="replace",
    ).stdout  # fmt: skip
    sys.stdout.write(scrub(tail, [read_key(key_file)]))
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:4]))
