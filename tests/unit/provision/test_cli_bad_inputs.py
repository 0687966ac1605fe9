"""Every malformed inventory or flag: one clear line per problem, exit 2, no traceback, nothing contacted.

Each case is run twice: plain (stderr holds `error: ...` lines only) and with --json (stdout holds the
envelope of docs/json.md, with the same errors). The hosts point at 192.0.2.0/24 (TEST-NET-1): a run
that got as far as connecting would hang or fail with exit 1, not 2.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import jsonschema
import pytest
import yaml

from provision import cli
from provision.inventory import GIVE_THE_VAULT_PASSWORD
from tests.conftest import API_VARS, CONTAINER_VARS, vault_encrypt, vault_encrypt_string
from tests.faults import NOT_SHOWN, Row
from tests.unit.provision.test_cli_json_envelope import SCHEMA
from tests.unit.provision.test_inventory import GOOD_HOSTS

GOOD = GOOD_HOSTS  # hosts at 192.0.2.0/24 (TEST-NET-1)
CT2 = "        ct2:\n          proxmox_host: pve1\n          proxmox_vmid: 110\n"
GV = "group_vars/all.yml"
# a billion laughs in one variable: each list holds ten of the one before, so the last expands to 10^5 strings
ALIAS_BOMB = "sglang_extra_args:\n  - &a0 [x, x, x, x, x, x, x, x, x, x]\n" + "".join(
    f"  - &a{n} [{', '.join([f'*a{n - 1}'] * 10)}]\n" for n in range(1, 5)
)
# Secrets pasted where they do not belong: none may be printed, whatever the error
PVE_TOKEN_SECRET = "3f2a9c1e-7b4d-4e8f-9a21-" + "6c5d8e0f1b2a"
PVE_TOKEN = f"root@pam!provision={PVE_TOKEN_SECRET}"
HF_TOKEN = "hf_" + "Qm7RkT2xWp9LzA4cVb8NyE3dHf6Js1Ug5K"
VAULT_PASSWORD = "S3cretVault" + "Pw-x1"
NEVER_PRINTED = ("98765432", PVE_TOKEN_SECRET, HF_TOKEN, VAULT_PASSWORD)


def _deep(levels: int) -> str:
    text, indent = "all:\n  children:\n", "    "
    for n in range(levels):
        text += f"{indent}g{n}:\n{indent}  children:\n"
        indent += "    "
    return text


# (id, files of the inventory directory, extra argv after `inventory check -i INV`, or a full argv)
INVENTORIES = [
    ("children-as-list", {"hosts.yml": "all:\n  children:\n    - proxmox_hosts\n"}),
    ("integer-group-key", {"hosts.yml": "all:\n  children:\n    123:\n      hosts:\n        a:\n"}),
    ("deep-nesting-5000", {"hosts.yml": _deep(5000)}),
    ("vars-as-list", {"hosts.yml": GOOD.replace("    gpu_containers:\n", "    gpu_containers:\n      vars: [1, 2]\n")}),
    ("host-name-with-newline", {"hosts.yml": GOOD.replace("        ct1:\n", '        "ct\\n1":\n')}),
    ("host-name-with-space", {"hosts.yml": GOOD.replace("        ct1:\n", '        "ct 1":\n')}),
    ("top-level-list", {"hosts.yml": "- all\n- proxmox_hosts\n"}),
    ("empty-file", {"hosts.yml": ""}),
    ("yaml-syntax-error", {"hosts.yml": GOOD.replace("proxmox_vmid: 110", "proxmox_vmid: [110")}),
    ("hosts-as-list", {"hosts.yml": GOOD.replace("hosts:\n        pve1:\n", "hosts:\n        - pve1\n")}),
    ("unknown-group-key", {"hosts.yml": GOOD.replace("proxmox_hosts:\n      hosts:", "proxmox_hosts:\n      host:")}),
    ("ini-unclosed-section", {"hosts": "[proxmox_hosts\npve1\n"}),
    ("ini-range-without-end", {"hosts": "[proxmox_hosts]\npve-[01:]\n"}),
    ("ini-bad-assignment", {"hosts": "[proxmox_hosts]\npve1 ansible_port\n"}),
    ("binary-file", {"hosts": bytes(range(256)) * 2}),
    ("unknown-inventory-plugin", {"pve.yml": "plugin: nosuch.col.plug\n"}),
    ("vmid-string", {"hosts.yml": GOOD.replace("proxmox_vmid: 110", 'proxmox_vmid: "110"')}),
    ("vmid-float", {"hosts.yml": GOOD.replace("proxmox_vmid: 110", "proxmox_vmid: 110.5")}),
    ("vmid-bool", {"hosts.yml": GOOD.replace("proxmox_vmid: 110", "proxmox_vmid: true")}),
    ("vmid-too-small", {"hosts.yml": GOOD.replace("proxmox_vmid: 110", "proxmox_vmid: 99")}),
    ("vmid-duplicate", {"hosts.yml": GOOD + CT2}),
    ("vmid-missing", {"hosts.yml": GOOD.replace("          proxmox_vmid: 110\n", "")}),
    ("node-unknown", {"hosts.yml": GOOD.replace("proxmox_host: pve1", "proxmox_host: pve9")}),
    ("node-missing", {"hosts.yml": GOOD.replace("          proxmox_host: pve1\n", "")}),
    ("host-in-both-groups", {"hosts.yml": GOOD.replace("        pve1:\n", "        pve1:\n        ct1:\n", 1)}),
    ("port-as-string", {"hosts.yml": GOOD, "group_vars/all.yml": "proxmox_api_port: '8006'\n"}),
    ("validate-certs-string", {"hosts.yml": GOOD, "group_vars/all.yml": "proxmox_api_validate_certs: 'no'\n"}),
    ("api-user-without-realm", {"hosts.yml": GOOD, "group_vars/all.yml": "proxmox_api_user: root\n"}),
    (
        "wrong-type-from-parent-group",
        {
            "hosts.yml": GOOD + "    parent:\n      children:\n        gpu_containers:\n",
            "group_vars/parent.yml": "proxmox_api_port: [8006]\n",
        },
    ),
    ("group-vars-syntax-error", {"hosts.yml": GOOD, "group_vars/all.yml": "a: 1\n  b: : c\n"}),
    ("group-vars-is-a-list", {"hosts.yml": GOOD, "group_vars/all.yml": "- a\n- b\n"}),
    ("host-vars-syntax-error", {"hosts.yml": GOOD, "host_vars/ct1.yml": "x: [\n"}),
    ("vaulted-file-without-password", {"hosts.yml": GOOD, "group_vars/all/vault.yml": "VAULT"}),
    ("inline-vault-without-password", {"hosts.yml": GOOD, "group_vars/all/key.yml": "INLINE_VAULT"}),
    ("host-key-checking-off-in-inventory", {"hosts.yml": GOOD, GV: "ansible_host_key_checking: false\n"}),
    ("strict-host-key-checking-off-in-args", {"hosts.yml": GOOD, GV: "ansible_ssh_args: -o StrictHostKeyChecking=no"}),
    ("ssh-host-key-checking-var-off", {"hosts.yml": GOOD, GV: "ansible_ssh_host_key_checking: false\n"}),
    ("host-key-checking-off-as-a-word", {"hosts.yml": GOOD, GV: "ansible_host_key_checking: 'off'\n"}),
    ("accept-new-host-keys", {"hosts.yml": GOOD, GV: "ansible_ssh_extra_args: -o StrictHostKeyChecking=accept-new"}),
    ("secret-of-the-wrong-type", {"hosts.yml": GOOD, GV: "proxmox_api_password: 98765432\n"}),
    ("whole-pve-token-in-token-id", {"hosts.yml": GOOD, GV: f"proxmox_api_token_id: '{PVE_TOKEN}'\n"}),
    ("hf-token-in-a-port", {"hosts.yml": GOOD, GV: f"proxmox_api_port: {HF_TOKEN}\n"}),
    ("local-connection-in-a-managed-group", {"hosts.yml": GOOD, "host_vars/pve1.yml": "ansible_connection: local\n"}),
    ("yaml-alias-bomb", {"hosts.yml": GOOD, GV: ALIAS_BOMB}),
    ("lock-lease-negative", {"hosts.yml": GOOD, GV: "provision_state_lock_lease_s: -1\n"}),
    ("serving-port-out-of-range", {"hosts.yml": GOOD, "host_vars/ct1.yml": "sglang_port: 70000\n"}),
    (
        "collection-plugin-not-installed",
        {"pve.yml": "plugin: community.proxmox.proxmox\nurl: https://192.0.2.1:8006\n"},
    ),
]

FLAGS = [
    ("inventory-name-not-found", ["inventory", "check", "-i", "nosuch"]),
    ("inventory-path-missing", ["inventory", "check", "-i", "./no/such/dir"]),
    ("runs-dir-is-a-file", ["apply", "-i", "INV", "--yes", "--runs-dir", "FILE"]),
    ("apply-without-yes-and-no-terminal", ["apply", "-i", "INV"]),
    ("flag-abbreviation", ["plan", "-i", "INV", "--lim", "pve1"]),
    ("runs-dir-inside-the-inventory", ["plan", "-i", "INV", "--runs-dir", "INV/runs"]),
    ("rollback-without-yes-and-no-terminal", ["rollback", "-i", "INV", "--limit", "pve1"]),
    ("junit-unwritable", ["verify", "-i", "INV", "--junit", "/nonexistent-dir/verify.xml"]),
    ("session-tokens-abc", ["capacity", "-i", "INV", "--session-tokens", "abc"]),
    ("concurrency-zero", ["bench", "-i", "INV", "--concurrency", "0"]),
    ("concurrency-letters", ["bench", "-i", "INV", "--concurrency", "a,b"]),
    ("threshold-too-big", ["bench", "-i", "INV", "--threshold", "2"]),
    ("input-len-negative", ["bench", "-i", "INV", "--input-len", "-1"]),
    ("input-len-text", ["bench", "-i", "INV", "--input-len", "many"]),
    ("baseline-missing", ["bench", "-i", "INV", "--baseline", "/nonexistent.json"]),
    ("unknown-tag", ["apply", "-i", "INV", "--yes", "--tags", "nosuch"]),
    ("bad-reboot-choice", ["apply", "-i", "INV", "--yes", "--reboot", "sometimes"]),
    ("unknown-flag", ["apply", "-i", "INV", "--frobnicate"]),
    ("missing-inventory", ["plan"]),
    ("vault-password-file-missing", ["plan", "-i", "INV", "--vault-password-file", "/nonexistent"]),
    ("vault-id-file-missing", ["plan", "-i", "INV", "--vault-id", "dev@/nonexistent"]),
    ("inline-vault-wrong-password", ["verify", "-i", "VAULTED", "--vault-password-file", "WRONG_PASSWORD"]),
    ("limit-matches-nothing", ["plan", "-i", "INV", "--limit", "nosuch"]),
    ("limit-empty", ["apply", "-i", "INV", "--yes", "--limit", ""]),
    ("limit-blank", ["verify", "-i", "INV", "--limit", " "]),
    ("limit-part-matches-nothing", ["apply", "-i", "INV", "--yes", "--limit", "pve1,typo"]),
    ("limit-exclusion-matches-nothing", ["plan", "-i", "INV", "--limit", "all:!typo"]),
    ("limit-file-missing", ["plan", "-i", "INV", "--limit", "@no-such-limit-file"]),
    ("limit-file-line-matches-nothing", ["plan", "-i", "INV", "--limit", "@LIMITFILE"]),
    ("tags-empty", ["apply", "-i", "INV", "--yes", "--tags", ""]),
    ("tags-only-commas", ["plan", "-i", "INV", "--tags", ", ,"]),
    ("rollback-without-limit", ["rollback", "-i", "INV", "--yes"]),
    ("retire-without-limit", ["retire", "-i", "INV", "--yes"]),
    ("retire-without-yes-and-no-terminal", ["retire", "-i", "INV", "--limit", "ct1"]),
    ("retire-node-without-its-container", ["retire", "-i", "INV", "--yes", "--limit", "pve1"]),
    ("unknown-command", ["frobnicate"]),
    ("lab-hosts-3", ["lab", "up", "--hosts", "3"]),
    ("diag-unknown-flag", ["diag", "-i", "INV", "--frob"]),
    ("vault-id-prompt", ["plan", "-i", "INV", "--vault-id", "dev@prompt"]),
    ("runs-dir-dangling-link", ["plan", "-i", "INV", "--runs-dir", "DANGLING"]),
    ("vault-password-given-as-its-file", ["plan", "-i", "INV", "--vault-password-file", VAULT_PASSWORD]),
    ("vault-password-given-as-a-vault-id", ["plan", "-i", "INV", "--vault-id", f"prod@{VAULT_PASSWORD}"]),
    ("whole-pve-token-as-the-inventory", ["inventory", "check", "-i", PVE_TOKEN]),
]


# Settings of the user's environment or ./ansible.cfg that would silently change what provision runs:
# (case, environment variables, ansible.cfg text)
ENVIRONMENTS = [
    ("env-skip-tags", {"ANSIBLE_SKIP_TAGS": "sglang"}, None),
    ("env-run-tags", {"ANSIBLE_RUN_TAGS": "sglang"}, None),
    ("cfg-skip-tags", {}, "[tags]\nskip = sglang\n"),
    ("env-keep-remote-files", {"ANSIBLE_KEEP_REMOTE_FILES": "1"}, None),
    ("cfg-keep-remote-files", {}, "[defaults]\nkeep_remote_files = True\n"),
    ("env-transport-local", {"ANSIBLE_TRANSPORT": "local"}, None),
    ("cfg-transport-local", {}, "[defaults]\ntransport = ansible.builtin.local\n"),
    ("env-transport-mitogen-local", {"ANSIBLE_TRANSPORT": "mitogen_local"}, None),
    ("env-hash-merge", {"ANSIBLE_HASH_BEHAVIOUR": "merge"}, None),
    ("cfg-task-debugger", {}, "[defaults]\nenable_task_debugger = True\n"),
    ("env-debug-strategy", {"ANSIBLE_STRATEGY": "debug"}, None),
    ("env-any-errors-fatal", {"ANSIBLE_ANY_ERRORS_FATAL": "yes"}, None),
]
_NARROWS = "would silently leave tasks of provision's run out: remove it, and choose phases with --tags"
_KEEPS = "would leave every task's module on the hosts with its arguments, secrets among them: remove it"
_PROMPT = "would stop a failed task at a debugger prompt that nobody answers in provision's runs: remove it"
_LOCAL = (
    "would run every host's tasks, reboots included, on this controller: remove it, provision reaches its "
    "hosts over ssh"
)


# What the user sees for each case: its one error line, `…` for what varies (the test's directory), and the
# class of hostile input it belongs to (docs/reliability.md).
SEES = {
    "children-as-list": (
        "the inventory as Ansible reads it",
        '…: Invalid "children" entry for "all" group, requires a dictionary, found "list" instead.',
    ),
    "integer-group-key": (
        "the inventory as Ansible reads it",
        "…: Unable to add group 123: Invalid group name supplied, expected a string but got int for 123",
    ),
    "deep-nesting-5000": (
        "the inventory as Ansible reads it",
        "…:1000: YAML parsing failed: Colons in unquoted values must be followed by a non-space character.",
    ),
    "vars-as-list": (
        "the inventory as Ansible reads it",
        '…: Invalid "vars" entry for "gpu_containers" group, requires a dictionary, found "list" instead.',
    ),
    "host-name-with-newline": (
        "the inventory as Ansible reads it",
        "…: host 'ct\\n1': a host name may not contain whitespace or control characters",
    ),
    "host-name-with-space": (
        "the inventory as Ansible reads it",
        "…: host 'ct 1': a host name may not contain whitespace or control characters",
    ),
    "top-level-list": (
        "the inventory as Ansible reads it",
        "…: YAML inventory has invalid structure, it should be a dictionary, got: list",
    ),
    "empty-file": ("the inventory as Ansible reads it", "…: no hosts: Ansible read it as an empty inventory"),
    "yaml-syntax-error": (
        "the inventory as Ansible reads it",
        "…:12: YAML parsing failed: While parsing a flow sequence did not find expected ',' or ']'.",
    ),
    "hosts-as-list": (
        "the inventory as Ansible reads it",
        "…:6: YAML parsing failed: Mapping values are not allowed in this context.",
    ),
    "unknown-group-key": (
        "the inventory as Ansible reads it",
        '…: Skipping unexpected key (host) in group (proxmox_hosts), only "vars", "children" and "hosts" are valid',
    ),
    "ini-unclosed-section": (
        "the inventory as Ansible reads it",
        "…: Failed to parse inventory: not enough values to unpack (expected 3, got 2)",
    ),
    "ini-range-without-end": (
        "the inventory as Ansible reads it",
        "…: Failed to parse inventory: host range must specify end value",
    ),
    "ini-bad-assignment": (
        "the inventory as Ansible reads it",
        "…: Failed to parse inventory: Expected key=value host variable assignment, got: ansible_port",
    ),
    "binary-file": (
        "the inventory as Ansible reads it",
        "…: Failed to parse inventory: Error parsing host definition "
        "'!\"#$%&'()*+,-./0123456789:;<=>?@ABCDEFGHIJKLMNOPQRSTUVWXYZ[…",
    ),
    "unknown-inventory-plugin": (
        "the inventory as Ansible reads it",
        "…: inventory config '…' specifies unknown plugin 'nosuch.col.plug'",
    ),
    "vmid-string": (
        "values checked before the run",
        "…:11: host ct1: proxmox_vmid: expected an integer, got '110' (str)",
    ),
    "vmid-float": (
        "values checked before the run",
        "…:11: host ct1: proxmox_vmid: expected an integer, got 110.5 (float)",
    ),
    "vmid-bool": ("values checked before the run", "…: host ct1: proxmox_vmid: expected an integer, got True (bool)"),
    "vmid-too-small": (
        "values checked before the run",
        "…:11: host ct1: proxmox_vmid: 99 is out of range 100..999999999",
    ),
    "vmid-duplicate": (
        "values checked before the run",
        "…:14: host ct2: proxmox_vmid: 110 is already used by ct1 on node pve1",
    ),
    "vmid-missing": ("values checked before the run", "…:9: host ct1: proxmox_vmid: missing (the container's VMID)"),
    "node-unknown": (
        "values checked before the run",
        "…:10: host ct1: proxmox_host: 'pve9' is not a host in proxmox_hosts",
    ),
    "node-missing": ("values checked before the run", "…:9: host ct1: proxmox_host: missing (name its PVE node)"),
    "host-in-both-groups": (
        "values checked before the run",
        "…: host ct1: is in both proxmox_hosts and gpu_containers",
    ),
    "port-as-string": (
        "values checked before the run",
        "…:1: hosts ct1, pve1: proxmox_api_port: expected an integer port from 1 to 65535, got '8006' (str)",
    ),
    "validate-certs-string": (
        "values checked before the run",
        "…:1: hosts ct1, pve1: proxmox_api_validate_certs: expected true or false, got 'no' (str)",
    ),
    "api-user-without-realm": (
        "values checked before the run",
        "…:1: hosts ct1, pve1: proxmox_api_user: expected a PVE user with its realm, e.g. root@pam, got 'root' (str)",
    ),
    "wrong-type-from-parent-group": (
        "values checked before the run",
        "…:1: host ct1: proxmox_api_port: expected an integer port from 1 to 65535, got [8006] (list)",
    ),
    "group-vars-syntax-error": (
        "the inventory as Ansible reads it",
        "…:2: YAML parsing failed: Colons in unquoted values must be followed by a non-space character.",
    ),
    "group-vars-is-a-list": (
        "the inventory as Ansible reads it",
        "…: Could not process '…': failed to combine variables, expected dicts but got a 'dict' and a 'list'.",
    ),
    "host-vars-syntax-error": (
        "the inventory as Ansible reads it",
        "…:2: YAML parsing failed: While parsing a flow node did not find expected node content.",
    ),
    "vaulted-file-without-password": (
        "secrets",
        f"…: cannot decrypt: Attempting to decrypt but no vault secrets found. ({GIVE_THE_VAULT_PASSWORD})",
    ),
    "host-key-checking-off-in-inventory": (
        "trust",
        "…: hosts ct1, pve1: ansible_host_key_checking turns host key checking off; provision keeps it on: "
        "remove that setting, or pass --no-host-key-checking to accept any host key",
    ),
    "strict-host-key-checking-off-in-args": (
        "trust",
        "…:1: hosts ct1, pve1: ssh_args turns ssh host key checking off; provision keeps it on: remove "
        "that setting, or pass --no-host-key-checking to accept any host key",
    ),
    "ssh-host-key-checking-var-off": (
        "trust",
        "…: hosts ct1, pve1: ansible_ssh_host_key_checking turns host key checking off; provision keeps it "
        "on: remove that setting, or pass --no-host-key-checking to accept any host key",
    ),
    "host-key-checking-off-as-a-word": (
        "trust",
        "…:1: hosts ct1, pve1: ansible_host_key_checking turns host key checking off; provision keeps it "
        "on: remove that setting, or pass --no-host-key-checking to accept any host key",
    ),
    "accept-new-host-keys": (
        "trust",
        "…:1: hosts ct1, pve1: ssh_extra_args turns ssh host key checking off; provision keeps it on: "
        "remove that setting, or pass --no-host-key-checking to accept any host key",
    ),
    "secret-of-the-wrong-type": (
        "secrets",
        "…:1: hosts ct1, pve1: proxmox_api_password: expected a string (from vault or the environment), "
        "got a value of type int",
    ),
    "whole-pve-token-in-token-id": (
        "secrets",
        "…:1: hosts ct1, pve1: proxmox_api_token_id: expected the token name only, e.g. provision (the "
        "user comes from proxmox_api_user), got 'root@pam!provision=********' (str)",
    ),
    "hf-token-in-a-port": (
        "secrets",
        "…:1: hosts ct1, pve1: proxmox_api_port: expected an integer port from 1 to 65535, got '********' (str)",
    ),
    "local-connection-in-a-managed-group": (
        "values checked before the run",
        "…:1: host pve1: ansible_connection: local would run its tasks, reboots included, on this controller: remove "
        "it, provision reaches its hosts over ssh",
    ),
    "yaml-alias-bomb": (
        "values checked before the run",
        "…:2: hosts ct1, pve1: sglang_extra_args: its value holds more than 10000 items once its YAML aliases are "
        "expanded: nothing provision runs needs that many",
    ),
    "lock-lease-negative": (
        "values checked before the run",
        "…:1: hosts ct1, pve1: provision_state_lock_lease_s: -1 is less than 1 (it counts seconds, tries or items)",
    ),
    "serving-port-out-of-range": (
        "values checked before the run",
        "…:1: host ct1: sglang_port: 70000 is not a port (1 to 65535)",
    ),
    "collection-plugin-not-installed": (
        "the inventory as Ansible reads it",
        "…: inventory config '…' specifies unknown plugin 'community.proxmox.proxmox'",
    ),
    "inventory-name-not-found": (
        "files on the controller",
        "inventory 'nosuch' not found: looked for ./nosuch and ./inventory/nosuch/ in … pass a path, or "
        "--inventory example for the packaged example",
    ),
    "inventory-path-missing": ("files on the controller", "./no/such/dir: inventory not found"),
    "runs-dir-is-a-file": ("files on the controller", "provision apply: argument --runs-dir: … is not a directory"),
    "apply-without-yes-and-no-terminal": (
        "the command line",
        "apply changes hosts and may reboot them: pass --yes to confirm (no terminal to ask)",
    ),
    "flag-abbreviation": ("the command line", "provision: unrecognized arguments: --lim pve1"),
    "runs-dir-inside-the-inventory": (
        "files on the controller",
        "the runs dir … is inside the inventory …: keep run records outside it (--runs-dir, or PROVISION_RUNS_DIR)",
    ),
    "rollback-without-yes-and-no-terminal": (
        "the command line",
        "rollback changes hosts and may reboot them: pass --yes to confirm (no terminal to ask)",
    ),
    "junit-unwritable": (
        "files on the controller",
        "provision verify: argument --junit: /nonexistent-dir does not exist",
    ),
    "session-tokens-abc": (
        "the command line",
        "--session-tokens 'abc': expected token counts separated by commas, e.g. 32768,131072",
    ),
    "concurrency-zero": ("the command line", "--concurrency '0': every level must be 1 or more"),
    "concurrency-letters": (
        "the command line",
        "--concurrency 'a,b': expected comma-separated whole numbers, e.g. 1,4,16",
    ),
    "threshold-too-big": ("the command line", "--threshold must be between 0 and 1 (got 2.0)"),
    "input-len-negative": ("the command line", "--input-len must be 1 or more (got -1)"),
    "input-len-text": ("the command line", "provision bench: argument --input-len: invalid int value: 'many'"),
    "baseline-missing": (
        "files on the controller",
        "--baseline /nonexistent.json: cannot read it: No such file or directory",
    ),
    "unknown-tag": (
        "scope",
        "--tags: unknown phase(s) nosuch; choose from kernel, driver, gpu, sglang, gateway, verify; or parts of one: "
        "sglang_install, weights, sglang_service",
    ),
    "bad-reboot-choice": (
        "the command line",
        "provision apply: argument --reboot: invalid choice: 'sometimes' (choose from 'auto', 'never')",
    ),
    "unknown-flag": ("the command line", "provision: unrecognized arguments: --frobnicate"),
    "missing-inventory": ("the command line", "provision plan: the following arguments are required: --inventory/-i"),
    "inline-vault-without-password": (
        "secrets",
        "…/group_vars/all/key.yml:1: hosts ct1, pve1: sglang_api_key: cannot decrypt its !vault value: Attempting to "
        f"decrypt but no vault secrets found ({GIVE_THE_VAULT_PASSWORD})",
    ),
    "inline-vault-wrong-password": (
        "secrets",
        "…/group_vars/all/key.yml:1: hosts ct1, pve1: sglang_api_key: cannot decrypt its !vault value: "
        f"Decryption failed (no vault secrets were found that could decrypt) ({GIVE_THE_VAULT_PASSWORD})",
    ),
    "vault-password-file-missing": (
        "secrets",
        "--vault-password-file: no such readable file (the argument is not shown: it names no file, and "
        "may be the password itself)",
    ),
    "vault-id-file-missing": (
        "secrets",
        "--vault-id dev@…: no such password file or script (the argument is not shown: it names no file, "
        "and may be the password itself)",
    ),
    "limit-matches-nothing": (
        "scope",
        "--limit nosuch matches no host in proxmox_hosts, gpu_containers or sglang_gateways of …: nothing runs "
        "until every part of it names a host",
    ),
    "limit-empty": (
        "scope",
        "provision apply: argument --limit/-l: is empty: it would reach every host of the inventory; name "
        "the hosts, or leave --limit out",
    ),
    "limit-blank": (
        "scope",
        "provision verify: argument --limit/-l: is empty: it would reach every host of the inventory; name "
        "the hosts, or leave --limit out",
    ),
    "limit-part-matches-nothing": (
        "scope",
        "--limit pve1,typo: 'typo' matches no host in proxmox_hosts, gpu_containers or sglang_gateways of …: "
        "nothing runs until every part of it names a host",
    ),
    "limit-exclusion-matches-nothing": (
        "scope",
        "--limit all:!typo: 'typo' matches no host in proxmox_hosts, gpu_containers or sglang_gateways of …: "
        "nothing runs until every part of it names a host",
    ),
    "limit-file-missing": ("scope", "--limit @…: cannot read the limit file: No such file or directory"),
    "limit-file-line-matches-nothing": (
        "scope",
        "--limit @…: 'typo' matches no host in proxmox_hosts, gpu_containers or sglang_gateways of …: nothing runs "
        "until every part of it names a host",
    ),
    "tags-empty": (
        "scope",
        "--tags is empty: it would run every phase; name phases (kernel, driver, gpu, sglang, gateway, verify) or "
        "leave it out",
    ),
    "tags-only-commas": (
        "scope",
        "--tags is empty: it would run every phase; name phases (kernel, driver, gpu, sglang, gateway, verify) or "
        "leave it out",
    ),
    "rollback-without-limit": (
        "scope",
        "rollback needs --limit HOST: roll back the nodes you mean, by name or pattern",
    ),
    "retire-without-limit": (
        "scope",
        "retire needs --limit HOST: name the containers (and nodes) to retire, by name or pattern",
    ),
    "retire-without-yes-and-no-terminal": (
        "the command line",
        "retire stops and removes the SGLang service, the GPU entries and the kernel arguments: pass --yes to "
        "confirm (no terminal to ask)",
    ),
    "retire-node-without-its-container": (
        "scope",
        "retire: node pve1 runs ct1 of the inventory, outside --limit: retire it with the node, or leave the node out",
    ),
    "unknown-command": (
        "the command line",
        "provision: argument COMMAND: invalid choice: 'frobnicate' (choose from 'apply', 'rollback', 'retire', "
        "'plan', 'verify', 'capacity', 'diag', 'bench', 'lab', 'inventory')",
    ),
    "lab-hosts-3": ("the command line", "provision lab up: argument --hosts: invalid choice: 3 (choose from 1, 2)"),
    "diag-unknown-flag": ("the command line", "provision: unrecognized arguments: --frob"),
    "vault-id-prompt": (
        "secrets",
        "--vault-id dev@prompt: provision cannot prompt for a vault password (its runs have no terminal); "
        "give a password file or script instead",
    ),
    "runs-dir-dangling-link": (
        "files on the controller",
        "--runs-dir …: cannot create a run record there: File exists",
    ),
    "vault-password-given-as-its-file": (
        "secrets",
        "--vault-password-file: no such readable file (the argument is not shown: it names no file, and "
        "may be the password itself)",
    ),
    "vault-password-given-as-a-vault-id": (
        "secrets",
        "--vault-id prod@…: no such password file or script (the argument is not shown: it names no file, "
        "and may be the password itself)",
    ),
    "whole-pve-token-as-the-inventory": (
        "secrets",
        "inventory 'root@pam!provision=********' not found: looked for ./root@pam!provision=******** and "
        "./inventory/root@pam!pro…",
    ),
    "env-skip-tags": ("the environment", f"env: ANSIBLE_SKIP_TAGS: tags_skip = sglang {_NARROWS}"),
    "env-run-tags": ("the environment", f"env: ANSIBLE_RUN_TAGS: tags_run = sglang {_NARROWS}"),
    "cfg-skip-tags": ("the environment", f"…/ansible.cfg: tags_skip = sglang {_NARROWS}"),
    "env-keep-remote-files": (
        "the environment",
        f"env: ANSIBLE_KEEP_REMOTE_FILES: default_keep_remote_files = True {_KEEPS}",
    ),
    "cfg-keep-remote-files": ("the environment", f"…/ansible.cfg: default_keep_remote_files = True {_KEEPS}"),
    "env-transport-local": ("the environment", f"env: ANSIBLE_TRANSPORT: default_transport = local {_LOCAL}"),
    "env-transport-mitogen-local": (
        "the environment",
        f"env: ANSIBLE_TRANSPORT: default_transport = mitogen_local {_LOCAL}",
    ),
    "cfg-transport-local": ("the environment", f"…/ansible.cfg: default_transport = ansible.builtin.local {_LOCAL}"),
    "env-hash-merge": (
        "the environment",
        "env: ANSIBLE_HASH_BEHAVIOUR: default_hash_behaviour = merge would merge "
        "dictionaries from the inventory's layers where the roles expect the nearest one to win: remove it",
    ),
    "cfg-task-debugger": ("the environment", f"…/ansible.cfg: enable_task_debugger = True {_PROMPT}"),
    "env-debug-strategy": ("the environment", f"env: ANSIBLE_STRATEGY: default_strategy = debug {_PROMPT}"),
    "env-any-errors-fatal": (
        "the environment",
        "env: ANSIBLE_ANY_ERRORS_FATAL: any_errors_fatal = True would stop "
        "the gpu, sglang and verify phases on every host at one host's failure, where provision finishes the others "
        "and reports each: remove it",
    ),
}

NOT_CONTACTED = "nothing contacted, no run record"


def _row(case: str, test: str) -> Row:
    kind, sees = SEES[case]
    return Row(
        case.replace("-", " "),
        "before any run",
        f"`error: {sees}`, exit 2 (the same in `--json`)",
        NOT_CONTACTED,
        NOT_SHOWN,
        f"tests/unit/provision/test_cli_bad_inputs.py::{test}[{case}]",
        True,
        False,
        "hostile input: " + kind,
    )


# The --json and exit-code contract under a hostile stdout or signal: (fault, what the user sees, test)
_CONTRACT = [
    (
        "stdout closed by its reader before anything is written (`--json`)",
        "`error: stdout was closed before the JSON envelope was written`, the command's own exit code",
        "test_a_reader_that_closes_stdout_early_gets_no_traceback_and_the_real_exit_code",
    ),
    (
        "stdout on a full file (`/dev/full`), with and without `--json`",
        "`error: stdout could not be written (No space left on device): … is not there`, exit 1",
        "test_a_full_stdout_gets_one_line_on_stderr_and_no_traceback",
    ),
    (
        "stdout closed at the start (`>&-`), with `--json`",
        "`error: stdout could not be written (stdout is closed): the JSON envelope is not there`, exit 1",
        "test_a_closed_stdout_or_stderr_gets_no_traceback[stdout]",
    ),
    (
        "stderr closed at the start (`2>&-`), with `--json`",
        "the envelope on stdout, the command's own exit code",
        "test_a_closed_stdout_or_stderr_gets_no_traceback[stderr]",
    ),
    (
        "`ANSIBLE_DEBUG=1`, and `--junit /dev/stdout`, with `--json`",
        "one JSON document on stdout; Ansible's debug lines and the JUnit file on stderr",
        "test_ansible_debug_and_a_junit_file_on_stdout_leave_the_json_envelope_alone_there",
    ),
    (
        "SIGTERM before any run",
        "`error: stopped by SIGTERM before any host was changed`, the envelope, exit 143",
        "test_a_signal_outside_a_run_ends_the_command_with_its_line_envelope_and_code[SIGTERM]",
    ),
    (
        "SIGHUP before any run",
        "`error: stopped by SIGHUP before any host was changed`, the envelope, exit 129",
        "test_a_signal_outside_a_run_ends_the_command_with_its_line_envelope_and_code[SIGHUP]",
    ),
]

FAULT_ROWS = (
    [_row(c[0], "test_bad_inventory") for c in INVENTORIES]
    + [_row(c[0], "test_bad_flag") for c in FLAGS]
    + [_row(c[0], "test_environment_that_would_silently_change_the_run") for c in ENVIRONMENTS]
    + [
        Row(
            fault,
            "before any run",
            sees,
            NOT_CONTACTED,
            NOT_SHOWN,
            f"tests/unit/provision/test_cli_bad_inputs.py::{test}",
            True,
            False,
            "hostile input: the --json and exit-code contract",
        )
        for fault, sees, test in _CONTRACT
    ]
)


def _pattern(sees: str) -> re.Pattern:
    return re.compile("error: " + ".+?".join(re.escape(part) for part in sees.split("…")))


def _write(root: Path, files: dict[str, str | bytes]) -> None:
    """The inventory's files; its containers get the model path the roles require, and both groups the PVE API's
    address and password (tests/conftest.py), unless the case writes their group_vars itself."""
    api = {} if any("proxmox_api_" in str(c) for c in files.values()) else API_VARS  # the case's own, else these
    if "group_vars/gpu_containers.yml" not in files:
        files = {**files, "group_vars/gpu_containers.yml": yaml.safe_dump({**CONTAINER_VARS, **api})}
    if api and "group_vars/proxmox_hosts.yml" not in files:
        files = {**files, "group_vars/proxmox_hosts.yml": yaml.safe_dump(api)}
    for name, content in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        if content == "VAULT":
            path.write_text("v: 1\n")
            vault_encrypt(path, _password_file(root))
        elif content == "INLINE_VAULT":
            path.write_text(vault_encrypt_string("sglang_api_key", "inline-key-" + "7c1d9e", _password_file(root)))
        elif isinstance(content, bytes):
            path.write_bytes(content)
        else:
            path.write_text(textwrap.dedent(content))


def _password_file(root: Path) -> str:
    path = root.parent / "vault-pass"
    path.write_text("pw-123456\n")
    return str(path)


def _run(argv: list[str], capsys) -> tuple[int, list[str], str]:
    code = cli.main(argv)
    captured = capsys.readouterr()
    return code, captured.err.strip().splitlines(), captured.out


def _assert_usage_error(argv: list[str], capsys, runs: Path, one_line: bool = True, sees: str = "") -> None:
    code, err, _ = _run(argv, capsys)
    assert code == 2, (argv, err)
    assert err and all(line.startswith("error: ") for line in err), err
    assert not one_line or len(err) == 1, err
    assert not sees or _pattern(sees).fullmatch(err[0]), (sees, err)
    assert "Traceback" not in "\n".join(err)
    code, err_json, out = _run([*argv, "--json"], capsys)
    envelope = json.loads(out)
    assert code == 2 and envelope["exit_code"] == 2 and envelope["ok"] is False
    assert envelope["errors"] == [line.removeprefix("error: ") for line in err_json]
    assert not runs.exists(), "a run record was made for a bad input"
    shown = "\n".join(err + err_json) + out
    assert not [secret for secret in NEVER_PRINTED if secret in shown], f"a secret was printed: {shown}"


@pytest.fixture
def workdir(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    return tmp_path


@pytest.mark.parametrize(("case", "files"), INVENTORIES, ids=[c[0] for c in INVENTORIES])
def test_bad_inventory(workdir, capsys, case, files):
    root, sees = workdir / "inv", SEES[case][1]
    _write(root, files)
    _assert_usage_error(["inventory", "check", "-i", str(root)], capsys, workdir / "runs", sees=sees)
    _assert_usage_error(
        ["plan", "-i", str(root), "--runs-dir", str(workdir / "runs")], capsys, workdir / "runs", sees=sees
    )


@pytest.mark.parametrize(("case", "argv"), FLAGS, ids=[c[0] for c in FLAGS])
def test_bad_flag(workdir, capsys, case, argv):
    _write(workdir / "inv", {"hosts.yml": GOOD})
    (workdir / "a-file").write_text("x")
    (workdir / "dangling").symlink_to(workdir / "nowhere")
    (workdir / "limit-file").write_text("pve1\nct1\ntypo\n")
    if "VAULTED" in argv:  # an inline !vault value, and a password file that holds another password
        _write(workdir / "vaulted", {"hosts.yml": GOOD, "group_vars/all/key.yml": "INLINE_VAULT"})
        (workdir / "wrong-password").write_text("not-the-password\n")
    names = {
        "INV": workdir / "inv",
        "FILE": workdir / "a-file",
        "DANGLING": workdir / "dangling",
        "@LIMITFILE": "@limit-file",
        "INV/runs": workdir / "inv" / "runs",
        "VAULTED": workdir / "vaulted",
        "WRONG_PASSWORD": workdir / "wrong-password",
    }
    argv = [str(names.get(a, a)) for a in argv]
    runs = workdir / "runs"
    recording = ("apply", "plan", "verify", "capacity", "bench", "rollback", "retire", "diag")
    if "--runs-dir" not in argv and argv[0] in recording:
        argv += ["--runs-dir", str(runs)]
    _assert_usage_error(argv, capsys, runs, sees=SEES[case][1])


def test_an_ansible_cfg_ansible_cannot_read_is_a_usage_error_naming_it(tmp_path):
    """Ansible reads ./ansible.cfg when it is first imported: a fresh process, as a user runs it."""
    tmp_path.chmod(0o755)
    _write(tmp_path / "inv", {"hosts.yml": GOOD})
    (tmp_path / "ansible.cfg").write_text("[defaults\nforks = 5\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("ANSIBLE_")}
    proc = subprocess.run(
        [sys.executable, "-m", "provision", "inventory", "check", "-i", "inv", "--json"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env=env,
    )
    assert proc.returncode == 2 and len(proc.stderr.splitlines()) == 1, proc.stderr
    said = "error: Ansible cannot read its configuration: Error reading config file"
    assert proc.stderr.startswith(f"{said} ({tmp_path}/ansible.cfg)"), proc.stderr
    assert json.loads(proc.stdout)["exit_code"] == 2


@pytest.mark.parametrize(
    ("cfg", "env", "said"),
    [
        (
            "[defaults]\nforks = banana\n",
            {},
            "{cfg} [defaults] forks: Config 'DEFAULT_FORKS' from "
            "'{cfg}' has an invalid value: Invalid value provided for 'integer': 'banana'",
        ),
        (
            "[defaults]\nforks = 3\n",
            {"ANSIBLE_FORKS": "-x"},
            "$ANSIBLE_FORKS: Config 'DEFAULT_FORKS' from 'env: ANSIBLE_FORKS' has an "
            "invalid value: Invalid value provided for 'integer': '-x'",
        ),
        (
            "",
            {"ANSIBLE_GATHERING": "sometimes"},
            "$ANSIBLE_GATHERING: Invalid value 'sometimes' for config "
            "'DEFAULT_GATHERING'. It takes: implicit, explicit, smart.",
        ),
    ],
    ids=["cfg-forks", "env-forks", "env-choice"],
)
def test_a_setting_ansible_refuses_is_a_usage_error_naming_where_it_is_set(tmp_path, cfg, env, said):
    """Ansible checks its settings when it is first imported: a fresh process, as a user runs it. The line names the
    file and its [section] key, or the environment variable, and the values a setting with a list of them takes."""
    tmp_path.chmod(0o755)
    _write(tmp_path / "inv", {"hosts.yml": GOOD})
    if cfg:
        (tmp_path / "ansible.cfg").write_text(cfg)
    clean = {k: v for k, v in os.environ.items() if not k.startswith("ANSIBLE_")}
    proc = subprocess.run(
        [sys.executable, "-m", "provision", "inventory", "check", "-i", "inv", "--json"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env={**clean, **env},
    )
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.splitlines() == [f"error: {said.format(cfg=tmp_path / 'ansible.cfg')}"]
    assert json.loads(proc.stdout)["exit_code"] == 2


def test_a_reader_that_closes_stdout_early_gets_no_traceback_and_the_real_exit_code(tmp_path):
    _write(tmp_path / "inv", {"hosts.yml": GOOD})
    read, write = os.pipe()
    os.close(read)  # the consumer is gone before provision writes a byte
    try:
        proc = subprocess.run(
            [sys.executable, "-m", "provision", "inventory", "check", "-i", "inv", "--json"],
            stdout=write,
            stderr=subprocess.PIPE,
            text=True,
            cwd=tmp_path,
        )
    finally:
        os.close(write)
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr.splitlines() == ["error: stdout was closed before the JSON envelope was written"]


def test_a_full_stdout_gets_one_line_on_stderr_and_no_traceback(tmp_path):
    """stdout on /dev/full (every write fails with ENOSPC), as a full disk under `--json > out.json` does."""
    _write(tmp_path / "inv", {"hosts.yml": GOOD})
    said = {}
    for json_flag in ([], ["--json"]):
        with open("/dev/full", "w") as full:
            proc = subprocess.run(
                [sys.executable, "-m", "provision", "inventory", "check", "-i", "inv", *json_flag],
                stdout=full,
                stderr=subprocess.PIPE,
                text=True,
                cwd=tmp_path,
            )
        assert "Traceback" not in proc.stderr
        # the last line: before it, Ansible may warn that it cannot reconfigure a stream it cannot seek (/dev/full)
        said[bool(json_flag)] = (proc.returncode, proc.stderr.splitlines()[-1:])
    what = "stdout could not be written (No space left on device): {} is not there"
    # the file a script would read the result from is empty: the command fails, whatever it did
    assert said[True] == (1, ["error: " + what.format("the JSON envelope")])
    assert said[False] == (1, ["error: " + what.format("the output")])


@pytest.mark.parametrize("closed", [1, 2], ids=["stdout", "stderr"])
def test_a_closed_stdout_or_stderr_gets_no_traceback(tmp_path, closed):
    """Started with descriptor 1 or 2 closed (`>&-`, `2>&-`): Python has no sys.stdout (or sys.stderr) then; the
    command still runs and exits with its code, and what it can write goes where it can."""
    _write(tmp_path / "inv", {"hosts.yml": GOOD})
    argv = [sys.executable, "-m", "provision", "inventory", "check", "-i", "inv", "--json"]
    proc = subprocess.run(
        argv, cwd=tmp_path, capture_output=True, text=True, pass_fds=(), preexec_fn=lambda: os.close(closed)
    )
    assert "Traceback" not in proc.stdout + proc.stderr, proc.stdout + proc.stderr
    if closed == 2:
        assert proc.returncode == 0 and json.loads(proc.stdout)["ok"] is True
    else:
        assert proc.returncode == 1 and proc.stderr.splitlines()[-1:] == [
            "error: stdout could not be written (stdout is closed): the JSON envelope is not there"
        ], proc.stderr


def test_main_in_process_gives_descriptor_1_back_and_writes_the_envelope_there(tmp_path, capfd):
    """main() inside another Python program (a test, an AWX plugin): stdout's descriptor is the program's again once
    the command ends, the envelope went to it, and the command's stray output to stderr."""
    _write(tmp_path / "inv", {"hosts.yml": GOOD})
    before = os.fstat(1)
    assert cli.main(["inventory", "check", "-i", str(tmp_path / "inv"), "--json"]) == 0
    after = os.fstat(1)
    assert (before.st_dev, before.st_ino) == (after.st_dev, after.st_ino)
    out, _ = capfd.readouterr()
    assert json.loads(out)["ok"] is True
    os.write(1, b"still stdout\n")
    assert capfd.readouterr().out == "still stdout\n"


KEEPS_THE_RUN = [
    ({"ANSIBLE_TRANSPORT": "ssh"}, None),
    ({}, "[defaults]\nkeep_remote_files = False\ntransport = paramiko\n"),
]


@pytest.mark.parametrize(("env", "cfg"), KEEPS_THE_RUN)
def test_an_environment_that_keeps_the_run_as_it_is_is_not_refused(workdir, capsys, monkeypatch, env, cfg):
    _write(workdir / "inv", {"hosts.yml": GOOD})
    workdir.chmod(0o755)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    if cfg:
        (workdir / "ansible.cfg").write_text(cfg)
    code, err, _ = _run(["inventory", "check", "-i", str(workdir / "inv")], capsys)
    assert code == 0, err


def test_ansible_cfg_that_turns_host_key_checking_off(tmp_path):
    """Ansible reads ansible.cfg when it is imported: a fresh process, as a user runs it."""
    tmp_path.chmod(0o755)
    _write(tmp_path / "inv", {"hosts.yml": GOOD})
    (tmp_path / "ansible.cfg").write_text("[defaults]\nhost_key_checking = False\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("ANSIBLE_")}
    proc = subprocess.run(
        [sys.executable, "-m", "provision", "inventory", "check", "-i", "inv"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env=env,
    )
    assert proc.returncode == 2 and proc.stderr.splitlines() == [
        f"error: {tmp_path}/ansible.cfg: host_key_checking is off; provision keeps it on: remove that setting, "
        "or pass --no-host-key-checking to accept any host key"
    ]
    ok = subprocess.run(
        [sys.executable, "-m", "provision", "inventory", "check", "-i", "inv", "--no-host-key-checking"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env=env,
    )
    assert ok.returncode == 0, ok.stderr


def test_matrix_is_at_least_40():
    assert len(INVENTORIES) + len(FLAGS) + 1 >= 40


def test_environment_that_turns_host_key_checking_off(workdir, capsys, monkeypatch):
    _write(workdir / "inv", {"hosts.yml": GOOD})
    monkeypatch.setenv("ANSIBLE_SSH_HOST_KEY_CHECKING", "False")
    code, err, _ = _run(["inventory", "check", "-i", str(workdir / "inv")], capsys)
    assert code == 2 and len(err) == 1 and "ANSIBLE_SSH_HOST_KEY_CHECKING" in err[0] and "host key" in err[0]


@pytest.mark.parametrize(("case", "env", "cfg"), ENVIRONMENTS, ids=[c[0] for c in ENVIRONMENTS])
def test_environment_that_would_silently_change_the_run(workdir, capsys, monkeypatch, case, env, cfg):
    """Ansible would apply them to provision's playbooks: a phase, or part of one, left out with no word and the
    run still reported converged; modules left on the hosts with their secrets; a node's tasks run on the
    controller. Refused before anything is contacted, naming where the setting comes from."""
    _write(workdir / "inv", {"hosts.yml": GOOD})
    workdir.chmod(0o755)  # Ansible reads no ansible.cfg from a world-writable directory
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    if cfg:
        (workdir / "ansible.cfg").write_text(cfg)
    _assert_usage_error(
        ["plan", "-i", str(workdir / "inv"), "--runs-dir", str(workdir / "runs")],
        capsys,
        workdir / "runs",
        sees=SEES[case][1],
    )


def test_forks_below_the_host_count_are_kept_and_named(workdir, capsys, monkeypatch):
    """The user's forks stay (a bastion may allow only so many sessions), with one warning where they are fewer
    than the inventory's hosts; none where they cover them."""
    _write(workdir / "inv", {"hosts.yml": GOOD})
    monkeypatch.setenv("ANSIBLE_FORKS", "1")
    code, err, _ = _run(["inventory", "check", "-i", str(workdir / "inv")], capsys)
    assert code == 0 and [line for line in err if "forks" in line] == [
        "warning: env: ANSIBLE_FORKS: forks = 1: Ansible works on 1 host(s) at a time, where provision would work on "
        "2 at once"
    ]
    monkeypatch.setenv("ANSIBLE_FORKS", "50")
    code, err, _ = _run(["inventory", "check", "-i", str(workdir / "inv")], capsys)
    assert code == 0 and not [line for line in err if "forks" in line]


def test_ansible_debug_and_a_junit_file_on_stdout_leave_the_json_envelope_alone_there(tmp_path):
    """ANSIBLE_DEBUG makes Ansible print its debug lines on stdout, in provision's own process as it loads the
    inventory; a JUnit file named /dev/stdout is written there too. With --json, stdout still holds one JSON
    document, the envelope; the rest goes to stderr."""
    _write(tmp_path / "inv", {"hosts.yml": GOOD})
    env = {**os.environ, "ANSIBLE_DEBUG": "1"}
    proc = subprocess.run(
        [sys.executable, "-m", "provision", "inventory", "check", "-i", "inv", "--json"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env=env,
    )
    assert proc.returncode == 0 and json.loads(proc.stdout)["ok"] is True, proc.stdout[:500]
    assert "Loading" in proc.stderr  # Ansible's debug lines, moved to stderr
    # a node whose ssh port refuses: verify reads nothing, and still writes its JUnit and its envelope
    refusing = GOOD.replace("ansible_host: 192.0.2.10", "ansible_host: 127.0.0.1\n          ansible_port: 9")
    _write(tmp_path / "inv", {"hosts.yml": refusing})
    junit = subprocess.run(
        [
            sys.executable,
            "-m",
            "provision",
            "verify",
            "-i",
            "inv",
            "--json",
            "--junit",
            "/dev/stdout",
            "--runs-dir",
            "runs",
            "--no-host-key-checking",
            "--limit",
            "pve1",
        ],
        capture_output=True,
        text=True,
        cwd=tmp_path,
    )
    assert json.loads(junit.stdout)["exit_code"] == junit.returncode == 1, (junit.stdout[:500], junit.stderr[-500:])
    assert "<testsuite" in junit.stderr


STATIC_PLUGIN = '''\
DOCUMENTATION = """
name: static
short_description: two fixed hosts, as a dynamic inventory plugin would return them
description: [A test double for community.proxmox.proxmox.]
options:
  plugin: {required: true, choices: [site.inv.static]}
"""
from ansible.plugins.inventory import BaseInventoryPlugin


class InventoryModule(BaseInventoryPlugin):
    NAME = "site.inv.static"

    def verify_file(self, path):
        return path.endswith((".yml", ".yaml"))

    def parse(self, inventory, loader, path, cache=True):
        super().parse(inventory, loader, path, cache)
        self._read_config_data(path)
        for group, host in (("proxmox_hosts", "pve1"), ("gpu_containers", "ct1")):
            inventory.add_group(group)
            inventory.add_host(host, group=group)
        inventory.set_variable("ct1", "proxmox_host", "pve1")
        inventory.set_variable("ct1", "proxmox_vmid", 110)
        inventory.set_variable("ct1", "sglang_model_path", "/srv/models/m")
'''


def test_collection_inventory_plugin_is_loaded(tmp_path):
    """An inventory plugin from a collection on the user's collections_path (ansible.cfg), by FQCN."""
    tmp_path.chmod(0o755)
    plugin = tmp_path / "coll" / "ansible_collections" / "site" / "inv" / "plugins" / "inventory" / "static.py"
    plugin.parent.mkdir(parents=True)
    plugin.write_text(STATIC_PLUGIN)
    (tmp_path / "ansible.cfg").write_text("[defaults]\ncollections_path = ./coll\n")
    _write(tmp_path / "inv", {"pve.yml": "plugin: site.inv.static\n"})
    env = {k: v for k, v in os.environ.items() if not k.startswith("ANSIBLE_")}
    proc = subprocess.run(
        [sys.executable, "-m", "provision", "inventory", "check", "-i", "inv"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env=env,
    )
    assert proc.returncode == 0 and "(1 proxmox_hosts, 1 gpu_containers)" in proc.stdout, proc.stderr


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGHUP], ids=["SIGTERM", "SIGHUP"])
def test_a_signal_outside_a_run_ends_the_command_with_its_line_envelope_and_code(tmp_path, signum):
    """While the inventory loads (an inventory script that takes its time), before any run: one stderr line, one
    JSON document, exit 128 + the signal's number; with the default handlers it died without a word."""
    root = tmp_path / "inv"
    root.mkdir()
    script = root / "slow.py"
    script.write_text(f"#!{sys.executable}\nimport time\ntime.sleep(20)\nprint('{{}}')\n")
    script.chmod(0o755)
    proc = subprocess.Popen(
        [sys.executable, "-m", "provision.cli", "inventory", "check", "-i", str(root), "--json"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=tmp_path,
    )
    deadline = time.monotonic() + 30
    while not _children(proc.pid) and time.monotonic() < deadline:  # the script runs: the load is under way
        time.sleep(0.1)
    children = _children(proc.pid)
    proc.send_signal(signum)
    out, err = proc.communicate(timeout=30)
    deadline = time.monotonic() + 10
    while [c for c in children if _alive(c)] and time.monotonic() < deadline:
        time.sleep(0.1)
    left = [c for c in children if _alive(c)]
    for child in left:
        os.kill(int(child), signal.SIGKILL)
    assert not left, "the inventory script outlived the command"
    line = f"stopped by {signal.Signals(signum).name} before any host was changed"
    assert proc.returncode == 128 + signum, err
    assert err.strip().splitlines() == [f"error: {line}"], err
    envelope = json.loads(out)
    jsonschema.validate(envelope, SCHEMA)
    assert envelope["exit_code"] == 128 + signum and envelope["errors"] == [line]


def _alive(pid: str) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _children(pid: int) -> list[str]:
    return Path(f"/proc/{pid}/task/{pid}/children").read_text().split()


def test_a_signal_once_a_run_began_is_noted_and_its_clean_up_is_not_cut_short(monkeypatch):
    """Outside the run's own trap, but after it (the record being written, the host locks given back): the command
    goes on to its end, then says so and exits 128 + the signal."""
    from provision import interrupts

    with cli._signals_end_the_command() as late:
        monkeypatch.setattr(interrupts, "traps_entered", interrupts.traps_entered + 1)  # a run began
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(0.05)  # the handler runs here, in this thread: it must not raise
    assert late == [signal.SIGTERM]
    errors, outcome = cli._after_late_signal(late, [], cli.Outcome(0))
    assert outcome.exit_code == 128 + signal.SIGTERM
    (line,) = errors
    assert line == "SIGTERM came as the run was ending: it ended, its record is written and its host locks given back"
