"""The Role Variables tables of the role READMEs, rendered from each role's meta/argument_specs.yml.

    python -m tests.role_docs     # rewrite the marked section of every roles/<role>/README.md

One row per option of each entry point: its name, its type (with its choices, `required`, and `secret` for a
`no_log` option), its default and its description. The default is the value in the role's defaults/main.yml,
which is the one Ansible uses; an option that file does not set shows the spec's `default`, else `unset`. A
role with more than one entry point gets one table per entry point, under a `###` heading naming it.
tests/unit/docs/test_role_readmes.py holds every README to what this renders.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
ROLES = ROOT / "roles"
BEGIN = "<!-- role-variables:begin -->"
END = "<!-- role-variables:end -->"
HEADER = "| variable | type | default | description |\n|---|---|---|---|"
UNSET = "unset"
# Ansible's documentation markup: C(code), I(italic), B(bold), U(url), and the semantic ones shown as code
_MARKUP = re.compile(r"\b([CVOEPMIBU])\(([^()]*)\)")
_CODE_MARKUP = "CVOEPM"
_SECTION = re.compile(re.escape(BEGIN) + r"(.*?)" + re.escape(END), re.DOTALL)


def roles() -> list[str]:
    """The roles that have both a README and an argument spec."""
    return sorted(
        p.parents[1].name for p in ROLES.glob("*/meta/argument_specs.yml") if (p.parents[1] / "README.md").exists()
    )


def argument_specs(role: str) -> dict:
    return yaml.safe_load((ROLES / role / "meta" / "argument_specs.yml").read_text())["argument_specs"]


def role_defaults(role: str) -> dict:
    path = ROLES / role / "defaults" / "main.yml"
    return (yaml.safe_load(path.read_text()) or {}) if path.exists() else {}


def _escape(text: str) -> str:
    """Prose for a table cell: no HTML tag, emphasis or column break of its own."""
    return text.replace("<", "&lt;").replace(">", "&gt;").replace("*", r"\*").replace("|", r"\|")


def code(text: str) -> str:
    """Inline code for a table cell; a text holding a backtick gets a double fence."""
    fence = "`` " if "`" in text else "`"
    return f"{fence}{text}{fence[::-1]}".replace("|", r"\|")


def _markup(match: re.Match) -> str:
    kind, inner = match.group(1), match.group(2)
    if kind in _CODE_MARKUP:
        return code(inner)
    return {"I": f"*{_escape(inner)}*", "B": f"**{_escape(inner)}**"}.get(kind, _escape(inner))


def describe(description: str | list | None) -> str:
    """A spec description (a string or a list of paragraphs) as one Markdown cell."""
    text = " ".join(description) if isinstance(description, list) else description or ""
    text = " ".join(text.split())
    parts, last = [], 0
    for match in _MARKUP.finditer(text):
        parts += [_escape(text[last : match.start()]), _markup(match)]
        last = match.end()
    return "".join([*parts, _escape(text[last:])])


def _plain(text: str) -> bool:
    """Whether YAML reads the text, unquoted, back as the same string."""
    try:
        return yaml.safe_load(text) == text
    except yaml.YAMLError:
        return True


def yaml_text(value) -> str:
    """A value in YAML's flow style on one line; a string is quoted only where YAML would read another type."""
    if value is None or isinstance(value, bool):
        return {None: "null", True: "true", False: "false"}[value]
    if isinstance(value, (int, float)):
        return str(value)
    if isinstance(value, list):
        return "[" + ", ".join(yaml_text(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k}: {yaml_text(v)}" for k, v in value.items()) + "}"
    text = " ".join(str(value).split())
    return text if text and _plain(text) else f'"{text}"'


def type_text(option: dict) -> str:
    kind = option.get("type", "str")
    if kind == "list" and option.get("elements"):
        kind = f"list of {option['elements']}"
    words = [kind]
    if option.get("choices"):
        words.append("one of " + ", ".join(code(yaml_text(c)) for c in option["choices"]))
    words += [word for word, on in (("required", option.get("required")), ("secret", option.get("no_log"))) if on]
    return ", ".join(words)


def default_text(name: str, option: dict, values: dict) -> str:
    if name in values:
        return code(yaml_text(values[name]))
    if "default" in option:
        return code(yaml_text(option["default"]))
    return UNSET


def rows(options: dict, values: dict, prefix: str = "") -> list[str]:
    """One row per option, each sub-option after its parent as `parent.child` (their defaults are the spec's)."""
    found = []
    for name, option in (options or {}).items():
        cells = [code(prefix + name), type_text(option), default_text(name, option, values)]
        found.append("| " + " | ".join([*cells, describe(option.get("description"))]) + " |")
        found += rows(option.get("options"), {}, f"{prefix}{name}.")
    return found


def table(entry: dict, values: dict) -> str:
    return "\n".join([HEADER, *rows(entry.get("options"), values)])


def render(role: str) -> str:
    """The Role Variables section of the role's README, between the markers."""
    entries, values = argument_specs(role), role_defaults(role)
    if list(entries) == ["main"]:
        return table(entries["main"], values)
    return "\n\n".join(
        f"### Entry point `{name}`\n\n{describe(entry.get('short_description'))}\n\n{table(entry, values)}"
        for name, entry in entries.items()
    )


def readme(role: str) -> Path:
    return ROLES / role / "README.md"


def section(text: str) -> str | None:
    """What a README holds between the markers (None without them)."""
    found = _SECTION.search(text)
    return found.group(1) if found else None


def wanted_section(role: str) -> str:
    return f"\n\n{render(role)}\n\n"


def rewrite(role: str) -> bool:
    """Put the rendered tables between the README's markers; say whether the file changed."""
    path = readme(role)
    text = path.read_text()
    if section(text) is None:
        raise SystemExit(f"{path.relative_to(ROOT)}: no {BEGIN} ... {END} section to write the tables into")
    new = _SECTION.sub(lambda _: BEGIN + wanted_section(role) + END, text, count=1)
    if new != text:
        path.write_text(new)
    return new != text


def main() -> int:
    for role in roles():
        print(f"{'rewrote' if rewrite(role) else 'unchanged'} {readme(role).relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
