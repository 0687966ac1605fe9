"""The phases of a provision run, in order, and the role that converges each: the one list the CLI (--tags,
--skip-tags, what a run requires), the interrupt report and the provision_state module read. The YAML that Ansible
reads without Python (playbooks/site.yml's tags, the provision_state role's argument spec and inputs, the module's
DOCUMENTATION) names them again, and tests/unit/plugins/module_utils/test_provision_phases.py holds each of those
to this list."""

from __future__ import annotations

ROLE_OF_PHASE = {
    "kernel": "kernel_cmdline",
    "driver": "nvidia_driver",
    "gpu": "gpu_passthrough",
    "sglang": "sglang",
    "gateway": "sglang_gateway",  # SGLang's gateway on the sglang_gateways hosts, in front of the containers
    "verify": None,  # the verify phase runs checks, not a role (playbooks/verify.yml)
}
PHASES = tuple(ROLE_OF_PHASE)
PHASE_OF_ROLE = {role: phase for phase, role in ROLE_OF_PHASE.items() if role}
# Tags below a phase, each on a part of its role that an operator may run alone (`--tags weights`); the phase's own
# tag runs every part. A run with part tags runs those tasks of the phase on the hosts where the phase is stale, and
# records no phase as converged: its record tasks carry the phase's tag alone.
PART_TAGS = {
    "sglang_install": "sglang",  # SGLang's venv and packages (roles/sglang/tasks/install.yml)
    "weights": "sglang",  # the model weights from sglang_model_source (weights.yml)
    "sglang_service": "sglang",  # the P2P decision, the configuration and the unit, restarted where due
}


def selected(run_tags, skip_tags) -> list[str]:
    """The phases whose tasks a run with these tags runs (Ansible's ansible_run_tags and ansible_skip_tags), in order:
    each phase's playbook carries its phase's tag (playbooks/site.yml) and each part its PART_TAGS, so `all` and
    `tagged` select every phase, a part selects its phase, and a skipped phase (or `all`, or `tagged`) is left out."""
    run, skip = set(run_tags or ("all",)), set(skip_tags or ())
    if skip & {"all", "tagged"}:  # every phase's tasks are tagged, none `always`
        return []
    every = bool(run & {"all", "tagged"})
    named = {PART_TAGS.get(tag, tag) for tag in run}
    return [phase for phase in PHASES if (every or phase in named) and phase not in skip]
