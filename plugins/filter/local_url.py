"""Jinja filter: the URL a client on the same host calls a server at (plugins/module_utils/local_url.py)."""

from __future__ import annotations

from ansible_collections.provision.pve_sglang.plugins.module_utils.local_url import local_url


class FilterModule:
    def filters(self):
        # sglang_host | provision.pve_sglang.local_url(sglang_port, '/health') -> http://127.0.0.1:30000/health
        return {"local_url": local_url}
