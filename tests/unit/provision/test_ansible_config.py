"""The user's ansible.cfg is honoured: provision's settings only where Ansible reports its default."""

from __future__ import annotations

import os
import textwrap
from pathlib import Path

import pytest

from provision import ansible_config


@pytest.fixture
def in_dir(tmp_path, monkeypatch):
    """A private (not world-writable) working directory with no ANSIBLE_* in the environment."""
    tmp_path.chmod(0o755)
    monkeypatch.chdir(tmp_path)
    for name in list(os.environ):
        if name.startswith("ANSIBLE_"):
            monkeypatch.delenv(name)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    return tmp_path


def _cfg(root: Path, text: str) -> None:
    (root / "ansible.cfg").write_text(textwrap.dedent(text))


def test_silent_user_gets_provisions_settings(in_dir):
    env = ansible_config.environment(7, True, in_dir / "cp")
    assert "ANSIBLE_CONFIG" not in env
    assert env["ANSIBLE_FORKS"] == "7" and env["ANSIBLE_PIPELINING"] == "True"
    assert "ControlPersist" in env["ANSIBLE_SSH_ARGS"]
    assert all(env[name] == "True" for name in ansible_config.HOST_KEY_CHECKING_ENV)


def test_users_cfg_in_working_directory_wins(in_dir):
    _cfg(
        in_dir,
        """\
        [defaults]
        forks = 3
        pipelining = False
        callback_plugins = /opt/ara/plugins/callback
        [ssh_connection]
        ssh_args = -o ProxyCommand="ssh -W %h:%p bastion" ; the bastion
        timeout = 60
        [connection]
        retries = 5
        """,
    )
    env = ansible_config.environment(7, True, in_dir / "cp")
    assert env["ANSIBLE_CONFIG"] == str(in_dir / "ansible.cfg")
    for name in ("ANSIBLE_FORKS", "ANSIBLE_PIPELINING", "ANSIBLE_TIMEOUT", "ANSIBLE_SSH_RETRIES"):
        assert name not in env, f"{name} overrides the user's own value"
    # the user's ssh_args, kept whole, after the one option provision always gives: host keys are checked
    assert env["ANSIBLE_SSH_ARGS"] == '-o StrictHostKeyChecking=yes -o ProxyCommand="ssh -W %h:%p bastion"'

    assert env["ANSIBLE_CALLBACK_PLUGINS"] == "/opt/ara/plugins/callback"  # runner appends its own after it
    assert env["ANSIBLE_SSH_CONTROL_PATH_DIR"] == str(in_dir / "cp")  # silent there: provision's


def test_users_environment_wins(in_dir, monkeypatch):
    monkeypatch.setenv("ANSIBLE_STRATEGY", "free")
    env = ansible_config.environment(7, True, in_dir / "cp")
    assert "ANSIBLE_STRATEGY" not in env and "ANSIBLE_STRATEGY_PLUGINS" not in env


def test_users_strategy_plugins_keep_mitogen_reachable(in_dir, monkeypatch):
    monkeypatch.delenv("PROVISION_ANSIBLE_STRATEGY", raising=False)
    _cfg(in_dir, "[defaults]\nstrategy_plugins = /opt/site/strategy\n")
    env = ansible_config.environment(3, True, in_dir)
    paths = env["ANSIBLE_STRATEGY_PLUGINS"].split(os.pathsep)
    assert paths[0] == "/opt/site/strategy" and (Path(paths[-1]) / "mitogen_linear.py").is_file()
    assert env["ANSIBLE_STRATEGY"] == "mitogen_linear"


def test_mitogen_unless_switched_off(in_dir, monkeypatch):
    monkeypatch.delenv("PROVISION_ANSIBLE_STRATEGY", raising=False)
    env = ansible_config.environment(3, True, in_dir)
    assert env["ANSIBLE_STRATEGY"] == "mitogen_linear"
    assert (Path(env["ANSIBLE_STRATEGY_PLUGINS"]) / "mitogen_linear.py").is_file()
    monkeypatch.setenv("PROVISION_ANSIBLE_STRATEGY", "linear")
    env = ansible_config.environment(3, True, in_dir)
    assert env["ANSIBLE_STRATEGY"] == "linear" and "ANSIBLE_STRATEGY_PLUGINS" not in env


def test_a_mitogen_not_tested_with_this_core_gives_linear_runs_and_says_so_once(in_dir, monkeypatch):
    """A Mitogen release outside MITOGEN_TESTED's range for the installed ansible-core minor: the runs use the
    linear strategy, and the warnings every command prints name both versions; asked for by name, Mitogen runs."""
    from importlib import metadata

    from ansible.release import __version__ as core

    monkeypatch.delenv("PROVISION_ANSIBLE_STRATEGY", raising=False)
    real = metadata.version
    monkeypatch.setattr(metadata, "version", lambda name: "0.4.1" if name == "mitogen" else real(name))
    env = ansible_config.environment(3, True, in_dir)
    assert env["ANSIBLE_STRATEGY"] == "linear" and "ANSIBLE_STRATEGY_PLUGINS" not in env
    lines = [w for w in ansible_config.run_setting_warnings(1) if "Mitogen" in w]
    assert lines == [
        f"Mitogen 0.4.1 is not tested with ansible-core {core}: the runs use Ansible's linear strategy "
        "(PROVISION_ANSIBLE_STRATEGY=mitogen_linear uses Mitogen anyway)"
    ]
    monkeypatch.setenv("PROVISION_ANSIBLE_STRATEGY", "mitogen_linear")
    assert ansible_config.environment(3, True, in_dir)["ANSIBLE_STRATEGY"] == "mitogen_linear"
    assert not [w for w in ansible_config.run_setting_warnings(1) if "Mitogen" in w]


def test_the_installed_mitogen_and_core_are_a_tested_pair(in_dir, monkeypatch):
    monkeypatch.delenv("PROVISION_ANSIBLE_STRATEGY", raising=False)
    assert ansible_config.mitogen_untested() is None, "pyproject.toml installs a pair MITOGEN_TESTED does not list"
    assert not [w for w in ansible_config.run_setting_warnings(1) if "Mitogen" in w]


def test_host_key_checking_is_forced_under_every_name(in_dir, monkeypatch):
    monkeypatch.setenv("ANSIBLE_SSH_HOST_KEY_CHECKING", "False")  # would beat ANSIBLE_HOST_KEY_CHECKING
    monkeypatch.setenv("ANSIBLE_USE_PERSISTENT_CONNECTIONS", "False")
    env = ansible_config.environment(1, True, in_dir)
    assert [env[n] for n in ansible_config.HOST_KEY_CHECKING_ENV] == ["True"] * 3
    # paramiko fails on an unknown key instead of asking on a pty nobody reads (tests/test_apply_ssh.py runs it)
    assert env["ANSIBLE_USE_PERSISTENT_CONNECTIONS"] == "True"


def test_host_key_checking_off_records_no_key(in_dir):
    _cfg(in_dir, '[ssh_connection]\nssh_args = -o ProxyCommand="nc bastion %h %p"\n')
    env = ansible_config.environment(1, False, in_dir)
    assert env["ANSIBLE_HOST_KEY_CHECKING"] == "False" and env["ANSIBLE_PARAMIKO_RECORD_HOST_KEYS"] == "False"
    # first, so that it wins over a UserKnownHostsFile in the inventory's ssh_common_args; the user's args kept
    assert env["ANSIBLE_SSH_ARGS"] == '-o UserKnownHostsFile=/dev/null -o ProxyCommand="nc bastion %h %p"'
