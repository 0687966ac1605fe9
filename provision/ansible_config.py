"""The user's ansible.cfg, found the way Ansible finds it, with provision's settings only where it is silent.

provision never replaces the user's configuration: a bastion `ProxyCommand` in `ssh_args`,
callbacks (ARA, profile_tasks), vault identities, become settings and collections paths all
keep working. What provision wants for speed (Mitogen, pipelining, ControlPersist, forks) is
given as `ANSIBLE_*` environment variables, and only for settings that neither the user's file
nor the user's environment sets. Host key checking is the one exception: it is always given,
on unless the caller turns it off, and then nothing unverified is written to a known_hosts file.
"""

from __future__ import annotations

import configparser
import contextlib
import os
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Setting:
    """One Ansible setting: where a user sets it (ini section/key, environment variable)."""

    sections: tuple[str, ...]
    key: str
    env: str


FORKS = Setting(("defaults",), "forks", "ANSIBLE_FORKS")
STRATEGY = Setting(("defaults",), "strategy", "ANSIBLE_STRATEGY")
STRATEGY_PLUGINS = Setting(("defaults",), "strategy_plugins", "ANSIBLE_STRATEGY_PLUGINS")
INTERPRETER = Setting(("defaults",), "interpreter_python", "ANSIBLE_PYTHON_INTERPRETER")
RETRY_FILES = Setting(("defaults",), "retry_files_enabled", "ANSIBLE_RETRY_FILES_ENABLED")
TIMEOUT = Setting(("defaults",), "timeout", "ANSIBLE_TIMEOUT")
PIPELINING = Setting(("ssh_connection", "connection"), "pipelining", "ANSIBLE_PIPELINING")
SSH_ARGS = Setting(("ssh_connection",), "ssh_args", "ANSIBLE_SSH_ARGS")
CONTROL_PATH_DIR = Setting(("ssh_connection",), "control_path_dir", "ANSIBLE_SSH_CONTROL_PATH_DIR")
SSH_RETRIES = Setting(("ssh_connection",), "retries", "ANSIBLE_SSH_RETRIES")

OUR_SSH_ARGS = (
    "-o ControlMaster=auto -o ControlPersist=120s -o ServerAliveInterval=15 -o ServerAliveCountMax=4 "
    "-o ConnectTimeout=20"
)
# With checking off, ssh would still record each unverified key for later runs to trust.
UNVERIFIED_KEYS_NOWHERE = "-o UserKnownHostsFile=/dev/null"


def user_config_file() -> Path | None:
    """The ansible.cfg Ansible itself would read from here: $ANSIBLE_CONFIG, ./ansible.cfg
    (unless the directory is world-writable), ~/.ansible.cfg, /etc/ansible/ansible.cfg."""
    from ansible.config.manager import find_ini_config_file

    found = find_ini_config_file()
    return Path(found).resolve() if found else None


def _read(path: Path | None) -> configparser.ConfigParser:
    parser = configparser.ConfigParser(interpolation=None, strict=False)
    if path is not None:
        # a broken file: Ansible reports it itself, with its own message
        with contextlib.suppress(configparser.Error, OSError, UnicodeDecodeError):
            parser.read(path, encoding="utf-8")
    return parser


def _user_value(setting: Setting, parser: configparser.ConfigParser, environ: dict[str, str]) -> str | None:
    if setting.env in environ:
        return environ[setting.env]
    for section in setting.sections:
        if parser.has_option(section, setting.key):
            return parser.get(section, setting.key)
    return None


def _mitogen_strategy_dir() -> Path | None:
    try:
        import ansible_mitogen
    except ImportError:
        return None
    path = Path(ansible_mitogen.__file__).resolve().parent / "plugins" / "strategy"
    return path if path.is_dir() else None


def _wanted(forks: int, control_dir: Path) -> dict[Setting, str]:
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
    strategy = os.environ.get("PROVISION_ANSIBLE_STRATEGY", "mitogen_linear")
    plugins = _mitogen_strategy_dir() if strategy == "mitogen_linear" else None
    if plugins is not None:
        wanted[STRATEGY_PLUGINS] = str(plugins)
    wanted[STRATEGY] = strategy if strategy != "mitogen_linear" or plugins is not None else "linear"
    return wanted


def environment(
    forks: int, host_key_checking: bool, control_dir: Path, environ: dict[str, str] | None = None
) -> dict[str, str]:
    """The environment for ansible-playbook: the user's config file named explicitly (runner starts
    ansible-playbook in another directory), and provision's settings where the user is silent."""
    environ = dict(os.environ if environ is None else environ)
    path = user_config_file()
    parser = _read(path)
    env: dict[str, str] = {"ANSIBLE_CONFIG": str(path)} if path else {}
    wanted = _wanted(forks, control_dir)
    user_strategy = _user_value(STRATEGY, parser, environ)
    for setting, value in wanted.items():
        if setting in (STRATEGY, STRATEGY_PLUGINS) and user_strategy is not None:
            continue  # the user's strategy, with the user's plugin path
        if _user_value(setting, parser, environ) is None:
            env[setting.env] = value
    env["ANSIBLE_HOST_KEY_CHECKING"] = str(host_key_checking)
    if not host_key_checking:
        # ssh takes the first value of an option: ssh_args come before the inventory's ssh_common_args
        # (which may name a known_hosts file), so /dev/null goes first in them, the rest as they were
        env["ANSIBLE_PARAMIKO_RECORD_HOST_KEYS"] = "False"
        args = _user_value(SSH_ARGS, parser, environ) or env.get(SSH_ARGS.env, "")
        env[SSH_ARGS.env] = f"{UNVERIFIED_KEYS_NOWHERE} {args}".strip()
    return env
