"""Inventory validation: one clear line per problem, exit 2, and nothing contacted."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import yaml

from provision import cli, inventory, secrets
from provision.errors import InventoryError
from tests.conftest import API_GROUPS, API_VARS, vault_encrypt, vault_encrypt_string
from tests.loaders import REPO

GOOD_HOSTS = """\
all:
  children:
    proxmox_hosts:
      hosts:
        pve1:
          ansible_host: 192.0.2.10
    gpu_containers:
      hosts:
        ct1:
          proxmox_host: pve1
          proxmox_vmid: 110
"""


def make(tmp_path: Path, hosts: str, group_vars: dict[str, str] | None = None) -> Path:
    """The inventory; both groups get the PVE API's address and password (tests/conftest.py API_VARS) after what the
    test writes into their group_vars, unless the test sets a proxmox_api_ variable itself."""
    root = tmp_path / "inv"
    root.mkdir()
    (root / "hosts.yml").write_text(textwrap.dedent(hosts))
    group_vars = dict(group_vars or {})
    for group in API_GROUPS if not any("proxmox_api_" in text for text in group_vars.values()) else ():
        group_vars[group] = textwrap.dedent(group_vars.get(group, "")) + yaml.safe_dump(API_VARS)
    for name, text in group_vars.items():
        (root / "group_vars").mkdir(exist_ok=True)
        (root / "group_vars" / f"{name}.yml").write_text(textwrap.dedent(text))
    return root


def problems(root: Path) -> list[str]:
    with pytest.raises(InventoryError) as exc:
        inventory.load(root)
    return exc.value.problems


def test_shipped_prod_example_is_valid():
    inv = inventory.load(REPO / "inventory" / "prod")
    assert [h.name for h in inv.proxmox_hosts] == ["pve-gpu-01"]
    assert inv.gpu_containers[0].value("proxmox_vmid") == 110
    assert inv.warnings == [], "the example must not keep secrets in plain text"


def test_good_inventory_merges_group_vars(tmp_path):
    root = make(tmp_path, GOOD_HOSTS, {"all": "proxmox_api_port: 8006\n", "gpu_containers": "proxmox_api_port: 8007\n"})
    inv = inventory.load(root)
    assert inv.hosts["pve1"].value("proxmox_api_port") == 8006
    assert inv.hosts["ct1"].value("proxmox_api_port") == 8007


def test_yaml_syntax_error_names_file_and_line(tmp_path):
    root = make(tmp_path, GOOD_HOSTS.replace("proxmox_vmid: 110", "proxmox_vmid: [110"))
    (line,) = problems(root)
    assert line.startswith(f"{root}/hosts.yml:12:") and "YAML parsing failed" in line


def test_yaml_syntax_error_in_group_vars(tmp_path):
    root = make(tmp_path, GOOD_HOSTS, {"all": "proxmox_api_port: 8006\n  bad: : indent\n"})
    (line,) = problems(root)
    assert line.startswith(f"{root}/group_vars/all.yml:2:")


def test_container_on_unknown_node(tmp_path):
    root = make(tmp_path, GOOD_HOSTS.replace("proxmox_host: pve1", "proxmox_host: pve9"))
    assert problems(root) == [f"{root}/hosts.yml:10: host ct1: proxmox_host: 'pve9' is not a host in proxmox_hosts"]


@pytest.mark.parametrize(
    ("vmid", "expected"),
    [
        ('"110"', "proxmox_vmid: expected an integer, got '110' (str)"),
        ("110.5", "proxmox_vmid: expected an integer, got 110.5 (float)"),
        ("true", "proxmox_vmid: expected an integer, got True (bool)"),
        ("99", "proxmox_vmid: 99 is out of range 100..999999999"),
        ("1000000000", "proxmox_vmid: 1000000000 is out of range 100..999999999"),
    ],
)
def test_bad_vmid(tmp_path, vmid, expected):
    root = make(tmp_path, GOOD_HOSTS.replace("proxmox_vmid: 110", f"proxmox_vmid: {vmid}"))
    where = root if vmid == "true" else f"{root}/hosts.yml:11"  # Ansible keeps no origin for a bool
    assert problems(root) == [f"{where}: host ct1: {expected}"]


def test_duplicate_vmid_on_one_node(tmp_path):
    hosts = GOOD_HOSTS + "        ct2:\n          proxmox_host: pve1\n          proxmox_vmid: 110\n"
    root = make(tmp_path, hosts)
    assert problems(root) == [f"{root}/hosts.yml:14: host ct2: proxmox_vmid: 110 is already used by ct1 on node pve1"]


def test_same_vmid_on_two_nodes_is_fine(tmp_path):
    hosts = GOOD_HOSTS.replace("        pve1:\n", "        pve2:\n        pve1:\n")
    hosts += "        ct2:\n          proxmox_host: pve2\n          proxmox_vmid: 110\n"
    inventory.load(make(tmp_path, hosts))


def test_missing_groups(tmp_path):
    root = make(tmp_path, "all:\n  hosts:\n    pve1:\n")
    assert problems(root) == [
        f"{root}: group proxmox_hosts is missing (the inventory contract needs it)",
        f"{root}: group gpu_containers is missing (the inventory contract needs it)",
    ]


def test_a_gateway_is_a_host_of_its_own(tmp_path):
    """A host of sglang_gateways may not be a node or a container too; one that is neither passes, and a run manages
    it with the others."""
    gateway = "    sglang_gateways:\n      hosts:\n        {name}:\n          ansible_host: 192.0.2.20\n"
    (tmp_path / "a").mkdir(), (tmp_path / "b").mkdir()
    assert problems(make(tmp_path / "a", GOOD_HOSTS + gateway.format(name="ct1"))) == [
        f"{tmp_path / 'a' / 'inv'}: host ct1: is in both gpu_containers and sglang_gateways"
    ]
    inv = inventory.load(make(tmp_path / "b", GOOD_HOSTS + gateway.format(name="gw1")))
    assert [h.name for h in inv.gateways] == ["gw1"] and inv.scope(None) == ["ct1", "gw1", "pve1"]


def test_missing_container_variables(tmp_path):
    root = make(tmp_path, GOOD_HOSTS.replace("          proxmox_host: pve1\n          proxmox_vmid: 110\n", ""))
    assert problems(root) == [
        f"{root}/hosts.yml:9: host ct1: proxmox_host: missing (name its PVE node)",
        f"{root}/hosts.yml:9: host ct1: proxmox_vmid: missing (the container's VMID)",
    ]


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("proxmox_api_port: '8006'", "proxmox_api_port: expected an integer port from 1 to 65535, got '8006' (str)"),
        ("proxmox_api_validate_certs: 'no'", "proxmox_api_validate_certs: expected true or false, got 'no' (str)"),
        ("proxmox_api_user: root", "proxmox_api_user: expected a PVE user with its realm, e.g. root@pam"),
        ("proxmox_api_token_id: root@pam!prov", "proxmox_api_token_id: expected the token name only"),
    ],
)
def test_wrong_types_in_group_vars(tmp_path, text, expected):
    root = make(tmp_path, GOOD_HOSTS, {"all": text + "\n"})
    found = problems(root)
    assert len(found) == 1  # once, naming every host that inherits the bad value
    assert found[0].startswith(f"{root}/group_vars/all.yml:1: hosts ct1, pve1: {expected}")


def test_templates_and_vault_values_are_not_type_checked(tmp_path):
    password = tmp_path / "pass"
    password.write_text("pw-123456\n")
    root = make(
        tmp_path,
        GOOD_HOSTS.replace("proxmox_vmid: 110", 'proxmox_vmid: "{{ 100 + 10 }}"'),
        {"all": vault_encrypt_string("proxmox_api_port", "8006", password)},
    )
    inv = inventory.load(root, inventory.VaultOptions((password,)))
    assert inv.warnings == []


def test_an_inline_vault_value_no_password_given_decrypts_is_named_at_load(tmp_path):
    password = tmp_path / "pass"
    password.write_text("pw-123456\n")
    root = make(tmp_path, GOOD_HOSTS, {"all": vault_encrypt_string("proxmox_api_password", "s3cret-pw", password)})
    with pytest.raises(InventoryError, match=r"all.yml:1: hosts ct1, pve1: proxmox_api_password: cannot decrypt"):
        inventory.load(root)
    other = tmp_path / "other"
    other.write_text("another-password\n")
    with pytest.raises(InventoryError, match=r"proxmox_api_password: cannot decrypt its !vault value: Decryption"):
        inventory.load(root, inventory.VaultOptions((other,)))
    assert "s3cret-pw" in secrets.values(inventory.load(root, inventory.VaultOptions((password,))))


def test_plain_text_secret_warns(tmp_path):
    root = make(tmp_path, GOOD_HOSTS, {"all": "proxmox_api_password: hunter22\n"})
    inv = inventory.load(root)
    assert len(inv.warnings) == 1 and "proxmox_api_password is in plain text" in inv.warnings[0]
    assert "hunter22" not in inv.warnings[0]


def test_a_state_dir_variable_of_an_earlier_release_is_warned_about_not_ignored(tmp_path):
    """One provision_state_dir serves every role; an inventory that still moves sglang_state_dir, as an earlier
    release read it, would otherwise lose it without a word."""
    root = make(tmp_path, GOOD_HOSTS, {"gpu_containers": "sglang_state_dir: /srv/state\n"})
    (warning,) = inventory.load(root).warnings
    assert warning.endswith(
        "host ct1: sglang_state_dir is no longer read: set provision_state_dir "
        "(roles/provision_common), one state directory for every role"
    ), warning
    assert "gpu_containers" in warning.split(": host")[0], "the warning names the file that sets it"


@pytest.mark.skipif(not shutil.which("ssh"), reason="needs ssh (its -G)")
def test_the_ssh_configuration_is_read_as_ssh_reads_it_not_as_argument_text(tmp_path):
    """An ssh config file (here through -F; ~/.ssh/config and /etc/ssh/ssh_config.d/ count the same) that accepts new
    keys is harmless while provision's StrictHostKeyChecking=yes comes first, and a problem once the inventory's own
    ssh_args replace the ones provision sets; one that keeps known_hosts in /dev/null could verify no key."""
    config = tmp_path / "ssh_config"
    config.write_text("Host *\n  StrictHostKeyChecking accept-new\n")
    for case in "abcd":
        (tmp_path / case).mkdir()
    common = f"ansible_ssh_common_args: -F {config}\n"
    assert problems_or_none(make(tmp_path / "a", GOOD_HOSTS, {"all": common})) == []
    (found,) = problems_or_none(
        make(tmp_path / "b", GOOD_HOSTS, {"all": common + "ansible_ssh_args: -o Compression=no\n"})
    )
    assert (
        "group_vars/all.yml:2: hosts ct1, pve1: ssh's configuration says StrictHostKeyChecking accept-new (ssh -G)"
        in found
    ), found
    config.write_text("Host *\n  UserKnownHostsFile /dev/null\n  GlobalKnownHostsFile none\n")
    (found,) = problems_or_none(make(tmp_path / "c", GOOD_HOSTS, {"all": common}))
    assert found.startswith("ssh configuration: hosts ct1, pve1: ssh's configuration keeps no known_hosts file"), found
    config.write_text("Host *\n  UserKnownHostsFile /dev/null\n  GlobalKnownHostsFile /etc/ssh/ssh_known_hosts\n")
    assert problems_or_none(make(tmp_path / "d", GOOD_HOSTS, {"all": common})) == [], "the global file verifies"


def problems_or_none(root: Path) -> list[str]:
    try:
        inventory.load(root)
    except InventoryError as exc:
        return exc.problems
    return []


def test_a_container_serving_beyond_loopback_without_an_api_key_is_warned_about(tmp_path):
    root = make(tmp_path, GOOD_HOSTS, {"gpu_containers": "sglang_host: 0.0.0.0\nsglang_model_path: /m\n"})
    (warning,) = [w for w in inventory.load(root).warnings if "sglang_host" in w]
    assert warning.endswith(
        "gpu_containers.yml:1: host ct1: sglang_host is 0.0.0.0 and sglang_api_key is empty: the "
        "API answers anyone who can reach that address; set sglang_api_key (from vault or the "
        "environment)"
    ), warning
    key = "sglang_api_key: \"{{ lookup('env', 'K') }}\"\n"
    (tmp_path / "k").mkdir()
    keyed = make(tmp_path / "k", GOOD_HOSTS, {"gpu_containers": "sglang_host: 0.0.0.0\nsglang_model_path: /m\n" + key})
    assert not [w for w in inventory.load(keyed).warnings if "sglang_host" in w]


def test_vars_files_that_reach_no_host_are_warned_about_by_file(tmp_path):
    """A group_vars file named for no group (a typo: its secrets would never apply) and a host_vars link to nothing:
    Ansible reads them without a word."""
    root = make(tmp_path, GOOD_HOSTS, {"gpu_container": 'sglang_api_key: \'{{ lookup("env", "K") }}\'\n'})
    (root / "host_vars").mkdir()
    (root / "host_vars" / "ct1.yml").symlink_to(tmp_path / "nowhere.yml")
    (root / "host_vars" / "pve1.yml").write_text("x: 1\n")
    warnings = inventory.load(root).warnings
    assert (
        f"{root}/group_vars/gpu_container.yml: no group of the inventory is called 'gpu_container': its "
        "variables reach no host" in warnings
    ), warnings
    assert (
        f"{root}/host_vars/ct1.yml: a link to nothing ({tmp_path}/nowhere.yml): no variables are read from it"
        in warnings
    ), warnings
    assert not [w for w in warnings if "pve1" in w or "/group_vars/all" in w]


def test_cli_broken_inventory_exits_2_without_connecting(tmp_path):
    # the host points at a port where a listener would notice a connection
    import socket

    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)
    listener.settimeout(0.5)
    port = listener.getsockname()[1]
    hosts = GOOD_HOSTS.replace("ansible_host: 192.0.2.10", f"ansible_host: 127.0.0.1\n          ansible_port: {port}")
    root = make(tmp_path, hosts.replace("proxmox_vmid: 110", "proxmox_vmid: abc"))
    runs = tmp_path / "runs"
    for args in (["inventory", "check"], ["apply", "--yes"], ["plan"], ["verify"]):
        proc = subprocess.run(
            [sys.executable, "-m", "provision", *args, "--inventory", str(root), "--runs-dir", str(runs)][
                : None if args[0] != "inventory" else -2
            ],
            capture_output=True,
            text=True,
            env={**os.environ},
            cwd=tmp_path,
        )
        assert proc.returncode == 2, (args, proc.stderr)
        assert proc.stderr.strip().splitlines() == [
            f"error: {root}/hosts.yml:12: host ct1: proxmox_vmid: expected an integer, got 'abc' (str)"
        ]
        assert "Traceback" not in proc.stderr
    with pytest.raises(TimeoutError):
        listener.accept()
    assert not runs.exists(), "a run record was created for an invalid inventory"


def test_cli_unknown_inventory_name(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "provision", "inventory", "check", "--inventory", "nosuch"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
    )
    assert proc.returncode == 2
    assert "inventory 'nosuch' not found" in proc.stderr


def test_ini_inventory_with_a_host_range_and_a_vaulted_group_vars_file(tmp_path):
    """Ansible's documented vars/vault split: group_vars/all/vars.yml names vault_ variables that
    group_vars/all/vault.yml, encrypted whole, defines. Their values are scrubbed from records."""
    root = tmp_path / "inv"
    (root / "group_vars" / "all").mkdir(parents=True)
    (root / "hosts").write_text(
        "[proxmox_hosts]\npve-gpu-[01:02] ansible_host=192.0.2.10\n\n"
        "[gpu_containers]\nct1 ansible_host=192.0.2.110 proxmox_host=pve-gpu-02 proxmox_vmid=110\n"
    )
    (root / "group_vars" / "all" / "vars.yml").write_text('proxmox_api_password: "{{ vault_proxmox_api_password }}"\n')
    vault = root / "group_vars" / "all" / "vault.yml"
    vault.write_text("vault_proxmox_api_password: s3cret-from-vault\nvault_nested: {token: NestedTok777}\n")
    password = tmp_path / "pass"
    password.write_text("pw-123456\n")
    vault_encrypt(vault, password)
    with pytest.raises(InventoryError, match="cannot decrypt"):
        inventory.load(root)
    inv = inventory.load(root, inventory.VaultOptions((password,)))
    assert [h.name for h in inv.proxmox_hosts] == ["pve-gpu-01", "pve-gpu-02"]
    assert inv.hosts["ct1"].value("proxmox_vmid") == 110
    assert {"s3cret-from-vault", "NestedTok777"} <= secrets.values(inv) and inv.warnings == []


def test_control_characters_in_what_reaches_a_unit_grub_or_the_kernel_are_inventory_errors(tmp_path):
    """Caught on the controller, before any host: each line names file:line, the hosts and the variable (never the
    value); the roles check the same after rendering (plugins/module_utils/rendered_values.py)."""
    root = make(
        tmp_path,
        GOOD_HOSTS,
        {
            "proxmox_hosts": 'kernel_cmdline_extra_args: [iommu=nopt, "quiet\\nGRUB_TIMEOUT=0"]\n',
            "gpu_containers": textwrap.dedent("""\
            sglang_model_path: "/m\\nExecStartPre=/bin/sh -c id"
            sglang_environment: {HF_TOKEN: "s3cret\\r", OK: fine}
            sglang_served_model_name: "{{ 'templated' }}"
        """),
        },
    )
    found = problems(root)
    suffix = "it would be written into a systemd unit, a GRUB file or the kernel command line"
    assert found == [
        f"{root}/group_vars/gpu_containers.yml:2: host ct1: sglang_environment.HF_TOKEN holds a control character "
        f"(newline, tab, ...): {suffix}",
        f"{root}/group_vars/gpu_containers.yml:1: host ct1: sglang_model_path holds a control character "
        f"(newline, tab, ...): {suffix}",
        f"{root}/group_vars/proxmox_hosts.yml:1: host pve1: kernel_cmdline_extra_args[1] holds a control character "
        f"(newline, tab, ...): {suffix}",
    ]
    assert not [p for p in found if "s3cret" in p or "ExecStartPre" in p]


def test_unverified_tls_to_the_proxmox_api_is_warned_about_before_anything_runs(tmp_path):
    root = make(tmp_path, GOOD_HOSTS, {"all": "proxmox_api_validate_certs: false\n"})
    inv = inventory.load(root)
    assert inv.warnings == [  # Ansible keeps no origin for true/false: the inventory is named
        f"{root}: host ct1: proxmox_api_validate_certs is false: the PVE API's TLS certificate "
        "is NOT verified, and the API password or token goes to whoever answers; set proxmox_api_ca_file to the CA "
        "that signed it instead"
    ]
    (tmp_path / "ssh").mkdir()
    ssh = make(
        tmp_path / "ssh", GOOD_HOSTS, {"all": "proxmox_api_validate_certs: false\ngpu_passthrough_api_backend: ssh\n"}
    )
    assert inventory.load(ssh).warnings == [], "the ssh backend does not use the API's TLS"


def test_sglang_model_source_is_checked_one_line_per_problem(tmp_path):
    source = """\
        sglang_model_source:
          type: huggingface
          repo: Qwen/Qwen3-8B
          revision: main
          token: x
        """
    root = make(tmp_path, GOOD_HOSTS, {"gpu_containers": source})
    where = f"{root}/group_vars/gpu_containers.yml:2"  # Ansible's origin of the mapping
    assert problems(root) == [
        f"{where}: host ct1: sglang_model_source: unknown key 'token' for type huggingface",
        f"{where}: host ct1: sglang_model_source: revision must be a commit: 40 lowercase hex digits (a branch or tag "
        "moves), not 'main'",
    ]


def test_a_pinned_hf_source_and_a_node_directory_are_valid(tmp_path):
    for n, source in enumerate(
        ("{type: huggingface, repo: Qwen/Qwen3-8B, revision: " + "a" * 40 + "}", "{type: node_dir, path: /srv/m}")
    ):
        (tmp_path / str(n)).mkdir()
        root = make(tmp_path / str(n), GOOD_HOSTS, {"gpu_containers": f"sglang_model_source: {source}\n"})
        assert inventory.load(root).gpu_containers


def test_vault_options_reach_an_ansible_command_without_arguments_as_its_identity_list(tmp_path):
    """verify's testinfra checks run `ansible` with no command-line vault options: the same vault ids reach it through
    ANSIBLE_VAULT_IDENTITY_LIST, a password file as the id `default@FILE`, as ansible's CLI makes of
    --vault-password-file."""
    password = tmp_path / "vault-pass"
    password.write_text("s3cret\n")
    opts = inventory.VaultOptions((password,), ("prod@prompt",))
    assert opts.environment() == {"ANSIBLE_VAULT_IDENTITY_LIST": f"default@{password},prod@prompt"}
    assert inventory.VaultOptions().environment() == {}


def test_the_size_bound_counts_the_inventorys_values_not_ansibles_own():
    """`groups`, which Ansible gives every host, lists the whole fleet: a fleet of 12,000 hosts is no alias bomb."""
    host = inventory.Host("pve1", vars={"groups": {"all": [f"pve{i}" for i in range(12_000)]}})
    assert inventory._check_size(host) == []


@pytest.mark.parametrize(
    "argv",
    [
        ["plan"],
        ["apply", "--yes"],
        ["rollback", "--yes", "--limit", "pve1"],
        ["verify"],
        ["capacity"],
        ["diag"],
        ["bench"],
    ],
    ids=lambda argv: argv[0],
)
def test_each_command_loads_its_inventory_once(argv, tmp_path, monkeypatch):
    """The CLI loads and checks the inventory, then hands that one to the command (inventory.loaded): Ansible's
    loader runs once per command, bench's capacity read included. The first playbook run stops the command here."""
    from provision import apply, bench, diag, verify

    ran = []

    def first_run(*args, **kwargs):
        ran.append(args[0])
        raise RuntimeError("the first playbook run")

    for module in (apply, bench, diag, verify):
        monkeypatch.setattr(module, "run_playbook", first_run)
    parses = []
    real_parse = inventory.parse
    monkeypatch.setattr(inventory, "parse", lambda *a, **k: parses.append(a[0]) or real_parse(*a, **k))
    root = make(tmp_path, GOOD_HOSTS, {"gpu_containers": "sglang_model_path: /srv/m\n"})
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    cli.main([argv[0], "-i", str(root), "--runs-dir", str(tmp_path / "runs"), *argv[1:]])
    assert ran and len(parses) == 1, (ran, parses)
