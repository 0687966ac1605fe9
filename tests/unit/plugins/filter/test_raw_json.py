"""The JSON a raw command printed last (plugins/module_utils/json_record.py, last_json_line), as the provision_state
role (the filter provision.pve_sglang.raw_json), provision/locks.py and provision/verify.py read it."""

from __future__ import annotations

import importlib

import pytest
from ansible.errors import AnsibleFilterError

from tests.unit import collection  # Ansible's collection finder, with this checkout first

raw_json = importlib.import_module(f"{collection.PACKAGE}.filter.raw_json").raw_json


@pytest.mark.parametrize(
    "output",
    [
        '{"lock": {"released": true}}\n',
        'Welcome to node9 (managed by the bastion)\n{"lock": {"released": true}}\n',
        # raw through a tty: CRLF line ends, and a greeting that looks like JSON but is not the last line
        '{"motd": 1}\r\nhello\r\n{"lock": {"released": true}}\r\n\r\n',
    ],
)
def test_the_last_line_is_the_commands_json_whatever_came_before(output):
    assert raw_json(output) == {"lock": {"released": True}}


@pytest.mark.parametrize("output", ["", "\n", "Welcome\n", '{"lock": 1}\nbye from .bash_logout\n', "[1, 2]\n"])
def test_no_json_object_on_the_last_line_is_an_error_that_shows_the_output(output):
    with pytest.raises(AnsibleFilterError, match=r"^raw_json: no JSON object on the last line of the output: "):
        raw_json(output)
