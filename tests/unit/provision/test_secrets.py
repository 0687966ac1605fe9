"""The secret set (one rule for every command) and the redactor (every spelling of a secret)."""

from __future__ import annotations

import base64
import json
import os
import shlex
import subprocess
import sys
import textwrap
from urllib.parse import quote, quote_plus

import pytest

from provision import inventory, secrets
from provision.secrets import REDACTED, Redactor
from tests.conftest import vault_encrypt
from tests.leaks import leaks
from tests.loaders import repo_file

# every character that makes an encoding differ from the plain text: quotes, a backslash, a space, /, + and =
KEY = "sk-L3ak/K+y 'q\"uo\\te=" + "9f2c"


def reveals(text: str, secret: str) -> bool:
    return bool(leaks(text, secret))


def spellings(secret: str) -> dict[str, str]:
    b64 = base64.b64encode(secret.encode()).decode()
    urlsafe = base64.urlsafe_b64encode(secret.encode()).decode()
    return {
        "plain": secret,
        "json": json.dumps({"msg": f"login {secret} failed"}),
        "repr": repr({"api_key": secret}),
        "quote": "https://x/?k=" + quote(secret, safe=""),
        "quote keeps /": "/v1/" + quote(secret),
        "quote_plus": "k=" + quote_plus(secret),
        "shlex": "sh -c " + shlex.quote(f"curl -H {shlex.quote(secret)}"),
        "ansible quoting": f"'--api-key={secret}'".replace("'", "'\"'\"'"),
        "base64": "Basic " + b64,
        "base64 unpadded": b64.rstrip("="),
        "urlsafe base64": urlsafe,
        "urlsafe unpadded": urlsafe.rstrip("="),
        "base64 in json": json.dumps({"argv": ["python3", b64]}),
    }


@pytest.mark.parametrize("case", list(spellings(KEY)))
def test_every_spelling_of_a_secret_is_scrubbed(case):
    text = spellings(KEY)[case]
    out = Redactor({KEY}).text(text)
    assert REDACTED in out and KEY not in out and not reveals(out, KEY), out


@pytest.mark.parametrize("prefix", [b"", b"a", b"ab", b"abc", b'{"question": "'])
@pytest.mark.parametrize("encode", [base64.b64encode, base64.urlsafe_b64encode])
def test_a_secret_inside_a_longer_base64_text_is_scrubbed_at_every_alignment(prefix, encode):
    """What a probe request does: the secret inside a JSON document, the document base64-encoded on argv."""
    text = encode(prefix + KEY.encode() + b'", "more": 1}').decode()
    assert reveals(text, KEY)
    out = Redactor({KEY}).text(f"argv: python3 - {text}")
    assert not reveals(out, KEY), out


def test_the_json_escaped_form_of_a_shell_quoted_secret_is_scrubbed():
    doc = json.dumps({"cmd": "sh -c " + shlex.quote("x " + KEY)})
    assert not reveals(Redactor({KEY}).text(doc), KEY)


def test_short_values_are_never_secrets_and_numbers_stay_numbers():
    redactor = Redactor({"abc", "4000", ""})
    assert redactor.secrets == {"4000"}
    data = {"exit_code": 4000, "hosts": {"ops-node": "ok"}, "msg": ["pw 4000 here", "abc"]}
    assert redactor.obj(data) == {"exit_code": 4000, "hosts": {"ops-node": "ok"}, "msg": [f"pw {REDACTED} here", "abc"]}


def test_a_secret_that_contains_another_is_scrubbed_whole():
    assert Redactor({"abcd", "xxabcdyy"}).text("1 xxabcdyy 2 abcd") == f"1 {REDACTED} 2 {REDACTED}"


def test_tree_scrubs_every_file_and_leaves_links(tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "plain.txt").write_text(f"password={KEY}\n")
    (tmp_path / "event.json").write_text(json.dumps({"res": {"msg": base64.b64encode(KEY.encode()).decode()}}))
    (tmp_path / "link").symlink_to(tmp_path / "a" / "plain.txt")
    assert Redactor({KEY}).tree(tmp_path) == 2
    for path in (tmp_path / "a" / "plain.txt", tmp_path / "event.json"):
        assert not reveals(path.read_text(), KEY) and REDACTED in path.read_text()


def test_the_declared_secrets_come_from_the_roles_argument_specs():
    declared = set(secrets.declared_secrets())
    assert {"sglang_api_key", "proxmox_api_password", "proxmox_api_token_secret"} <= declared
    assert "sglang_model_path" not in declared and "proxmox_api_user" not in declared
    assert {"ansible_password", "ansible_ssh_pass", "ansible_become_password", "ansible_become_pass"} <= (
        secrets.secret_names()
    )


HOSTS = """\
all:
  children:
    proxmox_hosts:
      hosts:
        pve1:
          ansible_become_password: become-pw-1234
          ansible_ssh_pass: "{{ lookup('ansible.builtin.env', 'SHIP_COLOUR') }}"
    gpu_containers:
      hosts:
        ct1:
          proxmox_host: pve1
          proxmox_vmid: 110
          sglang_api_key: "{{ lookup('ansible.builtin.env', 'WIDGET_SIZE') }}"
          ansible_password: "{{ hostvars['nowhere'].x }}"
          sglang_model_path: /models/qwen
          widget_note: not-a-secret-value
"""


def test_the_secret_set_holds_vault_values_declared_and_connection_secrets_rendered(tmp_path, monkeypatch):
    """Whatever the environment variable a secret is read from is called, the rendered value is in the set;
    so is every value from a vault (here under a name that does not look secret), nested ones too."""
    monkeypatch.setenv("WIDGET_SIZE", "key-from-an-odd-env-name")
    monkeypatch.setenv("SHIP_COLOUR", "ssh-pass-from-env")
    monkeypatch.setenv("MY_API_KEY", "k-123456")
    root = tmp_path / "inv"
    (root / "group_vars" / "all").mkdir(parents=True)
    (root / "hosts.yml").write_text(HOSTS)
    vault = root / "group_vars" / "all" / "vault.yml"
    vault.write_text("colour_of_the_day: vaulted-1234\nnested: {deep: [NestedTok777]}\n")
    password = tmp_path / "pass"
    password.write_text("pw-123456\n")
    vault_encrypt(vault, password)
    inv = inventory.load(root, inventory.VaultOptions((password,)))
    found = secrets.values(inv)
    assert {
        "key-from-an-odd-env-name",
        "ssh-pass-from-env",
        "become-pw-1234",
        "vaulted-1234",
        "NestedTok777",
        "k-123456",
    } <= found
    assert not {"/models/qwen", "not-a-secret-value", "pw-123456"} & found
    assert not [v for v in found if "{{" in v], "a template that cannot render here is no secret to scrub"


def test_a_literal_secret_is_warned_about_by_variable_never_by_value(tmp_path):
    root = tmp_path / "inv"
    root.mkdir()
    (root / "hosts.yml").write_text(
        HOSTS.replace("ansible_password", "proxmox_api_token_secret").replace(
            "{{ hostvars['nowhere'].x }}", "tok-literal-999"
        )
    )
    inv = inventory.load(root)
    assert [w for w in inv.warnings if "proxmox_api_token_secret is in plain text" in w]
    assert not [w for w in inv.warnings if "tok-literal-999" in w]


def test_environment_secrets_need_a_secret_looking_name():
    env = {
        "PROXMOX_PASSWORD": "hunter2-long",
        "HOME_DIR": "/root",
        "HF_TOKEN": "hf_abcdefgh",
        # a secret word only inside a longer one, VAULT alone, or a value nobody's secret: none are secrets
        # (scrubbing "false" or "json" broke the record's JSON and hid the host locks a run left behind)
        "TOKENIZERS_PARALLELISM": "false-ish",
        "VAULT_FORMAT": "json",
        "VAULT_SKIP_VERIFY": "true",
        "SERVICE_TOKEN": "true",
    }
    code = "from provision import secrets; print(sorted(secrets.values()))"
    out = subprocess.run([sys.executable, "-c", code], env={**os.environ, **env}, capture_output=True, text=True)
    assert "hunter2-long" in out.stdout and "hf_abcdefgh" in out.stdout, out.stderr
    for value in ("/root", "false-ish", "json", "true"):
        assert f"'{value}'" not in out.stdout, value


def test_the_sglang_journal_scrubber_on_the_host_and_the_controller_agree():
    """The host-side scrub (roles/sglang/files/service_probe.py) knows only the key; whatever it leaves, the
    controller's redactor takes out too."""
    service_probe = repo_file("roles/sglang/files/service_probe.py")
    tail = textwrap.dedent(f"""\
        server_args={{'api_key': {KEY!r}, 'port': 30000}}
        launch_command: --api-key {shlex.quote(KEY)}
        GET /v1/models?key={quote_plus(KEY)}
    """)
    assert not reveals(Redactor({KEY}).text(service_probe.scrub(tail, [KEY])), KEY)
    assert not reveals(Redactor({KEY}).text(tail), KEY)


def test_a_secret_with_a_newline_is_scrubbed_from_the_one_line_a_failure_shows():
    """A vault value from `encrypt_string` on stdin keeps its trailing newline; a failure message is made one line
    (runner._failure_message) before the record is scrubbed."""
    from provision.runner import _failure_message

    secret = "tok-9f3a1c77e2\nsecond-part\n"
    message = _failure_message({"msg": f"login failed with {secret} for root@pam"})
    assert "\n" not in message
    assert Redactor([secret]).text(message) == f"login failed with {REDACTED} for root@pam"


def test_a_secret_walked_through_aliases_visits_each_shared_container_once():
    """A value whose lists hold one list ten times, nine levels deep, expands to 10^9 strings: it is walked in
    microseconds, each distinct scalar once."""
    value: list = ["tok-" + "in-a-bomb"]
    for _ in range(9):
        value = [value] * 10
    assert list(secrets.leaves({"k": value})) == ["tok-in-a-bomb"]


def test_a_token_pasted_anywhere_is_scrubbed_by_its_shape_and_ids_that_are_no_secret_stay():
    pve_secret, hf = "3f2a9c1e-7b4d-4e8f-9a21-" + "6c5d8e0f1b2a", "hf_" + "Qm7RkT2xWp9LzA4cVb8NyE3dHf6Js1Ug5K"
    boot_id = "0d6f3c2a-1b2c-4d5e-8f90-a1b2c3d4e5f6"
    text = f"got 'root@pam!provision={pve_secret}', token {hf}; boot {boot_id}"
    assert Redactor().text(text) == f"got 'root@pam!provision={REDACTED}', token {REDACTED}; boot {boot_id}"


@pytest.mark.parametrize(
    ("password", "why"),
    [
        ("hunter2", "too short to be masked (under 8 characters)"),
        ("Password", "too common"),
        ("gpu_containers", "too common"),
        ("widget_no", "too common"),
    ],
)
def test_a_secret_too_short_or_too_common_is_named_in_a_warning_and_not_masked(tmp_path, monkeypatch, password, why):
    """Masking such a value everywhere it occurs (every 'password' or host name of a log) would tell the reader what
    it is: the warning names the variable and where it is set, never the value."""
    monkeypatch.setenv("WIDGET_SIZE", "key-from-an-odd-env-name")
    monkeypatch.setenv("SHIP_COLOUR", password)
    root = tmp_path / "inv"
    root.mkdir()
    (root / "hosts.yml").write_text(HOSTS)
    inv = inventory.load(root)
    weak = [w for w in inv.warnings if "ansible_ssh_pass: its value is" in w]
    assert len(weak) == 1 and why in weak[0] and "hosts.yml:" in weak[0], inv.warnings
    assert password not in " ".join(inv.warnings)
    assert password not in secrets.values(inv) and "key-from-an-odd-env-name" in secrets.values(inv)
