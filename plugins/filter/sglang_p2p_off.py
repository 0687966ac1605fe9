"""Jinja filter: what P2P off sets for an SGLang server (plugins/module_utils/gpu_p2p.py, which verify checks by)."""

from __future__ import annotations

from ansible_collections.provision.pve_sglang.plugins.module_utils.gpu_p2p import (
    GUARD_FLAGS_ENV,
    P2P_OFF_ENV,
    P2P_OFF_FLAGS,
    p2p_off_flags,
)


def sglang_p2p_off(tp_size) -> dict:
    """{"env": the environment, "flags": the flags for this tp size, "every_flag": every flag P2P off may pass,
    "guard_flags_env": the variable the unit's start guard passes the flags in}."""
    return {
        "env": dict(P2P_OFF_ENV),
        "flags": p2p_off_flags(tp_size),
        "every_flag": list(P2P_OFF_FLAGS),
        "guard_flags_env": GUARD_FLAGS_ENV,
    }


class FilterModule:
    def filters(self):
        return {"sglang_p2p_off": sglang_p2p_off}
