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


def _host(tmp_path, **host_vars):
    inv = tmp_path / "inv"
    inv.mkdir()
    ct = {"ansible_connection": "local", "ansible_python_interpreter": sys.executable, **host_vars}
    (inv / "hosts.yml").write_text(yaml.safe_dump({"all": {"children": {"gpu_containers": {"hosts": {"ct1": ct}}}}}))
    conn, executable = connection.connect(inventory.parse(inv), "ct1")
    return connection.Host(connection.AnsibleConnectionBackend("ct1", conn, executable))


@pytest.mark.skipif(os.geteuid() != 0, reason="su to another user without a password needs root")
def test_commands_become_the_inventory_s_become_user_through_ansible_s_become_plugin(tmp_path):
    """ansible_become with the su method and its flags: the command runs as that user, through real su."""
    host = _host(tmp_path, ansible_become=True, ansible_become_method="su", ansible_become_user="nobody",
                 ansible_become_flags="-s /bin/sh")  # fmt: skip
    assert host.run("id -un").stdout.strip() == "nobody"
    assert host.user().name == "nobody"


def test_become_to_the_user_already_connected_is_skipped_as_ansible_skips_it(tmp_path):
    """Ansible runs no become plugin when the become user is the remote user (become_allow_same_user off): flags
    that su would refuse are never used."""

    host = _host(tmp_path, ansible_become=True, ansible_become_method="su", ansible_become_user=getpass.getuser(),
                 ansible_become_flags="--no-such-su-flag")  # fmt: skip
    result = host.run("echo $0; exit 3")
    assert (result.rc, result.stdout.strip()) == (3, "/bin/sh")


def test_a_command_s_exit_code_and_both_streams_come_back(tmp_path):
    host = _host(tmp_path)
    result = host.run("printf out; printf err >&2; exit 7")
    assert (result.rc, result.stdout, result.stderr) == (7, "out", "err")
    assert host.file(str(tmp_path / "inv" / "hosts.yml")).is_file
