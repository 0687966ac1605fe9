"""Every variable checked before anything runs against the argument specs of the roles that run on its host
(provision/arg_specs.py, through ansible-core's ArgumentSpecValidator), as `inventory check` and `apply` say it."""

from __future__ import annotations

import json

from provision import arg_specs, cli, inventory
from tests.unit.provision.test_inventory import GOOD_HOSTS, make


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
    root = make(
        tmp_path,
        GOOD_HOSTS,
        {
            "gpu_containers": "sglang_model_path: /srv/m\nsglang_tp_size: two\nsglang_p2p: maybe\n",
            "proxmox_hosts": "kernel_cmdline_reboot: sometimes\n",
        },
    )
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


def test_a_variable_no_role_declares_stops_the_run_naming_the_nearest_name(tmp_path, capsys):
    """A typo in a role's variable would leave the role's default in force: inventory check and apply refuse it."""
    root = make(tmp_path, GOOD_HOSTS, {"gpu_containers": "sglang_model_path: /srv/m\nsglang_tp_szie: 2\n"})
    said = (
        f"{root}/group_vars/gpu_containers.yml:2: host ct1: sglang_tp_szie: no role declares it "
        "(roles/*/meta/argument_specs.yml); did you mean sglang_tp_size?"
    )
    assert _check(root, capsys)[:2] == (2, [said])
    runs = tmp_path / "runs"
    assert _check(root, capsys, "apply", "--yes", "--runs-dir", str(runs))[:2] == (2, [said])
    assert not runs.exists(), "nothing ran"


def test_templated_and_vaulted_values_are_left_to_the_roles(tmp_path, capsys):
    root = make(
        tmp_path,
        GOOD_HOSTS,
        {
            "gpu_containers": "sglang_model_path: \"{{ '/srv/' ~ 'm' }}\"\nsglang_tp_size: \"{{ 1 + 1 }}\"\n",
        },
    )
    assert _check(root, capsys)[:2] == (0, [])


def test_a_template_the_inventory_alone_renders_is_checked_as_rendered(tmp_path, capsys, monkeypatch):
    """A value from the controller's environment or the inventory's own variables is rendered at check, as Ansible
    will render it in the run, and checked against the spec; one that needs a play's facts is left to the roles."""
    monkeypatch.setenv("PROVISION_TEST_TP", "two")
    root = make(
        tmp_path,
        GOOD_HOSTS,
        {
            "gpu_containers": (
                'sglang_model_path: "{{ ansible_facts.mounts[0].mount }}/m"\n'
                "sglang_tp_size: \"{{ lookup('ansible.builtin.env', 'PROVISION_TEST_TP') }}\"\n"
            )
        },
    )
    code, errors, _ = _check(root, capsys)
    assert (code, errors) == (
        2,
        [
            f"{root}/group_vars/gpu_containers.yml:2: host ct1: argument 'sglang_tp_size' is of type str and we were "
            "unable to convert to int: \"'two'\" cannot be converted to an int"
        ],
    )
    monkeypatch.setenv("PROVISION_TEST_TP", "2")
    assert _check(root, capsys)[:2] == (0, [])


def test_a_template_that_needs_the_play_or_runs_a_command_is_left_to_the_roles(tmp_path, capsys):
    """Not rendered at check: a `default` over a fact would give its fallback here and the fact in the run, and a
    `pipe` lookup runs a command. A variable with a role's prefix that a template of the host reads is accepted."""
    root = make(
        tmp_path,
        GOOD_HOSTS,
        {
            "gpu_containers": (
                "sglang_models_root: /srv\n"
                'sglang_model_path: "{{ sglang_models_root }}/m"\n'
                "sglang_tp_size: \"{{ ansible_facts.gpu_count | default('two') }}\"\n"
                "sglang_port: \"{{ lookup('ansible.builtin.pipe', 'echo sixty') }}\"\n"
            )
        },
    )
    assert _check(root, capsys)[:2] == (0, [])


NO_API = "proxmox_api_port: 8006\n"  # a proxmox_api_ variable: make() then adds no address or password
CT = "sglang_model_path: /srv/m\n"


def test_a_phase_that_talks_to_the_pve_api_needs_its_address_and_a_secret_for_it(tmp_path, capsys):
    """No API address at all: every host whose phases use the API is named, before anything runs. The gpu phase's
    devN entries take only root@pam's password, so a token serves the nodes' reboot checks but not the containers."""
    root = make(tmp_path, GOOD_HOSTS, {"all": NO_API, "gpu_containers": "sglang_model_path: /srv/m\n"})
    code, errors, _ = _check(root, capsys)
    assert code == 2
    assert errors == [
        f"{root}/hosts.yml:9: host ct1: proxmox_api_host: missing or empty: the gpu phase writes its devN entries "
        "through the PVE API",
        f"{root}/hosts.yml:5: host pve1: proxmox_api_host: missing or empty: before a reboot, the kernel and driver "
        "phases read its guests, quorum and HA through the PVE API",
    ], errors
    token = NO_API + "proxmox_api_host: 192.0.2.1\nproxmox_api_token_id: provision\nproxmox_api_token_secret: x\n"
    (root / "group_vars" / "all.yml").write_text(token)
    code, errors, _ = _check(root, capsys)
    assert (code, errors) == (
        2,
        [
            f"{root}/hosts.yml:9: host ct1: proxmox_api_password (root@pam's; PVE refuses API tokens there): "
            "missing or empty: the gpu phase writes its devN entries through the PVE API",
        ],
    )


def test_hosts_whose_phases_leave_the_api_alone_need_no_credentials(tmp_path, capsys):
    """The ssh backend for devN, and nodes that never reboot: nothing talks to the API. A run of phases that do not
    use it (`apply --tags sglang`) is not stopped for it either, nor one with --reboot never on the nodes."""
    root = make(
        tmp_path,
        GOOD_HOSTS,
        {
            "all": NO_API,
            "gpu_containers": "sglang_model_path: /srv/m\ngpu_passthrough_api_backend: ssh\n",
            "proxmox_hosts": "kernel_cmdline_reboot: never\n",
        },
    )
    assert _check(root, capsys)[:2] == (0, [])
    (tmp_path / "bare").mkdir()
    bare = make(tmp_path / "bare", GOOD_HOSTS, {"all": NO_API, "gpu_containers": "sglang_model_path: /m\n"})
    inv = inventory.load(bare)
    assert inventory.required_problems(inv, ["ct1", "pve1"], ["sglang"]) == []
    named = inventory.required_problems(inv, ["ct1", "pve1"], ["kernel", "gpu"], reboot="never")
    assert [line.split(": ")[1] for line in named] == ["host ct1"], named


def test_the_driver_phase_needs_the_api_by_its_own_reboot_setting(tmp_path):
    """nvidia_driver_reboot is the driver phase's own (it follows kernel_cmdline_reboot where unset); --reboot sets
    both."""
    nodes = "kernel_cmdline_reboot: never\nnvidia_driver_reboot: auto\n"
    inv = inventory.load(make(tmp_path, GOOD_HOSTS, {"all": NO_API, "gpu_containers": CT, "proxmox_hosts": nodes}))
    assert [line.split(": ")[1] for line in inventory.required_problems(inv, ["pve1"], ["driver"])] == ["host pve1"]
    assert inventory.required_problems(inv, ["pve1"], ["kernel"]) == []
    assert inventory.required_problems(inv, ["pve1"], ["driver"], reboot="never") == []


def test_what_a_template_reads_is_found_whatever_filters_and_tests_it_uses():
    """Ansible's filters and tests (FQCN or not) are unknown to plain Jinja; the variables read are found all the
    same, and a lookup of anything but the environment is named."""
    from provision.inventory import template_reads

    text = "{{ k | b64encode }} {{ x is ansible.builtin.truthy }} {{ y | ansible.builtin.to_json }}"
    text += " {{ lookup('env', 'A') }}"
    assert template_reads(text) == (frozenset({"k", "x", "y"}), True)
    assert template_reads("{{ lookup('ansible.builtin.pipe', 'id') }}") == (frozenset(), False)
    assert template_reads("{{ unclosed") is None
