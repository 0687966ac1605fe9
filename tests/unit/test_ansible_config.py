"""The user's ansible.cfg is honoured: provision's settings only where it is silent."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from provision import ansible_config


@pytest.fixture
def in_dir(tmp_path, monkeypatch):
    """A private (not world-writable) working directory with no ANSIBLE_* in the environment."""
    tmp_path.chmod(0o755)
    monkeypatch.chdir(tmp_path)
    for name in list(__import__("os").environ):
        if name.startswith("ANSIBLE_"):
            monkeypatch.delenv(name)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    return tmp_path


def test_silent_user_gets_provisions_settings(in_dir, monkeypatch):
    monkeypatch.setattr(ansible_config, "user_config_file", lambda: None)
    env = ansible_config.environment(7, True, in_dir / "cp", environ={})
    assert "ANSIBLE_CONFIG" not in env
    assert env["ANSIBLE_FORKS"] == "7" and env["ANSIBLE_PIPELINING"] == "True"
    assert "ControlPersist" in env["ANSIBLE_SSH_ARGS"] and env["ANSIBLE_HOST_KEY_CHECKING"] == "True"


def test_users_cfg_in_working_directory_wins(in_dir):
    (in_dir / "ansible.cfg").write_text(
        textwrap.dedent(
            """\
            [defaults]
            forks = 3
            callbacks_enabled = ansible.posix.profile_tasks
            [ssh_connection]
            ssh_args = -o ProxyCommand="ssh -W %h:%p bastion"
            """
        )
    )
    env = ansible_config.environment(7, True, in_dir / "cp", environ={})
    assert env["ANSIBLE_CONFIG"] == str(in_dir / "ansible.cfg")
    assert "ANSIBLE_FORKS" not in env and "ANSIBLE_SSH_ARGS" not in env  # the user's own values stand
    assert env["ANSIBLE_PIPELINING"] == "True"  # silent there: provision's


def test_users_environment_wins(in_dir, monkeypatch):
    monkeypatch.setattr(ansible_config, "user_config_file", lambda: None)
    env = ansible_config.environment(7, True, in_dir / "cp", environ={"ANSIBLE_STRATEGY": "free"})
    assert "ANSIBLE_STRATEGY" not in env and "ANSIBLE_STRATEGY_PLUGINS" not in env


def test_mitogen_unless_switched_off(in_dir, monkeypatch):
    monkeypatch.setattr(ansible_config, "user_config_file", lambda: None)
    monkeypatch.delenv("PROVISION_ANSIBLE_STRATEGY", raising=False)
    env = ansible_config.environment(3, True, in_dir, environ={})
    assert env["ANSIBLE_STRATEGY"] == "mitogen_linear"
    assert (Path(env["ANSIBLE_STRATEGY_PLUGINS"]) / "mitogen_linear.py").is_file()
    monkeypatch.setenv("PROVISION_ANSIBLE_STRATEGY", "linear")
    env = ansible_config.environment(3, True, in_dir, environ={})
    assert env["ANSIBLE_STRATEGY"] == "linear" and "ANSIBLE_STRATEGY_PLUGINS" not in env


def test_host_key_checking_off_records_no_key(in_dir):
    (in_dir / "ansible.cfg").write_text('[ssh_connection]\nssh_args = -o ProxyCommand="nc bastion %h %p"\n')
    env = ansible_config.environment(1, False, in_dir, environ={})
    assert env["ANSIBLE_HOST_KEY_CHECKING"] == "False" and env["ANSIBLE_PARAMIKO_RECORD_HOST_KEYS"] == "False"
    # first, so that it wins over a UserKnownHostsFile in the inventory's ssh_common_args; the user's args kept
    assert env["ANSIBLE_SSH_ARGS"] == '-o UserKnownHostsFile=/dev/null -o ProxyCommand="nc bastion %h %p"'
