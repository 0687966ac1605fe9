"""Where a secret shows in a text, in any spelling a log, a URL, a shell command, JSON or base64 gives it.

Written apart from provision/secrets.py on purpose: the tests grep with this, not with the code they test.
"""

from __future__ import annotations

import base64
import json
import re
import shlex
from urllib.parse import quote, quote_plus


def spellings(secret: str) -> dict[str, str]:
    b64 = base64.b64encode(secret.encode()).decode()
    urlsafe = base64.urlsafe_b64encode(secret.encode()).decode()
    return {
        "plain": secret,
        "JSON-escaped": json.dumps(secret)[1:-1],
        "repr": repr(secret)[1:-1],
        "URL-encoded": quote(secret, safe=""),
        "URL-encoded path": quote(secret),
        "URL-encoded form": quote_plus(secret),
        "shell-quoted": shlex.quote(secret),
        "base64": b64,
        "base64 unpadded": b64.rstrip("="),
        "urlsafe base64": urlsafe,
        "urlsafe base64 unpadded": urlsafe.rstrip("="),
    }


def in_base64(text: str, secret: str) -> bool:
    """The secret's bytes inside any run of base64 characters of the text, at any alignment, either alphabet."""
    raw = secret.encode()
    for run in re.findall(r"[A-Za-z0-9+/_=-]{6,}", text):
        for start in range(4):
            chunk = run[start:].rstrip("=")
            chunk = chunk[: len(chunk) - len(chunk) % 4]
            for alt in (b"+/", b"-_"):
                try:
                    if raw in base64.b64decode(chunk, altchars=alt, validate=False):
                        return True
                except ValueError:
                    continue
    return False


def leaks(text: str, secret: str) -> list[str]:
    """The spellings of the secret found in the text (empty: none)."""
    found = [name for name, form in spellings(secret).items() if form in text]
    return found + (["inside base64"] if in_base64(text, secret) else [])
