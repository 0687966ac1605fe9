"""Action plugin: decide on the controller which phases are as their last converge recorded them, and put the host
in the groups of the phases it still needs, in one task (plugins/modules/provision_state_decide.py documents it)."""

from __future__ import annotations

from ansible.errors import AnsibleActionFail
from ansible.module_utils.parsing.convert_bool import boolean
from ansible.plugins.action import ActionBase
from ansible.plugins.loader import lookup_loader
from ansible_collections.provision.pve_sglang.plugins.module_utils.provision_phases import selected

# the lookup that digests each phase's inputs (one rule: the same digest the phases record)
INPUTS_LOOKUP = "provision.pve_sglang.provision_inputs"
STALE_GROUP = "provision_stale_{}"


def phases_current(inputs: dict, recorded: dict, node_parts: dict, skip: bool, release: str) -> dict:
    """phase -> whether it is as recorded: skipping is on, the code is known, the host's own fingerprint is current
    with the same inputs, and for a phase that also records a part on the container's node (`node_parts` names
    those phases, each with the part its node's read found, or None), that part is current."""
    known = skip and release != "unknown"
    current = {}
    for phase, digest in inputs.items():
        own = recorded.get(phase) or {}
        node = node_parts.get(phase, {"current": True})
        current[phase] = bool(
            known and own.get("current") and own.get("inputs") == digest and (node or {}).get("current")
        )
    return current


def grouping(current: dict, chosen: list[str]) -> dict:
    """group_by's answer for the host: one group per set of stale phases among those the run's tags chose, a child of
    each phase's group (provision_stale_<phase>), so that every phase playbook's `hosts:` finds the host; {} when none
    is. A phase the tags leave out has its play run on no host: its tasks would be skipped, but not the argument-spec
    checks of its roles, which Ansible tags `always`."""
    stale = sorted(phase for phase, ok in current.items() if not ok and phase in chosen)
    if not stale:
        return {}
    return {
        "add_group": STALE_GROUP.format("set_" + "_".join(stale)),
        "parent_groups": [STALE_GROUP.format(p) for p in stale],
    }


class ActionModule(ActionBase):
    TRANSFERS_FILES = False
    _requires_connection = False
    _supports_check_mode = True
    _VALID_ARGS = frozenset(("patterns", "recorded", "node_recorded", "node_phases", "skip", "release"))

    def run(self, tmp=None, task_vars=None):
        result = super().run(tmp, task_vars)
        task_vars = task_vars or {}
        args = self._task.args
        patterns = args.get("patterns")
        if not isinstance(patterns, dict) or not patterns:
            raise AnsibleActionFail("patterns: a mapping of phase to the regular expression of its input variables")
        release = str(args.get("release", "unknown"))
        lookup = lookup_loader.get(INPUTS_LOOKUP, loader=self._loader, templar=self._templar)
        inputs = lookup.run([patterns], variables=task_vars, release=release)[0]
        host, on_node = task_vars.get("inventory_hostname"), args.get("node_recorded") or {}
        node_parts = {phase: on_node.get(f"{phase}@{host}") for phase in args.get("node_phases") or []}
        current = phases_current(
            inputs, args.get("recorded") or {}, node_parts, boolean(args.get("skip", True), strict=False), release
        )
        chosen = selected(task_vars.get("ansible_run_tags"), task_vars.get("ansible_skip_tags"))
        result.update(changed=False, inputs=inputs, current=current, selected=chosen, **grouping(current, chosen))
        return result
