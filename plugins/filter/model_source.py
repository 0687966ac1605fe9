"""Jinja filter: what is wrong with a sglang_model_source value (plugins/module_utils/model_source.py)."""

from __future__ import annotations

from ansible_collections.provision.pve_sglang.plugins.module_utils.model_source import source_problems


class FilterModule:
    def filters(self):
        # sglang_model_source | provision.pve_sglang.model_source_problems -> ["revision must be a commit: ..."]
        return {"model_source_problems": source_problems}
