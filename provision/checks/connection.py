"""testinfra's `host` over one connection that Ansible makes and keeps for the whole check run.

The checks' process builds the host's connection plugin once, as ansible-core's task executor does for a task:
the plugin by `ansible_connection`, its options from the host's templated variables (`hostvars` included) and the
run's ansible.cfg and environment, the become plugin by `ansible_become`. Every testinfra command then runs
through that plugin's `exec_command`, as an action plugin's low-level command does, without a terminal, so that
stdout and stderr stay apart as testinfra reads them. With ssh and ControlPersist in its arguments (provision's
where the user's ansible.cfg sets none), every command after the first goes over the master the first one opened.

So the user's ansible.cfg, ProxyCommand or ProxyJump, ssh arguments, become and vault apply as in apply, over
Ansible's ssh, paramiko_ssh or local connection. `host.ansible(...)` runs a module through the `ansible` CLI, as
testinfra's own ansible backend does.
"""

from __future__ import annotations

import functools
import re
import shlex
from pathlib import Path
from typing import Any

from testinfra.backend.ansible import AnsibleBackend
from testinfra.backend.base import BaseBackend, CommandResult
from testinfra.host import Host

from provision import inventory as inventory_mod
from provision.errors import ProvisionError, one_line

# a become plugin's success marker, which ssh and local take out of the output themselves and paramiko_ssh does not
# (ansible-core's ActionBase._strip_success_message)
_BECOME_SUCCESS = re.compile(r"^((\r)?\n)?BECOME-SUCCESS.*(\r)?\n")
# the connection options that ask the remote side for a terminal: ssh's -tt, paramiko's pty
_TERMINAL_OPTIONS = ("use_tty", "pty")


class Unreachable(ProvisionError):
    """The checks' connection to a host could not be set up."""


class AnsibleConnectionBackend(BaseBackend):
    """A testinfra backend whose commands run through a connected Ansible connection plugin."""

    NAME = "provision-ansible"
    HAS_RUN_ANSIBLE = True

    def __init__(self, hostname: str, connection: Any, executable: str | None, inventory: str, **kwargs: Any) -> None:
        self.connection = connection
        self.executable = executable
        self.inventory = inventory
        super().__init__(hostname, **kwargs)

    def run(self, command: str, *args: str, **kwargs: Any) -> CommandResult:
        command = self.get_command(command, *args)
        rc, stdout, stderr = self.connection.exec_command(self._wrapped(command), in_data=None, sudoable=True)
        stdout = _BECOME_SUCCESS.sub("", stdout.decode(errors="surrogateescape")).encode(errors="surrogateescape")
        return self.result(0 if rc is None else rc, self.encode(command), stdout, stderr)

    def _wrapped(self, command: str) -> str:
        """The command as ansible-core's ActionBase._low_level_execute_command hands it to the plugin: through the
        become plugin where the users differ (or become_allow_same_user), then the shell executable, with its
        `sleep 0` (Ansible's guard against ssh dropping the last of stdout)."""
        connection = self.connection
        if connection.become is not None and _becomes(connection):
            command = connection.become.build_become_command(command, connection._shell)
        if connection.allow_executable and self.executable:
            command = connection._shell.append_command(command, "sleep 0")
            command = f"{self.executable} -c {shlex.quote(command)}"
        return command

    def run_ansible(self, module_name: str, module_args: str | None = None, **kwargs: Any) -> Any:
        """A module through the `ansible` CLI, as testinfra's ansible backend runs it (`host.ansible`)."""
        return self._cli.run_ansible(module_name, module_args, **kwargs)

    def get_variables(self) -> dict[str, Any]:
        return self._cli.get_variables()

    @functools.cached_property
    def _cli(self) -> AnsibleBackend:
        return AnsibleBackend(self.hostname, ansible_inventory=self.inventory, force_ansible=True)


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
    """testinfra's Host for `name` of `inventory`, over its Ansible connection; Unreachable, the same for every
    check of the run, where the connection cannot be set up."""
    found = _host(inventory, name)
    if isinstance(found, Unreachable):
        raise found
    return found


@functools.cache
def _host(inventory: str, name: str) -> Host | Unreachable:
    try:
        connection, executable = connect(_inventory(inventory), name)
    except Exception as exc:  # Ansible raises AnsibleError and its subclasses, plugins anything
        return Unreachable(f"host {name}: its Ansible connection cannot be set up: {one_line(exc, 300)}")
    return Host(AnsibleConnectionBackend(name, connection, executable, inventory))


def connect(inv: inventory_mod.Inventory, name: str) -> tuple[Any, str | None]:
    """The host's connection plugin, its options set as ansible-core's TaskExecutor sets them for a task of a play
    that names no connection keywords (_execute, _get_connection, _set_become_plugin, _set_connection_options), and
    the shell executable its commands run under. ansible-core has no public call that sets a connection up outside
    a play, so these are its steps, through the plugins' public option API."""
    from ansible import constants as C
    from ansible.playbook.play_context import PlayContext
    from ansible.playbook.task import Task
    from ansible.plugins.loader import connection_loader
    from ansible.template import Templar
    from ansible.vars.hostvars import HostVars
    from ansible.vars.manager import VariableManager

    host = inv.manager.get_host(name)
    manager = VariableManager(loader=inv.loader, inventory=inv.manager)
    # a task's variables, `hostvars` among them (the task queue manager hands the play its HostVars)
    variables = {**manager.get_vars(host=host), "hostvars": HostVars(inv.manager, manager, inv.loader)}
    templar = Templar(loader=inv.loader, variables=variables)
    context = PlayContext().set_task_and_variable_override(task=Task(), variables=variables, templar=templar)
    context.post_validate(templar=templar)
    context.remote_addr = context.remote_addr or host.address
    # ansible_connection, else what ansible-playbook's --connection defaults to
    given = variables.get("ansible_connection")
    context.connection = templar.template(given) if given is not None else C.DEFAULT_TRANSPORT
    connection = connection_loader.get(context.connection, context)
    if connection is None:
        raise Unreachable(f"host {name}: no connection plugin named {context.connection!r}")
    _set_become(connection, context, variables, templar)
    context.set_attributes_from_plugin(connection)
    task_keys = {"timeout": context.timeout, **({"password": context.password} if context.password else {})}
    connection.set_options(task_keys=task_keys, var_options=_connection_vars(connection, variables, templar))
    connection._shell.set_options(var_options=_plugin_vars("shell", connection._shell, variables, templar))
    if connection.become is not None:
        become_keys = {"become_pass": context.become_pass} if context.become_pass else {}
        become_vars = _plugin_vars("become", connection.become, variables, templar)
        connection.become.set_options(task_keys=become_keys, var_options=become_vars)
    for option in _TERMINAL_OPTIONS:  # testinfra reads stdout and stderr apart: no terminal to merge them
        if connection.has_option(option):
            connection.set_option(option, False)
    return connection, context.executable


def _set_become(connection: Any, context: Any, variables: dict, templar: Any) -> None:
    from ansible import constants as C
    from ansible.errors import AnsibleError
    from ansible.module_utils.parsing.convert_bool import boolean
    from ansible.plugins.loader import become_loader

    become = boolean(_rendered(templar, variables.get("ansible_become", C.DEFAULT_BECOME), C.DEFAULT_BECOME))
    if not become:
        connection.set_become_plugin(None)
        return
    method = _rendered(templar, variables.get("ansible_become_method"), None) or C.DEFAULT_BECOME_METHOD
    plugin = become_loader.get(method)
    if plugin is None:
        raise Unreachable(f"no become plugin named {method!r}")
    if getattr(plugin, "require_tty", False) and not getattr(connection, "has_tty", False):
        raise AnsibleError(
            f"The '{connection._load_name}' connection does not provide a TTY which is required for "
            f"the selected become plugin: {plugin.name}."
        )
    connection.set_become_plugin(plugin)
    context.set_become_plugin(plugin.name)


def _connection_vars(connection: Any, variables: dict, templar: Any) -> dict:
    options = _plugin_vars("connection", connection, variables, templar)
    options["_extras"] = {}
    if getattr(connection, "allow_extras", False):  # a plugin that takes ansible_<prefix>_* variables of its own
        prefix = f"ansible_{connection.extras_prefix}_"
        extras = {n: _rendered(templar, v) for n, v in variables.items() if n.startswith(prefix) and n not in options}
        options["_extras"] = {n: v for n, v in extras.items() if v is not _OMITTED}
    return options


_OMITTED = object()


def _rendered(templar: Any, value: Any, omitted: Any = _OMITTED) -> Any:
    """The value templated; `omitted` where it renders to `omit`, which Ansible drops from a plugin's options."""
    from ansible.errors import AnsibleValueOmittedError

    try:
        return templar.template(value)
    except AnsibleValueOmittedError:
        return omitted


def _plugin_vars(kind: str, plugin: Any, variables: dict, templar: Any) -> dict:
    from ansible import constants as C

    names = C.config.get_plugin_vars(kind, plugin._load_name)
    found = {n: _rendered(templar, variables[n]) for n in names if n in variables}
    return {n: v for n, v in found.items() if v is not _OMITTED}
