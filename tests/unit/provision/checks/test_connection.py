"""verify's testinfra `host`: commands run through the host's own Ansible connection plugin and become plugin, as
ansible-core's task executor sets them up from the inventory (provision/checks/connection.py)."""

from __future__ import annotations

import getpass
import os
import sys

import pytest
import yaml

from provision import inventory
from provision.checks import connection


def _host(tmp_path, name="ct1", **host_vars):
    inv = tmp_path / "inv"
    inv.mkdir(exist_ok=True)
    ct = {"ansible_connection": "local", "ansible_python_interpreter": sys.executable, **host_vars}
    hosts = {"ct1": ct, "pve1": {"ansible_host": "127.0.0.1", "shell_path": "/bin/bash"}}
    (inv / "hosts.yml").write_text(yaml.safe_dump({"all": {"children": {"gpu_containers": {"hosts": hosts}}}}))
    conn, executable = connection.connect(inventory.parse(inv), name)
    return connection.Host(connection.AnsibleConnectionBackend(name, conn, executable, str(inv)))


@pytest.mark.skipif(os.geteuid() != 0, reason="su to another user without a password needs root")
def test_commands_become_the_inventory_s_become_user_through_ansible_s_become_plugin(tmp_path):
    """ansible_become with the su method and its flags: the command runs as that user, through real su."""
    host = _host(
        tmp_path,
        ansible_become=True,
        ansible_become_method="su",
        ansible_become_user="nobody",
        ansible_become_flags="-s /bin/sh",
    )
    assert host.run("id -un").stdout.strip() == "nobody"
    assert host.user().name == "nobody"


def test_become_to_the_user_already_connected_is_skipped_as_ansible_skips_it(tmp_path):
    """Ansible runs no become plugin when the become user is the remote user (become_allow_same_user off): flags
    that su would refuse are never used."""
    host = _host(
        tmp_path,
        ansible_become=True,
        ansible_become_method="su",
        ansible_become_user=getpass.getuser(),
        ansible_become_flags="--no-such-su-flag",
    )
    result = host.run("echo $0; exit 3")
    assert (result.rc, result.stdout.strip()) == (3, "/bin/sh")


def test_a_command_s_exit_code_and_both_streams_come_back(tmp_path):
    host = _host(tmp_path)
    result = host.run("printf out; printf err >&2; exit 7")
    assert (result.rc, result.stdout, result.stderr) == (7, "out", "err")
    assert host.file(str(tmp_path / "inv" / "hosts.yml")).is_file


def test_values_that_render_to_omit_are_dropped_and_hostvars_are_there(tmp_path):
    """As in a play: an option whose value renders to `omit` is left out, and a template may read another host's
    variables through hostvars."""
    host = _host(
        tmp_path,
        ansible_become="{{ nothing_here | default(omit) }}",
        ansible_remote_tmp="{{ nothing_here | default(omit) }}",
        ansible_shell_executable="{{ hostvars['pve1'].shell_path }}",
    )
    assert host.run("echo $0").stdout.strip() == "/bin/bash"


def test_a_host_whose_connection_cannot_be_set_up_is_named_once_for_every_check(tmp_path):
    inv = tmp_path / "inv"
    inv.mkdir()
    bad = {"ansible_connection": "no_such_connection_plugin"}
    (inv / "hosts.yml").write_text(yaml.safe_dump({"all": {"children": {"gpu_containers": {"hosts": {"ct9": bad}}}}}))
    with pytest.raises(connection.Unreachable, match=r"host ct9: .*no_such_connection_plugin") as first:
        connection.host(str(inv), "ct9")
    with pytest.raises(connection.Unreachable) as again:
        connection.host(str(inv), "ct9")
    assert again.value is first.value
