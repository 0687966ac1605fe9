"""Every role README has one outline, and its Role Variables tables are what tests/role_docs.py renders from the
role's meta/argument_specs.yml: a new option in a spec, or a hand edit of a table, fails here until
`python -m tests.role_docs` writes the tables again."""

from __future__ import annotations

import re

import pytest
import yaml

from tests import role_docs

ROLES = role_docs.roles()
# the `##` headings of every role README, in this order, after an optional "What it does"
OUTLINE = [
    "Requirements",
    "Role Variables",
    "Dependencies",
    "Example Playbook",
    "What it changes on the host",
    "What it cannot do",
]
_FENCED = re.compile(r"^```.*?^```", re.MULTILINE | re.DOTALL)
_LINK = re.compile(r"\]\(([^)\s]+)\)")


def _text(role: str) -> str:
    return role_docs.readme(role).read_text()


def _headings(text: str, level: str) -> list[str]:
    """The headings of one level, outside code blocks (a YAML comment is no heading)."""
    return re.findall(rf"^{level} (.+)$", _FENCED.sub("", text), re.MULTILINE)


def _part(text: str, heading: str) -> str:
    """The text of one `##` section."""
    return text.split(f"\n## {heading}\n", 1)[1].split("\n## ", 1)[0]


def test_every_role_has_a_readme_and_a_spec():
    assert sorted(p.name for p in role_docs.ROLES.iterdir() if p.is_dir()) == ROLES


@pytest.mark.parametrize("role", ROLES)
def test_the_role_variables_are_what_the_argument_spec_renders(role):
    found = role_docs.section(_text(role))
    assert found is not None, f"roles/{role}/README.md has no {role_docs.BEGIN} ... {role_docs.END} section"
    assert found == role_docs.wanted_section(role), (
        f"roles/{role}/README.md: its Role Variables differ from meta/argument_specs.yml; "
        "run `python -m tests.role_docs` to write them again"
    )


@pytest.mark.parametrize("role", ROLES)
def test_the_readme_has_the_outline(role):
    text = _text(role)
    assert _headings(text, "#") == [role], "the role's name is the one `#` title"
    found = _headings(text, "##")
    assert (found[1:] if found[:1] == ["What it does"] else found) == OUTLINE
    assert role_docs.BEGIN in _part(text, "Role Variables")


@pytest.mark.parametrize("role", ROLES)
def test_the_example_playbook_is_a_play_using_the_role_by_its_collection_name(role):
    blocks = re.findall(r"^```yaml\n(.*?)^```", _part(_text(role), "Example Playbook"), re.MULTILINE | re.DOTALL)
    assert blocks, "a ```yaml block"
    plays = yaml.safe_load(blocks[0])
    assert isinstance(plays, list) and all("hosts" in play for play in plays)
    assert f"provision.pve_sglang.{role}" in blocks[0]


@pytest.mark.parametrize("role", ROLES)
def test_every_relative_link_resolves(role):
    path = role_docs.readme(role)
    targets = _LINK.findall(re.sub(r"`[^`\n]+`", "", _FENCED.sub("", path.read_text())))
    files = [t.split("#", 1)[0] for t in targets if not re.match(r"^[a-z][a-z0-9+.-]*:", t)]
    assert [f for f in files if f and not (path.parent / f).exists()] == []


def test_a_new_or_edited_option_changes_the_rendered_table():
    entry = {"options": {"a_var": {"type": "int", "default": 3, "description": "Seconds."}}}
    before = role_docs.table(entry, {})
    entry["options"]["b_var"] = {"type": "str", "description": "New."}
    assert role_docs.table(entry, {}) != before
    assert role_docs.table(entry, {"a_var": 4}) != role_docs.table(entry, {})


def test_a_row_shows_type_choices_secrets_and_the_defaults_file_value():
    entry = {
        "options": {
            "k_mode": {
                "type": "str",
                "choices": ["auto", "off"],
                "default": "auto",
                "description": "C(auto) or I(off)",
            },
            "k_key": {"type": "str", "no_log": True, "required": True, "description": "The <key> | secret."},
            "k_list": {"type": "list", "elements": "int", "default": [1, 2], "description": ["One.", "Two."]},
        }
    }
    rows = role_docs.table(entry, {"k_list": [16], "k_mode": "{{ x | default('auto') }}"}).splitlines()[2:]
    assert rows == [
        r"""| `k_mode` | str, one of `auto`, `"off"` | `{{ x \| default('auto') }}` | `auto` or *off* |""",
        r"| `k_key` | str, required, secret | unset | The &lt;key&gt; \| secret. |",
        "| `k_list` | list of int | `[16]` | One. Two. |",
    ]


def test_values_are_written_as_yaml_reads_them():
    assert role_docs.yaml_text("0666") == '"0666"'
    assert role_docs.yaml_text("") == '""'
    assert role_docs.yaml_text({"HF_HUB_OFFLINE": "1"}) == '{HF_HUB_OFFLINE: "1"}'
    assert role_docs.yaml_text([None, True, "a b"]) == "[null, true, a b]"
    assert role_docs.code("`sha256sum` of it") == "`` `sha256sum` of it ``"
