"""Every variable checked before anything runs against the argument specs of the roles that run on its host
(provision/arg_specs.py, through ansible-core's ArgumentSpecValidator), as `inventory check` and `apply` say it."""

from __future__ import annotations

import json

from provision import arg_specs, cli
from tests.unit.test_inventory import GOOD_HOSTS, make


def _check(root, capsys, *argv: str) -> tuple[int, list[str], list[str]]:
    code = cli.main([*(argv or ("inventory", "check")), "-i", str(root), "--json"])
    envelope = json.loads(capsys.readouterr().out)
    return code, envelope["errors"], envelope["result"].get("warnings", []) if envelope["result"] else []


def test_the_roles_of_each_group_are_read_from_the_playbooks():
    groups = arg_specs.roles_by_group()
    assert {"sglang", "gpu_passthrough", "proxmox_ct", "provision_common"} <= groups["gpu_containers"]
    assert {"kernel_cmdline", "nvidia_driver", "provision_common"} <= groups["proxmox_hosts"]
    assert "sglang" not in groups["proxmox_hosts"]
    assert "sglang" not in arg_specs.roles_by_group(("facts", "kernel"))["gpu_containers"]


def test_a_wrong_type_or_choice_is_named_by_file_host_and_variable(tmp_path, capsys):
    root = make(tmp_path, GOOD_HOSTS, {
        "gpu_containers": "sglang_model_path: /srv/m\nsglang_tp_size: two\nsglang_p2p: maybe\n",
        "proxmox_hosts": "kernel_cmdline_reboot: sometimes\n",
    })  # fmt: skip
    code, errors, _ = _check(root, capsys)
    assert code == 2
    assert errors == [
        f"{root}/group_vars/gpu_containers.yml:2: host ct1: argument 'sglang_tp_size' is of type str and we were "
        "unable to convert to int: \"'two'\" cannot be converted to an int",
        f"{root}/group_vars/gpu_containers.yml:3: host ct1: value of sglang_p2p must be one of: auto, off, on, got: "
        "maybe",
        f"{root}/group_vars/proxmox_hosts.yml:1: host pve1: value of kernel_cmdline_reboot must be one of: auto, "
        "never, got: sometimes",
    ], errors


def test_a_missing_model_path_stops_inventory_check_and_an_apply_that_would_run_the_sglang_role(tmp_path, capsys):
    root = make(tmp_path, GOOD_HOSTS, {"gpu_containers": "sglang_model_path: ''\n"})
    said = f"{root}/group_vars/gpu_containers.yml:1: host ct1: sglang_model_path: missing or empty: the roles that run "
    said += "on this host need it"
    assert _check(root, capsys)[:2] == (2, [said])
    runs = tmp_path / "runs"
    assert _check(root, capsys, "apply", "--yes", "--runs-dir", str(runs))[:2] == (2, [said])
    assert not runs.exists(), "nothing ran"


def test_a_variable_no_role_declares_is_warned_about_with_the_nearest_name(tmp_path, capsys):
    root = make(tmp_path, GOOD_HOSTS, {"gpu_containers": "sglang_model_path: /srv/m\nsglang_tp_szie: 2\n"})
    code, errors, warnings = _check(root, capsys)
    assert (code, errors) == (0, [])
    assert warnings == [
        f"{root}/group_vars/gpu_containers.yml:2: host ct1: sglang_tp_szie: no role declares it "
        "(roles/*/meta/argument_specs.yml), so it is ignored; did you mean sglang_tp_size?"
    ]


def test_templated_and_vaulted_values_are_left_to_the_roles(tmp_path, capsys):
    root = make(tmp_path, GOOD_HOSTS, {
        "gpu_containers": "sglang_model_path: \"{{ '/srv/' ~ 'm' }}\"\nsglang_tp_size: \"{{ 1 + 1 }}\"\n",
    })  # fmt: skip
    assert _check(root, capsys)[:2] == (0, [])
