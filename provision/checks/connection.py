"""testinfra's `host` over one connection that Ansible makes and keeps for the whole check run.

testinfra's own ansible backend (force_ansible) starts the `ansible` CLI for every command: about 1.4 s each
on a two-core controller, and a service and a socket check cost ten commands with testinfra's system detection.
Here the checks' process builds the host's connection plugin once, as ansible-core's task executor does for a
task (the plugin by `ansible_connection`, its options from the host's templated variables and the run's
ansible.cfg and environment, the become plugin by `ansible_become`), and runs every testinfra command through
that plugin's `exec_command`, the way an action plugin's low-level command does. With ssh, every command after
the first goes over the ControlPersist master the first one opened.

So the user's ansible.cfg, ProxyCommand or ProxyJump, ssh arguments, become and vault apply as in apply, and a
connection plugin of any kind works (ssh, paramiko_ssh, local, a collection's).
"""

from __future__ import annotations

import functools
import shlex
from pathlib import Path
from typing import Any

from testinfra.backend.base import BaseBackend, CommandResult
from testinfra.host import Host

from provision import inventory as inventory_mod
from provision.errors import UsageError


class AnsibleConnectionBackend(BaseBackend):
    """A testinfra backend whose commands run through a connected Ansible connection plugin."""

    NAME = "provision-ansible"

    def __init__(self, hostname: str, connection: Any, executable: str | None, **kwargs: Any) -> None:
        self.connection = connection
        self.executable = executable
        super().__init__(hostname, **kwargs)

    def run(self, command: str, *args: str, **kwargs: Any) -> CommandResult:
        command = self.get_command(command, *args)
        rc, stdout, stderr = self.connection.exec_command(self._wrapped(command), in_data=None, sudoable=True)
        return self.result(rc, self.encode(command), stdout, stderr)

    def _wrapped(self, command: str) -> str:
        """The command as ansible-core's ActionBase._low_level_execute_command hands it to the plugin: through the
        become plugin where the users differ (or become_allow_same_user), then the shell executable."""
        connection = self.connection
        if connection.become is not None and _becomes(connection):
            command = connection.become.build_become_command(command, connection._shell)
        if connection.allow_executable and self.executable:
            command = f"{self.executable} -c {shlex.quote(command)}"
        return command


def _becomes(connection: Any) -> bool:
    from ansible import constants as C

    try:
        remote = connection.get_option("remote_user")
    except KeyError:  # a plugin without the option: its default user, as ActionBase._get_remote_user falls back
        remote = getattr(connection, "default_user", None) or connection._play_context.remote_user
    become = connection.become.get_option("become_user")
    return C.BECOME_ALLOW_SAME_USER or become != remote or not any((remote, become))


@functools.cache
def _inventory(path: str) -> inventory_mod.Inventory:
    """The inventory, parsed once per check run by Ansible (vault ids from ANSIBLE_VAULT_IDENTITY_LIST)."""
    return inventory_mod.parse(Path(path))


def host(inventory: str, name: str) -> Host:
    """testinfra's Host for `name` of `inventory`, over its Ansible connection."""
    return _host(inventory, name)


@functools.cache
def _host(inventory: str, name: str) -> Host:
    connection, executable = connect(_inventory(inventory), name)
    return Host(AnsibleConnectionBackend(name, connection, executable))


def connect(inv: inventory_mod.Inventory, name: str) -> tuple[Any, str | None]:
    """The host's connection plugin, its options set as ansible-core's TaskExecutor sets them for a task of a play
    that names no connection keywords (_get_connection, _set_become_plugin, _set_connection_options), and the shell
    executable its commands run under. ansible-core has no public call that sets a connection up outside a play,
    so these are its steps, through the plugins' public option API."""
    from ansible import constants as C
    from ansible.playbook.play_context import PlayContext
    from ansible.playbook.task import Task
    from ansible.plugins.loader import connection_loader
    from ansible.template import Templar

    variables = inv.hosts[name].vars
    templar = Templar(loader=inv.loader, variables=variables)
    context = PlayContext().set_task_and_variable_override(task=Task(), variables=variables, templar=templar)
    # ansible_connection, else what ansible-playbook's --connection defaults to
    given = variables.get("ansible_connection")
    context.connection = templar.template(given) if given is not None else C.DEFAULT_TRANSPORT
    connection = connection_loader.get(context.connection, context)
    if connection is None:
        raise UsageError(f"host {name}: no connection plugin named {context.connection!r}")
    _set_become(connection, context, variables, templar)
    context.set_attributes_from_plugin(connection)
    task_keys = {"timeout": context.timeout, **({"password": context.password} if context.password else {})}
    options = _plugin_vars("connection", connection, variables, templar)
    if getattr(connection, "allow_extras", False):  # a plugin that takes ansible_<prefix>_* variables of its own
        prefix = f"ansible_{connection.extras_prefix}_"
        options["_extras"] = {n: templar.template(v) for n, v in variables.items() if n.startswith(prefix)}
    connection.set_options(task_keys=task_keys, var_options=options)
    connection._shell.set_options(var_options=_plugin_vars("shell", connection._shell, variables, templar))
    if connection.become is not None:
        become_keys = {"become_pass": context.become_pass} if context.become_pass else {}
        become_vars = _plugin_vars("become", connection.become, variables, templar)
        connection.become.set_options(task_keys=become_keys, var_options=become_vars)
    return connection, context.executable


def _set_become(connection: Any, context: Any, variables: dict, templar: Any) -> None:
    from ansible import constants as C
    from ansible.module_utils.parsing.convert_bool import boolean
    from ansible.plugins.loader import become_loader

    become = boolean(templar.template(variables.get("ansible_become", C.DEFAULT_BECOME)))
    if not become:
        connection.set_become_plugin(None)
        return
    method = templar.template(variables.get("ansible_become_method") or C.DEFAULT_BECOME_METHOD)
    plugin = become_loader.get(method)
    if plugin is None:
        raise UsageError(f"no become plugin named {method!r}")
    connection.set_become_plugin(plugin)
    context.set_become_plugin(plugin.name)


def _plugin_vars(kind: str, plugin: Any, variables: dict, templar: Any) -> dict:
    from ansible import constants as C

    names = C.config.get_plugin_vars(kind, plugin._load_name)
    return {n: templar.template(variables[n]) for n in names if n in variables}
