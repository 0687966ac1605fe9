"""What P2P off sets for an SGLang server, written once (plugins/module_utils/gpu_p2p.py): the sglang role renders it
through the sglang_p2p_off filter, and provision verify checks the running server against the same."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from ansible.parsing.dataloader import DataLoader
from ansible.template import Templar, trust_as_template

from provision.checks import test_container
from provision.checks.conftest import Target
from provision.checks.support import SERVICE_STATE
from provision.paths import module_util

ROOT = Path(__file__).resolve().parents[2]
gpu_p2p = module_util("gpu_p2p")


def off(tp_size) -> dict:
    templar = Templar(loader=DataLoader(), variables={"tp": tp_size})
    return templar.template(trust_as_template("{{ tp | provision.pve_sglang.sglang_p2p_off }}"))


def test_the_role_gets_the_flags_for_its_tp_size_and_the_environment():
    assert off(1) == {"env": {"NCCL_P2P_DISABLE": "1"}, "flags": ["--disable-custom-all-reduce"],
                      "every_flag": list(gpu_p2p.P2P_OFF_FLAGS)}  # fmt: skip
    assert off("2")["flags"] == list(gpu_p2p.P2P_OFF_FLAGS)


def test_no_role_file_spells_them_out_again():
    for path in [*(ROOT / "roles" / "sglang").rglob("*.yml"), *(ROOT / "roles" / "sglang").rglob("*.j2")]:
        text = path.read_text()
        assert "NCCL_P2P_DISABLE:" not in text and "--disable-custom-all-reduce" not in text, path


def container(policy: str, tp: int, flags: list[str], env: dict[str, str]) -> Target:
    """A container as verify's probe read it, running a server with these flags and environment."""
    state = {"p2p_policy": policy, "tp_size": tp, "url": "http://127.0.0.1:30000"}
    service = {"main_pid": "42", "argv_flags": flags, "env_names": sorted(env),
               "env_values": {k: env.get(k) for k in gpu_p2p.P2P_OFF_ENV}}  # fmt: skip
    return Target("ct", probe={"files": {SERVICE_STATE: json.dumps(state)}, "sglang": {"service": service}})


def test_verify_passes_the_server_the_role_renders_and_names_what_is_missing():
    for tp in (1, 4):
        rendered = off(tp)
        test_container.test_process_matches_p2p_policy(container("off", tp, rendered["flags"], rendered["env"]))
        test_container.test_process_matches_p2p_policy(container("on", tp, [], {}))
    with pytest.raises(AssertionError, match="--enforce-disable-flashinfer-allreduce-fusion"):
        test_container.test_process_matches_p2p_policy(
            container("off", 2, ["--disable-custom-all-reduce"], off(2)["env"])
        )
    with pytest.raises(AssertionError, match="NCCL_P2P_DISABLE=1 is not in its environment"):
        test_container.test_process_matches_p2p_policy(container("off", 1, off(1)["flags"], {}))
    with pytest.raises(AssertionError, match="P2P policy is on but NCCL_P2P_DISABLE=1 is set"):
        test_container.test_process_matches_p2p_policy(container("on", 1, [], off(1)["env"]))
