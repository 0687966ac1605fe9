"""Jinja filter: pip's arguments for an index, an extra index and a wheelhouse (plugins/module_utils/pip_args.py)."""

from __future__ import annotations

from ansible_collections.provision.pve_sglang.plugins.module_utils.pip_args import pip_source_args


class FilterModule:
    def filters(self):
        # sglang_pip_index_url | provision.pve_sglang.pip_source_args(extra_index_url=..., find_links=...)
        # -> ["--index-url", "https://mirror/simple", "--find-links", "/srv/wheels"]
        return {"pip_source_args": pip_source_args}
