"""The phase list is plugins/module_utils/provision_phases.py's: every YAML copy Ansible reads without Python names
the same phases, in the same order, with the same roles."""

from __future__ import annotations

import yaml

from provision import apply, interrupts
from provision.paths import module_util
from tests.loaders import REPO

PHASES = module_util("provision_phases").PHASES
ROLE_OF_PHASE = module_util("provision_phases").ROLE_OF_PHASE


def _yaml(path: str):
    return yaml.safe_load((REPO / path).read_text())


def test_site_imports_one_playbook_per_phase_in_order_tagged_with_its_name():
    imports = [(p["ansible.builtin.import_playbook"], p["tags"]) for p in _yaml("playbooks/site.yml")]
    phased = [(book, tags) for book, tags in imports if tags != ["always"]]
    assert phased == [(f"{phase}.yml", [phase]) for phase in PHASES]


def test_each_phase_playbook_runs_its_role():
    for phase, role in ROLE_OF_PHASE.items():
        plays = _yaml(f"playbooks/{phase}.yml")
        roles = [r["role"] if isinstance(r, dict) else r for play in plays for r in play.get("roles", [])]
        converging = [r for r in roles if r.rsplit(".", 1)[-1] in ROLE_OF_PHASE.values()]
        assert converging == ([f"provision.pve_sglang.{role}"] if role else []), phase


def test_the_provision_state_role_and_module_name_the_same_phases():
    spec = _yaml("roles/provision_state/meta/argument_specs.yml")["argument_specs"]["main"]["options"]
    assert tuple(spec["provision_state_phase"]["choices"]) == PHASES
    assert tuple(_yaml("roles/provision_state/vars/main.yml")["_provision_state_inputs"]) == PHASES
    source = (REPO / "plugins" / "modules" / "provision_state.py").read_text()
    documentation = yaml.safe_load(source.split('DOCUMENTATION = r"""', 1)[1].split('"""', 1)[0])
    assert tuple(documentation["options"]["phase"]["choices"]) == PHASES


def test_the_cli_and_the_interrupt_report_read_the_list():
    assert apply.PHASES == PHASES
    assert apply.parse_tags("sglang,kernel") == ["sglang", "kernel"]
    assert interrupts.left_behind("Some task", "provision.pve_sglang.nvidia_driver").startswith("the driver phase")


def test_each_part_tag_is_on_its_phases_role_and_the_role_tags_no_other():
    """A part tag (PART_TAGS) runs a part of its phase's role: each is on a task of that role's main.yml, which
    carries no tag that is not a part of its phase (one the CLI would refuse, or another phase's)."""
    part_tags = module_util("provision_phases").PART_TAGS
    for phase, role in ROLE_OF_PHASE.items():
        tasks = _yaml(f"roles/{role}/tasks/main.yml") if role else []
        tagged = {tag for task in tasks for tag in task.get("tags", [])}
        assert tagged == {tag for tag, of in part_tags.items() if of == phase}, phase
        for task in (t for t in tasks if "tags" in t and "ansible.builtin.include_tasks" in t):
            assert task["ansible.builtin.include_tasks"]["apply"]["tags"] == task["tags"], task["name"]


def test_the_phases_a_runs_tags_select_follow_ansibles_tag_rules():
    selected = module_util("provision_phases").selected
    assert selected(["all"], []) == selected(None, None) == selected(["tagged"], []) == list(PHASES)
    assert selected(["weights", "kernel"], []) == ["kernel", "sglang"]
    assert selected(["all"], ["kernel", "verify"]) == [p for p in PHASES if p not in ("kernel", "verify")]
    assert selected(["untagged"], []) == [] and selected(["all"], ["tagged"]) == selected(["all"], ["all"]) == []
