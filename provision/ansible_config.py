"""The user's ansible.cfg, found the way Ansible finds it, with provision's settings only where it is silent.

provision never replaces the user's configuration: a bastion `ProxyCommand` in `ssh_args`,
callbacks (ARA, profile_tasks), vault identities, become settings and collections paths all
keep working. What provision wants for speed (Mitogen, pipelining, ControlPersist, forks) is
given as `ANSIBLE_*` environment variables, and only for settings whose value Ansible's own
ConfigManager reports as its default (neither the user's file nor the user's environment sets
them). Host key checking is the one exception: it is always given, on unless the caller turns
it off, and then nothing unverified is written to a known_hosts file.
"""

from __future__ import annotations

import functools
import os
import re
from pathlib import Path
from typing import Any

# (setting, connection plugin or None for a base setting) -> the environment variable provision sets
SSH = "ssh"
FORKS = ("DEFAULT_FORKS", None)
STRATEGY = ("DEFAULT_STRATEGY", None)
STRATEGY_PLUGINS = ("DEFAULT_STRATEGY_PLUGIN_PATH", None)
CALLBACK_PLUGINS = ("DEFAULT_CALLBACK_PLUGIN_PATH", None)
STDOUT_CALLBACK = ("DEFAULT_STDOUT_CALLBACK", None)
# provision builds its console and records from the run's job events, through ansible-runner's display callback,
# which wraps the stdout callback the environment names: Ansible's own default keeps those events whole (a `json`
# stdout callback holds them back, and the run reads as failed without a word)
RUN_STDOUT_CALLBACK = "default"
INTERPRETER = ("INTERPRETER_PYTHON", None)
RETRY_FILES = ("RETRY_FILES_ENABLED", None)
TIMEOUT = ("timeout", SSH)
PIPELINING = ("pipelining", SSH)
SSH_ARGS = ("ssh_args", SSH)
CONTROL_PATH_DIR = ("control_path_dir", SSH)
SSH_RETRIES = ("reconnection_retries", SSH)
ENV = {
    FORKS: "ANSIBLE_FORKS",
    STRATEGY: "ANSIBLE_STRATEGY",
    STRATEGY_PLUGINS: "ANSIBLE_STRATEGY_PLUGINS",
    CALLBACK_PLUGINS: "ANSIBLE_CALLBACK_PLUGINS",
    INTERPRETER: "ANSIBLE_PYTHON_INTERPRETER",
    RETRY_FILES: "ANSIBLE_RETRY_FILES_ENABLED",
    TIMEOUT: "ANSIBLE_TIMEOUT",
    PIPELINING: "ANSIBLE_PIPELINING",
    SSH_ARGS: "ANSIBLE_SSH_ARGS",
    CONTROL_PATH_DIR: "ANSIBLE_SSH_CONTROL_PATH_DIR",
    SSH_RETRIES: "ANSIBLE_SSH_RETRIES",
}
# Every name Ansible reads host key checking from, base and per plugin: all get the same value.
HOST_KEY_CHECKING_ENV = (
    "ANSIBLE_HOST_KEY_CHECKING",
    "ANSIBLE_SSH_HOST_KEY_CHECKING",
    "ANSIBLE_PARAMIKO_HOST_KEY_CHECKING",
)
CONNECTION_PLUGINS = ("ssh", "paramiko_ssh")
# paramiko asks "Are you sure you want to continue connecting (yes/no)?" about an unknown key on the run's pty, where
# nobody answers, unless it believes the connection persistent: then it fails at once naming the key
# (plugins/connection/paramiko_ssh.py MyAddPolicy). The setting changes nothing else for ssh, paramiko or local.
FAIL_ON_UNKNOWN_KEY_ENV = {"ANSIBLE_USE_PERSISTENT_CONNECTIONS": "True"}

OUR_SSH_ARGS = (
    "-o ControlMaster=auto -o ControlPersist=120s -o ServerAliveInterval=15 -o ServerAliveCountMax=4 "
    "-o ConnectTimeout=20"
)
# With checking off, ssh would still record each unverified key for later runs to trust.
UNVERIFIED_KEYS_NOWHERE = "-o UserKnownHostsFile=/dev/null"
STRICT_KEYS = "-o StrictHostKeyChecking=yes"


def user_config_file() -> Path | None:
    """The ansible.cfg Ansible itself would read from here: $ANSIBLE_CONFIG, ./ansible.cfg
    (unless the directory is world-writable), ~/.ansible.cfg, /etc/ansible/ansible.cfg."""
    from ansible.config.manager import find_ini_config_file

    found = find_ini_config_file()
    return Path(found).resolve() if found else None


@functools.cache
def plugin_definitions() -> dict[str, dict]:
    """The connection plugins' own option definitions (their DOCUMENTATION), loaded once."""
    from ansible import constants as C
    from ansible.plugins.loader import connection_loader, init_plugin_loader
    from ansible.utils.collection_loader import AnsibleCollectionConfig

    if AnsibleCollectionConfig.collection_finder is None:  # once per process, as ansible's own CLIs do
        init_plugin_loader()
    for name in CONNECTION_PLUGINS:
        connection_loader.get(name, class_only=True)
    return {name: C.config.get_configuration_definitions("connection", name) for name in CONNECTION_PLUGINS}


def config_manager(path: Path | None) -> Any:
    """Ansible's ConfigManager over the user's file, with the connection plugins' settings known."""
    from ansible.config.manager import ConfigManager

    manager = ConfigManager(str(path) if path else None)
    for name, definitions in plugin_definitions().items():
        manager.initialize_plugin_configuration_definitions("connection", name, definitions)
    return manager


# Settings of the user's environment or ansible.cfg that would silently change what provision runs, each with the
# test of a value that does and why it is refused. The phases are chosen with --tags, and a run that skips some of
# its tasks would still report itself converged.
LOCAL_CONNECTIONS = ("local", "mitogen_local")  # by their last name: ansible.builtin.local, ansible.legacy.local
_NARROWS = "would silently leave tasks of provision's run out: remove it, and choose phases with --tags"
RUN_SETTINGS = {
    ("TAGS_RUN", None): (bool, _NARROWS),
    ("TAGS_SKIP", None): (bool, _NARROWS),
    ("DEFAULT_KEEP_REMOTE_FILES", None): (
        bool,
        "would leave every task's module on the hosts with its arguments, secrets among them: remove it",
    ),
    ("DEFAULT_TRANSPORT", None): (
        lambda value: str(value).rsplit(".", 1)[-1] in LOCAL_CONNECTIONS,
        "would run every host's tasks, reboots included, on this controller: remove it, provision reaches its hosts "
        "over ssh",
    ),
    ("DEFAULT_HASH_BEHAVIOUR", None): (
        lambda value: value != "replace",
        "would merge dictionaries from the inventory's layers where the roles expect the nearest one to win: remove it",
    ),
    ("ENABLE_TASK_DEBUGGER", None): (
        bool,
        "would stop a failed task at a debugger prompt that nobody answers in provision's runs: remove it",
    ),
    ("DEFAULT_STRATEGY", None): (
        lambda value: str(value).rsplit(".", 1)[-1] == "debug",
        "would stop a failed task at a debugger prompt that nobody answers in provision's runs: remove it",
    ),
    ("ANY_ERRORS_FATAL", None): (
        bool,
        "would stop the gpu, sglang and verify phases on every host at one host's failure, where provision finishes "
        "the others and reports each: remove it",
    ),
}


# how ansible-core's ConfigManager names a setting whose value it refuses (config/manager.py, _get_config_label)
_REFUSED = re.compile(r"[Cc]onfig '(?P<name>[A-Z0-9_]+)'(?! for)")


def refused_setting(message: str) -> str | None:
    """One line for a base setting whose value Ansible refuses, naming where it is set (the ansible.cfg file with its
    [section] key, or the environment variable) and the values it takes where it has a list of them. None for a
    message about anything else."""
    from ansible.config.manager import ConfigManager  # not config_manager(): that imports the settings that failed

    found = _REFUSED.search(message)
    if not found:
        return None
    definition = ConfigManager().get_configuration_definition(found["name"]) or {}
    path = user_config_file()
    variables = [e["name"] for e in definition.get("env") or []]
    origin = re.search(r" from '(?:env: )?(?P<origin>[^']+)'", message)
    if origin is None:  # "Invalid value … for config …" names no origin: the environment wins over the file
        given = [v for v in variables if v in os.environ]
        origin = given[0] if given else str(path)
    else:
        origin = origin["origin"]
    if origin in variables:
        places = [f"${origin}"]
    else:
        places = [f"{path} [{i['section']}] {i['key']}" for i in definition.get("ini") or [] if path]
    choices = definition.get("choices")
    valid = f" It takes: {', '.join(map(str, choices))}." if isinstance(choices, list | tuple | dict) else ""
    return f"{' or '.join(places) or found['name']}: {message}{valid}"


def run_setting_problems() -> list[str]:
    """One line per setting of RUN_SETTINGS the user's environment or ansible.cfg sets to a value it refuses, naming
    where."""
    manager = config_manager(user_config_file())
    problems = []
    for setting, (refused, why) in RUN_SETTINGS.items():
        value, origin = lookup(manager, setting)
        if origin != "default" and refused(value):
            shown = ",".join(map(str, value)) if isinstance(value, list | tuple) else str(value)
            problems.append(f"{origin}: {setting[0].lower()} = {shown} {why}")
    return problems


def run_setting_warnings(host_count: int) -> list[str]:
    """One line where the user's environment or ansible.cfg sets fewer forks than provision would give a run of
    `host_count` hosts (forks_for): provision keeps the user's word (a bastion may allow only so many sessions).
    One where it names a stdout callback, which provision's runs replace (RUN_STDOUT_CALLBACK). One where the
    installed Mitogen is not tested with the installed ansible-core, and the runs are linear (mitogen_untested)."""
    manager = config_manager(user_config_file())
    found = []
    value, origin = lookup(manager, FORKS)
    wanted = forks_for(host_count)
    if origin != "default" and int(value) < wanted:
        found.append(
            f"{origin}: forks = {value}: Ansible works on {value} host(s) at a time, where provision would "
            f"work on {wanted} at once"
        )
    untested = mitogen_untested()
    if untested and not os.environ.get("PROVISION_ANSIBLE_STRATEGY") and lookup(manager, STRATEGY)[1] == "default":
        found.append(untested)
    value, origin = lookup(manager, STDOUT_CALLBACK)
    if origin != "default" and str(value).rsplit(".", 1)[-1] != RUN_STDOUT_CALLBACK:
        found.append(
            f"{origin}: stdout_callback = {value}: provision's runs use Ansible's default stdout callback "
            "(provision shows and records each run from its events)"
        )
    return found


def forks_for(host_count: int) -> int:
    """provision's forks for a run of `host_count` hosts: all at once, up to 50."""
    return max(1, min(host_count, 50))


def lookup(manager: Any, setting: tuple[str, str | None], variables: dict | None = None) -> tuple[Any, str]:
    """(value, origin) as Ansible resolves it: origin is 'default' where the user says nothing."""
    name, plugin = setting
    if plugin is None:
        return manager.get_config_value_and_origin(name, variables=variables)
    return manager.get_config_value_and_origin(name, plugin_type="connection", plugin_name=plugin, variables=variables)


# The Mitogen releases each ansible-core minor is tested with: the whole suite runs under Mitogen, which patches its
# strategy into ansible-core's internals while its loader sets no upper bound on the core it accepts. Elsewhere the
# runs use Ansible's linear strategy, and say so once (run_setting_warnings).
MITOGEN_TESTED = {(2, 19): ((0, 3, 54), (0, 4))}


def _release(text: str) -> tuple[int, ...]:
    return tuple(int(part) for part in re.findall(r"\d+", text)[:3])


def mitogen_untested() -> str | None:
    """One line when the installed Mitogen is not a release tested with the installed ansible-core minor
    (MITOGEN_TESTED); None where it is, or where Mitogen is not installed (the runs are linear without a word)."""
    from importlib import metadata

    from ansible.release import __version__ as core

    try:
        mitogen = metadata.version("mitogen")
    except metadata.PackageNotFoundError:
        return None
    low, high = MITOGEN_TESTED.get(_release(core)[:2], ((), ()))
    if low and low <= _release(mitogen) < high:
        return None
    return (
        f"Mitogen {mitogen} is not tested with ansible-core {core}: the runs use Ansible's linear strategy "
        "(PROVISION_ANSIBLE_STRATEGY=mitogen_linear uses Mitogen anyway)"
    )


def _default_strategy() -> str:
    """Mitogen's where it is installed and tested with this ansible-core, else linear; PROVISION_ANSIBLE_STRATEGY
    names another."""
    given = os.environ.get("PROVISION_ANSIBLE_STRATEGY")
    if given:
        return given
    return "mitogen_linear" if mitogen_untested() is None else "linear"


def _mitogen_strategy_dir() -> Path | None:
    try:
        import ansible_mitogen
    except ImportError:
        return None
    path = Path(ansible_mitogen.__file__).resolve().parent / "plugins" / "strategy"
    return path if path.is_dir() else None


def _wanted(forks: int, control_dir: Path) -> dict[tuple[str, str | None], str]:
    """What provision would set: Mitogen keeps one interpreter per host for the whole run
    (docs/performance.md), pipelining and ControlPersist make each task one round trip."""
    wanted = {
        FORKS: str(forks),
        INTERPRETER: "auto_silent",
        RETRY_FILES: "False",
        TIMEOUT: "30",
        PIPELINING: "True",
        SSH_ARGS: OUR_SSH_ARGS,
        CONTROL_PATH_DIR: str(control_dir),
        SSH_RETRIES: "1",
    }
    strategy = _default_strategy()
    plugins = _mitogen_strategy_dir() if strategy == "mitogen_linear" else None
    if plugins is not None:
        wanted[STRATEGY_PLUGINS] = str(plugins)
    wanted[STRATEGY] = strategy if strategy != "mitogen_linear" or plugins is not None else "linear"
    return wanted


def _paths(value: Any) -> list[str]:
    return [str(v) for v in value] if isinstance(value, list | tuple) else [str(value)] if value else []


def environment(forks: int, host_key_checking: bool, control_dir: Path) -> dict[str, str]:
    """The environment for ansible-playbook: the user's config file named explicitly (runner starts
    ansible-playbook in another directory), and provision's settings where the user is silent."""
    path = user_config_file()
    manager = config_manager(path)
    env: dict[str, str] = {"ANSIBLE_CONFIG": str(path)} if path else {}
    user_strategy = lookup(manager, STRATEGY)[1] != "default"
    for setting, value in _wanted(forks, control_dir).items():
        current, origin = lookup(manager, setting)
        if setting in (STRATEGY, STRATEGY_PLUGINS) and user_strategy:
            continue  # the user's strategy, with the user's plugin path
        if setting == STRATEGY_PLUGINS and origin != "default":
            value = os.pathsep.join([*_paths(current), value])  # the user's plugins, Mitogen's after them
        elif origin != "default":
            continue
        env[ENV[setting]] = value
    callbacks, origin = lookup(manager, CALLBACK_PLUGINS)
    if origin != "default":  # runner appends its own callback to this variable: keep the user's (ARA) in it
        env[ENV[CALLBACK_PLUGINS]] = os.pathsep.join(_paths(callbacks))
    env.update(dict.fromkeys(HOST_KEY_CHECKING_ENV, str(host_key_checking)))
    env["ANSIBLE_STDOUT_CALLBACK"] = RUN_STDOUT_CALLBACK
    # ssh keeps an option's first value, and a value on its command line beats every config file: ssh_args come
    # before the inventory's ssh_common_args and extra args, so provision's word on host keys goes first in them
    args = env.get(ENV[SSH_ARGS]) or str(lookup(manager, SSH_ARGS)[0] or "")
    if host_key_checking:
        env.update(FAIL_ON_UNKNOWN_KEY_ENV)
        # Ansible says nothing to ssh when checking is on, so a user's `StrictHostKeyChecking accept-new` (in
        # ~/.ssh/config, /etc/ssh/ssh_config.d/ or a -F file) would trust and record any new key: say yes
        env[ENV[SSH_ARGS]] = f"{STRICT_KEYS} {args}".strip()
    else:
        # the inventory's ssh_common_args may name a known_hosts file: /dev/null goes first
        env["ANSIBLE_PARAMIKO_RECORD_HOST_KEYS"] = "False"
        env[ENV[SSH_ARGS]] = f"{UNVERIFIED_KEYS_NOWHERE} {args}".strip()
    return env
