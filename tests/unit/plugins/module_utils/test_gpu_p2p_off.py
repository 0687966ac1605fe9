"""What P2P off sets for an SGLang server, written once (plugins/module_utils/gpu_p2p.py): the sglang role renders it
through the sglang_p2p_off filter, and provision verify checks the running server against the same."""

from __future__ import annotations

import json

import pytest
from ansible.parsing.dataloader import DataLoader
from ansible.template import Templar, trust_as_template

from provision.checks import test_container
from provision.checks.plugin import Target
from provision.checks.support import SERVICE_STATE
from provision.paths import module_util
from tests.loaders import REPO

gpu_p2p = module_util("gpu_p2p")


def off(tp_size) -> dict:
    templar = Templar(loader=DataLoader(), variables={"tp": tp_size})
    return templar.template(trust_as_template("{{ tp | provision.pve_sglang.sglang_p2p_off }}"))


def test_the_role_gets_the_flags_for_its_tp_size_and_the_environment():
    assert off(1) == {
        "env": {"NCCL_P2P_DISABLE": "1"},
        "flags": ["--disable-custom-all-reduce"],
        "every_flag": list(gpu_p2p.P2P_OFF_FLAGS),
        "guard_flags_env": "SGLANG_P2P_GUARD_FLAGS",
    }
    assert off("2")["flags"] == list(gpu_p2p.P2P_OFF_FLAGS)


def test_no_role_file_spells_them_out_again():
    for path in [*(REPO / "roles" / "sglang").rglob("*.yml"), *(REPO / "roles" / "sglang").rglob("*.j2")]:
        text = path.read_text()
        assert "NCCL_P2P_DISABLE:" not in text and "--disable-custom-all-reduce" not in text, path


def container(policy: str, tp: int, flags: list[str], env: dict[str, str]) -> Target:
    """A container as verify's probe read it, running a server with these flags and environment."""
    state = {"p2p_policy": policy, "tp_size": tp, "url": "http://127.0.0.1:30000"}
    service = {
        "main_pid": "42",
        "argv_flags": flags,
        "env_names": sorted(env),
        "env_values": {k: env.get(k) for k in gpu_p2p.P2P_OFF_ENV},
    }
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


def guard(tmp_path, monkeypatch, iommu_args: str, boot_id: str | None = None):
    """The sglang unit's start guard as the role renders it for a P2P "on" decided with these IOMMU arguments: a
    function of the kernel line and boot id it runs in, returning the environment file it wrote and what it said."""
    keys = list(module_util("next_boot").IOMMU_KEYS)
    variables = {
        "ansible_managed": "managed",
        "sglang_service_name": "sglang",
        "tp": 2,
        "_sglang_p2p": {
            "reason": "PCIe peers (GPU0-GPU1 PHB), and the IOMMU does not translate",
            "guard": {"iommu_args": iommu_args, "iommu_keys": keys, "container_boot_id": boot_id},
        },
    }
    variables["_sglang_p2p_off"] = off(2)
    source = (REPO / "roles" / "sglang" / "templates" / "p2p-guard.py.j2").read_text()
    code = Templar(loader=DataLoader(), variables=variables).template(trust_as_template(source))
    assert code.startswith("#!/usr/bin/python3\n# managed\n")
    namespace = {"__name__": "p2p_guard"}
    exec(compile(code, "p2p-guard", "exec"), namespace)
    monkeypatch.setenv("RUNTIME_DIRECTORY", str(tmp_path))

    def start(line: str, boot: str = "boot-1") -> tuple[str, str]:
        (tmp_path / "cmdline").write_text(line + "\n")
        (tmp_path / "boot_id").write_text(boot + "\n")
        namespace["main"](str(tmp_path / "cmdline"), str(tmp_path / "boot_id"))
        return (tmp_path / "p2p-guard.env").read_text()

    return start


def test_the_start_guard_turns_p2p_off_in_a_boot_it_was_not_decided_for(tmp_path, monkeypatch, capsys):
    start = guard(tmp_path, monkeypatch, "iommu=pt")
    same = 'BOOT_IMAGE=/boot/vmlinuz root=/dev/sda1 ro quiet dyndbg="module iommu +p" iommu=pt'
    assert start(same) == "" and capsys.readouterr().err == "", "the boot it was decided for: nothing to change"
    assert start(same, boot="boot-2") == "", "an IOMMU decision holds across reboots into the same arguments"
    written = start("BOOT_IMAGE=/boot/vmlinuz root=/dev/sda1 ro quiet iommu=nopt kvm_amd.sev_snp=1")
    assert written == (
        "NCCL_P2P_DISABLE=1\n"
        "SGLANG_P2P_GUARD_FLAGS=--disable-custom-all-reduce --enforce-disable-flashinfer-allreduce-fusion\n"
    )
    said = capsys.readouterr().err.splitlines()
    assert said == [
        "provision: starting with GPU P2P off: P2P on was decided for another boot (IOMMU arguments 'iommu=pt' "
        "then, 'iommu=nopt' now): run provision apply to decide for this boot"
    ]
    assert start("BOOT_IMAGE=/boot/vmlinuz ro quiet").startswith("NCCL_P2P_DISABLE=1\n"), "iommu=pt dropped"


def test_a_verdicts_guard_holds_in_its_own_boot_only(tmp_path, monkeypatch, capsys):
    start = guard(tmp_path, monkeypatch, "", boot_id="boot-1")
    assert start("ro quiet", boot="boot-1") == ""
    assert start("ro quiet", boot="boot-2").startswith("NCCL_P2P_DISABLE=1\n")
    assert "the container or its node restarted since (boot boot-1 then, boot-2 now)" in capsys.readouterr().err


def test_verify_names_the_guard_when_it_started_the_server_with_p2p_off():
    env = {**off(2)["env"], gpu_p2p.GUARD_FLAGS_ENV: " ".join(off(2)["flags"])}
    target = container("on", 2, off(2)["flags"], env)
    with pytest.raises(AssertionError, match="the unit's start guard started the server with P2P off"):
        test_container.test_process_matches_p2p_policy(target)
