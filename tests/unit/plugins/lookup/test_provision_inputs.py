"""plugins/lookup/provision_inputs.py run by Ansible itself: the digest of a
phase's inputs changes with the phase's variables and the release, and only with them."""

from __future__ import annotations

import base64
import json
import os
import re
import subprocess
import sys
from pathlib import Path

from tests.loaders import REPO

LOOKUPS = REPO / "plugins" / "lookup"
BIN = Path(sys.executable).parent


def digests(tmp_path: Path, extra: dict, patterns=("^sglang_",)) -> list[str]:
    """One ansible-playbook run on localhost printing the lookup's digest for each pattern."""
    playbook = tmp_path / "p.yml"
    lookup = "DIGEST={{ lookup('provision_inputs', '%s', release=provision_release) }}"
    tasks = [{"ansible.builtin.debug": {"msg": lookup.replace("%s", p)}} for p in patterns]
    playbook.write_text(json.dumps([{"hosts": "localhost", "gather_facts": False, "tasks": tasks}]))
    (tmp_path / "extra.json").write_text(json.dumps(extra))
    env = {
        **os.environ,
        "ANSIBLE_LOOKUP_PLUGINS": str(LOOKUPS),
        "ANSIBLE_NOCOLOR": "1",
        "ANSIBLE_LOCALHOST_WARNING": "false",
        "ANSIBLE_INVENTORY_UNPARSED_WARNING": "false",
    }
    proc = subprocess.run(
        [
            str(BIN / "ansible-playbook"),
            "-i",
            "localhost,",
            "-c",
            "local",
            str(playbook),
            "-e",
            f"@{tmp_path / 'extra.json'}",
        ],
        capture_output=True,
        text=True,
        env=env,
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    return re.findall(r'"msg": "DIGEST=([0-9a-f]{64})"', proc.stdout)


def test_the_digest_follows_the_phase_variables_and_the_release(tmp_path):
    base = {"provision_release": "1+a", "sglang_port": 30000, "kernel_cmdline_extra_args": ["x=1"]}
    first, kernel = digests(tmp_path, base, ("^sglang_", "^kernel_cmdline_"))
    assert len(first) == 64
    same_sglang, other_kernel = digests(
        tmp_path, {**base, "kernel_cmdline_extra_args": ["x=2"]}, ("^sglang_", "^kernel_cmdline_")
    )
    assert same_sglang == first, "another phase's variable must not change this phase's inputs"
    assert other_kernel != kernel
    assert digests(tmp_path, {**base, "sglang_port": 30001}) != [first]
    assert digests(tmp_path, {**base, "provision_release": "1+b"}) != [first]


def test_values_are_templated_and_a_value_that_needs_the_role_counts_by_its_text(tmp_path):
    base = {
        "provision_release": "1",
        "sglang_api_key": "{{ lab_key }}",
        "lab_key": "one",
        "sglang_installer": "/srv/NVIDIA-{{ gpu_passthrough_node_driver }}.run",
    }
    first = digests(tmp_path, base)
    assert digests(tmp_path, {**base, "lab_key": "two"}) != first, "the templated value is the input"
    assert digests(tmp_path, base) == first


def test_a_mapping_of_phases_gives_each_phase_the_digest_its_pattern_alone_gives(tmp_path):
    """roles/provision_state/tasks/facts.yml digests every phase of a host in one lookup call."""
    base = {"provision_release": "1+a", "sglang_port": 30000, "proxmox_vmid": 101, "kernel_cmdline_extra_args": ["x"]}
    patterns = {"sglang": "^(sglang|proxmox)_", "gpu": "^proxmox_", "kernel": "^kernel_cmdline_"}
    alone = digests(tmp_path, base, tuple(patterns.values()))
    playbook = tmp_path / "m.yml"
    lookup = "lookup('provision_inputs', " + json.dumps(patterns) + ", release=provision_release)"
    msg = "MAPPING={{ " + lookup + " | to_json | b64encode }}"
    playbook.write_text(
        json.dumps([{"hosts": "localhost", "gather_facts": False, "tasks": [{"ansible.builtin.debug": {"msg": msg}}]}])
    )
    env = {
        **os.environ,
        "ANSIBLE_LOOKUP_PLUGINS": str(LOOKUPS),
        "ANSIBLE_NOCOLOR": "1",
        "ANSIBLE_LOCALHOST_WARNING": "false",
        "ANSIBLE_INVENTORY_UNPARSED_WARNING": "false",
    }
    proc = subprocess.run(
        [
            str(BIN / "ansible-playbook"),
            "-i",
            "localhost,",
            "-c",
            "local",
            str(playbook),
            "-e",
            f"@{tmp_path / 'extra.json'}",
        ],
        capture_output=True,
        text=True,
        env=env,
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    (encoded,) = re.findall(r'"msg": "MAPPING=([A-Za-z0-9+/=]+)"', proc.stdout)
    assert json.loads(base64.b64decode(encoded)) == dict(zip(patterns, alone, strict=True))
