#!/usr/bin/python
"""Documentation of the action plugin plugins/action/provision_state_decide.py, which runs on the controller only."""

from __future__ import annotations

DOCUMENTATION = r"""
module: provision_state_decide
short_description: Decide which phases are as recorded, and put the host in the groups of those it still needs
author: provision maintainers (!UNKNOWN)
description:
  - Runs on the controller only (an action plugin); it opens no connection to the host.
  - Digests each phase's inputs with the lookup C(provision.pve_sglang.provision_inputs) (the variables whose names
    match the phase's pattern, templated for the host, and I(release)), and finds a phase current when I(skip) is on,
    I(release) is known, the host's recorded fingerprint of the phase is current with the same inputs digest and,
    for a phase in I(node_phases), the part recorded on the container's node (C(<phase>@<host>)) is current too.
  - "Puts the host in the group C(provision_stale_<phase>) of each phase that is not current, as
    C(ansible.builtin.group_by) does with C(parents): the host joins one group per set of stale phases, a child of
    each phase's group. A host with every phase current joins none."
  - "Only the phases the run's tags select (C(ansible_run_tags), C(ansible_skip_tags); a part's tag selects its phase)
    get hosts: the play of a phase the tags leave out then runs on none, and skips its roles' argument-spec checks,
    which Ansible tags C(always), as well as its tasks."
  - One task per host instead of a C(set_fact) loop and a C(group_by), each a round of workers on the controller
    (docs/performance.md, "Fleet").
options:
  patterns:
    type: dict
    required: true
    description: phase -> regular expression over variable names (roles/provision_state/vars/main.yml).
  release:
    type: str
    default: unknown
    description: The code the phases are held to (C(provision_state_release)); C(unknown) makes no phase current.
  skip:
    type: bool
    default: true
    description: Find phases current at all; C(provision apply --full) turns it off.
  recorded:
    type: dict
    default: {}
    description: The host's fingerprints as its read printed them, phase -> C({inputs, current}).
  node_recorded:
    type: dict
    default: {}
    description:
      - The fingerprints on the container's node as its read printed them, C(<phase>@<host>) -> C({inputs, current}).
  node_phases:
    type: list
    elements: str
    default: []
    description: The phases that also record a part on the container's node.
extends_documentation_fragment:
  - provision.pve_sglang.attributes
attributes:
  check_mode: {support: full}
  diff_mode: {support: none}
"""

EXAMPLES = r"""
- name: Decide which phases are as recorded
  provision.pve_sglang.provision_state_decide:
    patterns: {kernel: "^kernel_cmdline_", verify: "^$"}
    release: "{{ provision_state_release }}"
    recorded: "{{ (_read.stdout | provision.pve_sglang.raw_json).fingerprints }}"
  register: _decision
"""

RETURN = r"""
inputs: {description: phase -> sha256 of its inputs, type: dict, returned: always}
current: {description: phase -> whether it is as recorded, type: dict, returned: always}
selected:
  description: the phases the run's tags select, in order; only these get hosts
  type: list
  elements: str
  returned: always
add_group:
  {description: the group of the host's set of stale phases, type: str, returned: when a phase is stale}
parent_groups:
  {description: "C(provision_stale_<phase>) of each stale phase", type: list, returned: when a phase is stale}
"""
