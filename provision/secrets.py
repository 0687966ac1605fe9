"""What counts as a secret, and how a secret is scrubbed from everything provision shows or keeps.

The secret set (`values`), one rule for every command:
- the values of environment variables whose names look secret (`PROXMOX_PASSWORD`, `MY_API_KEY`);
- per inventory host, the variables the roles' argument specs declare secret (`no_log: true` in
  `roles/*/meta/argument_specs.yml`) and Ansible's connection and become passwords, rendered by Ansible's
  own templating on the controller, so that a value read through `lookup('ansible.builtin.env', NAME)`
  is known whatever NAME is;
- every value that came out of a vault, whatever its variable is called (nested ones leaf by leaf).
A value too short (under STRONG_LEN characters) or too common to be masked by substring is not masked: masking
"admin" in every "sysadmin" would tell every reader of a log what it is. It is named in a warning instead
(`weak_warnings`): Ansible's no_log is then all that keeps it out of the output. Common means a word of the
inventory (a host, group or variable name contains it), of provision's own names, or of a short list of the
passwords people type first.

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

from provision.ansible_values import captured_warnings, from_vault, is_template
from provision.paths import roles_dir

REDACTED = "********"
MIN_LEN = 4  # no spelling of a secret shorter than this is replaced (a base64 fragment of two characters)
STRONG_LEN = 8
# Where a secret occurs inside one of these, masking it would show it. Besides the inventory's own names.
COMMON_WORDS = frozenset(
    {
        "provision",
        "proxmox",
        "sglang",
        "nvidia",
        "ansible",
        "vault",
        "password",
        "passw0rd",
        "secret",
        "changeme",
        "admin",
        "administrator",
        "letmein",
        "welcome",
        "qwerty",
        "123456789",
        "1234567890",
        "root",
        "toor",
    }
)
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
    "ansible_password",
    "ansible_ssh_pass",
    "ansible_ssh_password",
    "ansible_become_password",
    "ansible_become_pass",
    "ansible_sudo_pass",
)


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
    """The secret set: secret-looking environment values, and with an inventory its secrets (module doc); those
    too weak to mask left out."""
    found = {v for k, v in os.environ.items() if _SECRET_ENV.search(k)}
    if inv is not None:
        found |= {text for _, _, text in _inventory_secrets(inv)}
    words = vocabulary(inv)
    return {v for v in found if isinstance(v, str) and not weakness(v, words)}


def vocabulary(inv: Any = None) -> frozenset[str]:
    """The names a secret must not occur in to be masked: provision's, and the inventory's hosts, groups, vars."""
    words = set(COMMON_WORDS) | secret_names()
    if inv is not None:
        words |= set(inv.hosts) | set(inv.groups) | {name for host in inv.hosts.values() for name in host.vars}
    return frozenset(w.lower() for w in words)


def weakness(secret: str, words: frozenset[str]) -> str:
    """Why a secret cannot be masked by substring ('' where it can)."""
    if len(secret) < STRONG_LEN:
        return f"too short to be masked (under {STRONG_LEN} characters)"
    low = secret.lower()
    if low in _NEVER_SECRET or any(low in w for w in words):  # which name is not said: that would narrow it down
        return "too common to be masked (a common password, or part of a host, group or variable name)"
    return ""


def weak_warnings(inv: Any) -> list[str]:
    """One line per inventory secret that is not masked, naming where it is set and why (module doc)."""
    words, seen, lines, names = vocabulary(inv), set(), [], secret_names()
    for host, name, text in _inventory_secrets(inv):
        if name not in names:  # a value that is secret only for being in a vault (a port, a VMID) is no password
            continue
        why = weakness(text, words)
        where = host.where(name)
        if why and (where, name) not in seen:
            seen.add((where, name))
            lines.append(
                f"{where}: {name}: its value is {why}, so provision does not mask it in logs, records or errors "
                "(Ansible's no_log still hides it in task output): use a longer, random one"
            )
    return lines


def _inventory_secrets(inv: Any) -> Iterator[tuple[Any, str, str]]:
    """(host, variable, text) for every secret leaf of the inventory, templates rendered as Ansible will."""
    names = secret_names()
    with captured_warnings():  # a lookup that cannot render here warns; the run says it where it matters
        for host in inv.hosts.values():
            for name, value in host.vars.items():
                if name in names or from_vault(value):
                    for leaf in leaves(value):
                        text = _text(leaf)
                        if text and is_template(text):
                            text = _render(inv, host, leaf)
                        if text:
                            yield host, name, text


def leaves(value: Any) -> Iterator[Any]:
    """The scalars of a value, each container visited once: YAML aliases share theirs, so an alias nested in aliases
    (a billion laughs) costs what its text does, not what it expands to."""
    stack, seen = [value], set()
    while stack:
        item = stack.pop()
        if isinstance(item, dict | list | tuple):
            if id(item) not in seen:
                seen.add(id(item))
                stack.extend(reversed(list(item.values() if isinstance(item, dict) else item)))
        elif item is not None:
            yield item


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
        secret,
        json.dumps(secret)[1:-1],
        repr(secret)[1:-1],
        quote(secret, safe=""),
        quote(secret),
        quote_plus(secret),
        secret.strip(),
        " ".join(secret.split()),  # the last two: as a one-line message shows it
    }
    found |= _shell_forms(secret)
    found |= _base64_forms(secret.encode("utf-8", "surrogateescape"))
    found |= {json.dumps(f)[1:-1] for f in found}
    return {f for f in found if len(f) >= MIN_LEN}


# Secrets recognised by their shape, whichever variable or argument they were pasted into: the secret part of a
# whole PVE API token (USER@REALM!TOKENID=UUID, as `pveum user token add` prints it and PVEAPIToken= sends it) and a
# Hugging Face access token (hf_ and 34 letters or digits).
TOKEN_SHAPES = (
    (re.compile(r"([\w.-]+@[\w.-]+![\w.-]+=)[0-9a-fA-F]{8}(?:-[0-9a-fA-F]{4}){3}-[0-9a-fA-F]{12}"), rf"\1{REDACTED}"),
    (re.compile(r"\bhf_[A-Za-z0-9]{30,}"), REDACTED),
)


class Redactor:
    """Replaces every form of every secret it holds, and every token-shaped string (TOKEN_SHAPES), by REDACTED: in
    text, in JSON-able values (strings only), in every file under a directory."""

    def __init__(self, secrets: Iterable[str] = ()):
        self.secrets = frozenset(s for s in secrets if isinstance(s, str) and len(s) >= MIN_LEN)
        spellings = sorted({f for s in self.secrets for f in forms(s)}, key=lambda f: (-len(f), f))
        self._pattern = re.compile("|".join(map(re.escape, spellings))) if spellings else None

    def text(self, text: str) -> str:
        text = self._pattern.sub(REDACTED, text) if self._pattern else text
        for shape, replacement in TOKEN_SHAPES:
            text = shape.sub(replacement, text)
        return text

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
        for path in root.rglob("*"):
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
