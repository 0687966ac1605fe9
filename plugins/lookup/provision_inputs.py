"""Lookup plugin: the digest of a phase's inputs for the current host (or of each phase's, in one pass)."""

from __future__ import annotations

DOCUMENTATION = r"""
name: provision_inputs
short_description: sha256 of a release and the values of the variables whose names match a pattern
description:
  - Each matching variable is templated for the host, as the phase will see it. A value that cannot be templated
    before the phase runs (it refers to a variable the phase's role sets, such as C(gpu_passthrough_node_driver))
    counts by its template text.
  - Only the digest leaves the plugin, so secret values (vault, environment lookups) never show.
options:
  _terms:
    description: >-
      one regular expression over variable names; or a mapping of phase to regular expression, for which the lookup
      returns a mapping of phase to digest, templating each variable once however many phases it counts for
    required: true
  release:
    description: the code the phase runs (provision_state_release); part of the digest
    default: unknown
"""

import hashlib
import json
import re

from ansible.errors import AnsibleError
from ansible.plugins.lookup import LookupBase


class LookupModule(LookupBase):
    def run(self, terms, variables=None, release="unknown", **kwargs):
        variables, patterns = variables or {}, terms[0]
        values: dict = {}  # each variable templated once, whichever phases it counts for
        if isinstance(patterns, dict):
            return [{phase: self._digest(variables, values, pattern, release) for phase, pattern in patterns.items()}]
        return [self._digest(variables, values, patterns, release)]

    def _digest(self, variables, values, pattern, release):
        match = re.compile(pattern).search
        names = sorted(name for name in variables if match(name))
        for name in names:
            if name not in values:
                values[name] = self._value(variables[name])
        material = json.dumps([str(release), names, [values[n] for n in names]], sort_keys=True, default=str)
        return hashlib.sha256(material.encode()).hexdigest()

    def _value(self, raw):
        try:
            return self._templar.template(raw)
        except AnsibleError:
            return raw
