"""What counts as a secret, and how a secret is scrubbed from everything provision shows or keeps.

The secret set (`values`), one rule for every command:
- the values of environment variables whose names look secret (`PROXMOX_PASSWORD`, `MY_API_KEY`);
- per inventory host, the variables the roles' argument specs declare secret (`no_log: true` in
  `roles/*/meta/argument_specs.yml`) and Ansible's connection and become passwords, rendered by Ansible's
  own templating on the controller, so that a value read through `lookup('ansible.builtin.env', NAME)`
  is known whatever NAME is;
- every value that came out of a vault, whatever its variable is called (nested ones leaf by leaf).
Values shorter than MIN_LEN characters are never secrets (they would scrub every "1").

The redactor (`Redactor`) replaces every secret in each spelling logs, URLs, shell commands and JSON
give it (`forms`): as written; JSON-escaped; Python's repr; URL-encoded (quote, quote_plus); shell-quoted
(shlex.quote, and inside a larger single-quoted string as Ansible writes it, `'"'"'` for each quote);
base64 in both alphabets, padded or not, also where it is embedded in a longer base64 text, at any of
the three byte alignments; and the JSON-escaped form of each of these.
"""

from __future__ import annotations

import base64
import functools
import json
import os
import re
import shlex
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote, quote_plus

import yaml

from provision.paths import roles_dir

REDACTED = "********"
MIN_LEN = 4
# Environment variables whose values are secrets wherever they appear.
# A secret-looking environment name: one of these words between underscores (HF_TOKEN, PROXMOX_PASSWORD,
# MY_API_KEY), never a part of a longer word (TOKENIZERS_PARALLELISM) nor VAULT alone (VAULT_FORMAT).
_SECRET_ENV = re.compile(
    r"(?:^|_)(?:PASSWORD|PASSWD|PASS|SECRET|TOKEN|APIKEY|CREDENTIALS?|API_KEY|PRIVATE_KEY|ACCESS_KEY)(?:_|$)",
    re.IGNORECASE,
)
# Values that are never anybody's secret, whatever variable holds them: scrubbing them would break JSON and prose.
_NEVER_SECRET = frozenset({"true", "false", "yes", "no", "none", "null", "json", "yaml"})
# Ansible's own names for connection and become passwords (no role declares them).
CONNECTION_SECRETS = (
    "ansible_password", "ansible_ssh_pass", "ansible_ssh_password", "ansible_become_password",
    "ansible_become_pass", "ansible_sudo_pass",
)  # fmt: skip


@functools.cache
def declared_secrets() -> tuple[str, ...]:
    """The variables the roles' argument specs mark `no_log: true`, in every entry point."""
    names: set[str] = set()
    for spec_file in sorted(roles_dir().glob("*/meta/argument_specs.yml")):
        specs = (yaml.safe_load(spec_file.read_text()) or {}).get("argument_specs") or {}
        for entry in specs.values():
            names |= {name for name, option in (entry.get("options") or {}).items() if (option or {}).get("no_log")}
    return tuple(sorted(names))


def secret_names() -> frozenset[str]:
    """Every variable whose value is a secret: declared in a role's spec, or one of Ansible's passwords."""
    return frozenset(declared_secrets()) | frozenset(CONNECTION_SECRETS)


def values(inv: Any = None) -> set[str]:
    """The secret set: secret-looking environment values, and with an inventory its secrets (module doc)."""
    found = {v for k, v in os.environ.items() if _SECRET_ENV.search(k)}
    if inv is not None:
        found |= set(_inventory_values(inv))
    return {v for v in found if isinstance(v, str) and len(v) >= MIN_LEN and v.lower() not in _NEVER_SECRET}


def _inventory_values(inv: Any) -> Iterator[str]:
    from provision.inventory import captured_warnings, from_vault, is_template

    names = secret_names()
    with captured_warnings():  # a lookup that cannot render here warns; the run says it where it matters
        for host in inv.hosts.values():
            for name, value in host.vars.items():
                if name in names or from_vault(value):
                    for leaf in _leaves(value):
                        text = _text(leaf)
                        if text and is_template(text):
                            text = _render(inv, host, leaf)
                        if text:
                            yield text


def _leaves(value: Any) -> Iterator[Any]:
    if isinstance(value, dict):
        for item in value.values():
            yield from _leaves(item)
    elif isinstance(value, list | tuple):
        for item in value:
            yield from _leaves(item)
    elif value is not None:
        yield value


def _text(value: Any) -> str:
    try:
        return str(value)  # an inline !vault value decrypts here, when its secret was given
    except Exception:  # no secret for it: nothing readable to scrub
        return ""


def _render(inv: Any, host: Any, value: Any) -> str:
    """A templated secret as Ansible will render it for this host ('' where it cannot be rendered here)."""
    from ansible.template import Templar

    try:
        return _text(Templar(loader=inv.loader, variables=host.vars).template(value))
    except Exception:  # facts or hostvars it needs exist only in a play
        return ""


def _base64_forms(raw: bytes) -> set[str]:
    """base64 of the bytes, standard and urlsafe, padded and not, and the part of its encoding that does not
    depend on what surrounds it when it starts at byte 0, 1 or 2 of a 3-byte group of a longer text."""
    found = set()
    for encode in (base64.b64encode, base64.urlsafe_b64encode):
        whole = encode(raw).decode()
        found |= {whole, whole.rstrip("=")}
        for shift in range(3):
            encoded = encode(b"\0" * shift + raw).decode()
            found.add(encoded[-(-8 * shift // 6) : 8 * (shift + len(raw)) // 6])
    return found


def _shell_forms(secret: str) -> set[str]:
    """Shell-quoted, alone and inside a larger single-quoted word, once and inside a quoted command again
    (become runs a module's command line inside `sh -c '...'`)."""
    found, inner = set(), secret
    for _ in range(2):
        found.add(shlex.quote(inner))
        inner = inner.replace("'", "'\"'\"'")
        found.add(inner)
    return found


def forms(secret: str) -> set[str]:
    """Every spelling of a secret the redactor replaces (module doc); none shorter than MIN_LEN."""
    found = {
        secret, json.dumps(secret)[1:-1], repr(secret)[1:-1], quote(secret, safe=""), quote(secret),
        quote_plus(secret), secret.strip(), " ".join(secret.split()),  # the last two: as a one-line message shows it
    }  # fmt: skip
    found |= _shell_forms(secret)
    found |= _base64_forms(secret.encode("utf-8", "surrogateescape"))
    found |= {json.dumps(f)[1:-1] for f in found}
    return {f for f in found if len(f) >= MIN_LEN}


class Redactor:
    """Replaces every form of every secret it holds by REDACTED: in text, in JSON-able values (strings only),
    in every file under a directory."""

    def __init__(self, secrets: Iterable[str] = ()):
        self.secrets = frozenset(s for s in secrets if isinstance(s, str) and len(s) >= MIN_LEN)
        spellings = sorted({f for s in self.secrets for f in forms(s)}, key=lambda f: (-len(f), f))
        self._pattern = re.compile("|".join(map(re.escape, spellings))) if spellings else None

    def __bool__(self) -> bool:
        return self._pattern is not None

    def text(self, text: str) -> str:
        return self._pattern.sub(REDACTED, text) if self._pattern else text

    def obj(self, value: Any) -> Any:
        """A JSON-able value with every secret replaced in its strings (keys and numbers untouched)."""
        if isinstance(value, str):
            return self.text(value)
        if isinstance(value, dict):
            return {k: self.obj(v) for k, v in value.items()}
        if isinstance(value, list | tuple):
            return [self.obj(v) for v in value]
        return value

    def tree(self, root: Path) -> int:
        """Replace every secret in every file under root (links left alone). Returns the files changed."""
        changed = 0
        for path in root.rglob("*") if self else ():
            if not path.is_file() or path.is_symlink():
                continue
            try:
                text = path.read_text(encoding="utf-8", errors="surrogateescape")
            except OSError:
                continue
            scrubbed = self.text(text)
            if scrubbed != text:
                path.write_text(scrubbed, encoding="utf-8", errors="surrogateescape")
                changed += 1
        return changed
