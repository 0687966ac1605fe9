"""plugins/action/provision_state_decide.py: the phase decision and the stale groups in one task, run by
ansible-playbook itself (the groups are Ansible's inventory after the task, read by the next play's `hosts:`)."""

from __future__ import annotations

import base64
import json
import re
from pathlib import Path

from provision.paths import collections_path
from tests.playbooks import run_local_plays

PATTERNS = {"kernel": "^kernel_cmdline_", "gpu": "^proxmox_", "sglang": "^(sglang|proxmox)_", "verify": "^$"}


LOOKUP = "lookup('provision.pve_sglang.provision_inputs', " + json.dumps(PATTERNS) + ", release=provision_release)"
SAID = "{'current': decision.current, 'changed': decision.changed}"


def playbook(recorded: dict, node_recorded: dict) -> list:
    """Each host's phase inputs digested by the lookup, its fingerprints as `recorded` says (an `inputs` of "same"
    means this run's digest: what a converge recorded), the decision, then one play per phase group naming its hosts."""
    resolve = {
        "_digests": "{{ " + LOOKUP + " }}",
        "_own": "{{ " + json.dumps(recorded) + "[inventory_hostname] | default({}) | test_resolve(_digests) }}",
        "_node": "{{ " + json.dumps(node_recorded) + " | test_resolve_node(_digests, inventory_hostname) }}",
    }
    args = {
        "patterns": PATTERNS,
        "release": "{{ provision_release }}",
        "skip": "{{ skip | default(true) }}",
        "recorded": "{{ _own }}",
        "node_recorded": "{{ _node }}",
        "node_phases": ["gpu", "sglang"],
    }
    tasks = [
        {"ansible.builtin.set_fact": {"_digests": resolve["_digests"]}},
        {"ansible.builtin.set_fact": {k: v for k, v in resolve.items() if k != "_digests"}},
        {"provision.pve_sglang.provision_state_decide": args, "register": "decision", "changed_when": False},
        {
            "ansible.builtin.debug": {
                "msg": "DECISION {{ inventory_hostname }} {{ " + SAID + " | to_json | b64encode }}"
            }
        },
    ]
    show = "STALE {} {{{{ inventory_hostname }}}}"
    stale = [
        {
            "hosts": f"provision_stale_{phase}",
            "gather_facts": False,
            "tasks": [{"ansible.builtin.debug": {"msg": show.format(phase)}}],
        }
        for phase in PATTERNS
    ]
    # every task tagged `always`: a run with --tags or --skip-tags still decides and shows each group's hosts
    plays = [{"hosts": "all", "gather_facts": False, "tasks": tasks}, *stale]
    for play in plays:
        for task in play["tasks"]:
            task["tags"] = ["always"]
    return plays


def run(
    tmp_path: Path, hosts: dict, recorded: dict, node_recorded: dict, extra: dict | None = None, tags: tuple = ()
) -> dict:
    """One ansible-playbook run of `playbook` on local hosts: each host's decision, and each phase group's hosts."""
    (tmp_path / "filter_plugins").mkdir(exist_ok=True)
    (tmp_path / "filter_plugins" / "resolve.py").write_text(RESOLVE)
    (tmp_path / "extra.json").write_text(json.dumps({"provision_release": "1+a", **(extra or {})}))
    collections = tmp_path / "collections"
    found = collections_path(collections) if not collections.exists() else str(collections)
    plays = playbook(recorded, node_recorded)
    extra_vars = ("-e", f"@{tmp_path / 'extra.json'}")
    filters = {"ANSIBLE_FILTER_PLUGINS": str(tmp_path / "filter_plugins")}
    proc = run_local_plays(tmp_path, plays, hosts, *extra_vars, *tags, collections=found, **filters)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    said = re.findall(r'"msg": "DECISION (\S+) (\S+)"', proc.stdout)
    groups = re.findall(r'"msg": "STALE (\S+) (\S+)"', proc.stdout)
    return {
        "decisions": {host: json.loads(base64.b64decode(data)) for host, data in said},
        "stale": {phase: sorted(h for p, h in groups if p == phase) for phase in PATTERNS},
    }


# test-only filters: put this run's digests where a fingerprint says "same" (what a converge recorded)
RESOLVE = """
def resolve(recorded, digests):
    return {p: {**fp, "inputs": digests[p] if fp.get("inputs") == "same" else fp.get("inputs")}
            for p, fp in recorded.items()}
def resolve_node(recorded, digests, host):
    return {k: {**fp, "inputs": digests[k.split("@")[0]]} for k, fp in recorded.items() if k.endswith("@" + host)}
class FilterModule:
    def filters(self):
        return {"test_resolve": resolve, "test_resolve_node": resolve_node}
"""


def test_only_the_phases_whose_record_matches_are_current_and_the_rest_put_the_host_in_their_groups(tmp_path):
    hosts = {
        "node1": {"kernel_cmdline_extra_args": ["x"]},
        "ct1": {"proxmox_vmid": 101, "sglang_port": 30000},
        "ct2": {"proxmox_vmid": 102},
    }
    current = {"inputs": "same", "current": True}
    recorded = {
        "node1": {"kernel": current, "verify": {"inputs": "other", "current": True}},  # verify: other inputs
        "ct1": {"gpu": current, "sglang": current, "verify": current},
        "ct2": {"gpu": current, "sglang": {"inputs": "same", "current": False}, "verify": current},  # sglang drifted
    }
    # ct1's sglang part on its node is missing: its sglang phase is stale though its own record is current
    node = {"gpu@ct1": {"current": True}, "gpu@ct2": {"current": True}, "sglang@ct2": {"current": True}}
    out = run(tmp_path, hosts, recorded, node)
    assert out["decisions"]["node1"]["current"] == {"kernel": True, "gpu": False, "sglang": False, "verify": False}
    assert out["decisions"]["ct1"]["current"] == {"kernel": False, "gpu": True, "sglang": False, "verify": True}
    assert out["decisions"]["ct2"]["current"] == {"kernel": False, "gpu": True, "sglang": False, "verify": True}
    assert out["stale"] == {
        "kernel": ["ct1", "ct2"],
        "gpu": ["node1"],
        "sglang": ["ct1", "ct2", "node1"],
        "verify": ["node1"],
    }
    assert all(d["changed"] is False for d in out["decisions"].values()), "joining a group is no change to a host"


def test_a_changed_variable_an_unknown_release_or_skip_off_makes_every_matching_phase_stale(tmp_path):
    hosts = {"ct1": {"proxmox_vmid": 101}}
    recorded = {"ct1": {p: {"inputs": "same", "current": True} for p in PATTERNS}}
    node = {"gpu@ct1": {"current": True}, "sglang@ct1": {"current": True}}
    assert run(tmp_path, hosts, recorded, node)["stale"] == {"kernel": [], "gpu": [], "sglang": [], "verify": []}
    # recorded under other inputs: a variable of the gpu and sglang phases changed since
    recorded_before = {
        "ct1": {**recorded["ct1"], "gpu": {"inputs": "x", "current": True}, "sglang": {"inputs": "x", "current": True}}
    }
    assert run(tmp_path, hosts, recorded_before, node)["stale"]["sglang"] == ["ct1"]
    everything = {"kernel": ["ct1"], "gpu": ["ct1"], "sglang": ["ct1"], "verify": ["ct1"]}
    assert run(tmp_path, hosts, recorded, node, {"provision_release": "unknown"})["stale"] == everything
    off = run(tmp_path, hosts, recorded, node, {"skip": False})
    assert off["stale"] == everything and not any(off["decisions"]["ct1"]["current"].values())


def test_only_the_phases_the_runs_tags_select_get_their_stale_hosts(tmp_path):
    """A phase that --tags leaves out, or --skip-tags names, gets no host, stale or not: its play then runs on none
    (no argument-spec check of its roles, which Ansible tags `always`). A part's tag selects its phase. The decision
    itself still covers every phase."""
    hosts = {"ct1": {"proxmox_vmid": 101}}
    node = {"gpu@ct1": {"current": True}, "sglang@ct1": {"current": True}}
    everything = {"kernel": ["ct1"], "gpu": ["ct1"], "sglang": ["ct1"], "verify": ["ct1"]}
    none = {phase: [] for phase in PATTERNS}
    for tags, stale in [
        ((), everything),
        (("--tags", "gpu"), {**none, "gpu": ["ct1"]}),
        (("--tags", "weights,kernel"), {**none, "kernel": ["ct1"], "sglang": ["ct1"]}),
        (("--skip-tags", "kernel,verify"), {**none, "gpu": ["ct1"], "sglang": ["ct1"]}),
        (("--tags", "tagged", "--skip-tags", "gpu"), {**everything, "gpu": []}),
    ]:
        out = run(tmp_path, hosts, {}, node, tags=tags)
        assert out["stale"] == stale, tags
        assert not any(out["decisions"]["ct1"]["current"].values()), tags
