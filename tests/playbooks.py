"""One shape for the tests that run a role's tasks through ansible-playbook on this machine: the role in a block
whose failure is kept, and an outcome file the test reads (`{"failed": <the message the user sees, or null>, ...}`)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

from provision.paths import collections_path


def role_outcome_playbook(
    role: str, what: str, *, tasks_from: str = "", extra_outcome: str = "", pre_tasks: str = "", handlers: bool = True
) -> str:
    """A localhost play that includes provision.pve_sglang.<role> (`tasks_from` if given) under the task name `what`;
    `extra_outcome` adds Jinja dict entries to the outcome (", 'changed': x"); `pre_tasks` is YAML for tasks first.
    With `handlers=False` the play ends before the handlers the role notified (a service restart, say, on a machine
    without systemd)."""
    include = f"name: provision.pve_sglang.{role}" + (f"\n    tasks_from: {tasks_from}" if tasks_from else "")
    play = f"""\
- hosts: localhost
  connection: local
  gather_facts: false
  tasks:
{textwrap.indent(textwrap.dedent(pre_tasks).strip(chr(10)) + chr(10), "    ") if pre_tasks else ""}\
    - name: {what}
      block:
        - name: Run the role's tasks
          ansible.builtin.include_role:
            {textwrap.indent(include, "        ").lstrip()}
      rescue:
        - name: Keep the failure the user sees
          ansible.builtin.set_fact:
            _failure: "{{{{ ansible_failed_result.msg }}}}"
      always:
        - name: Write the outcome for the test
          ansible.builtin.copy:
            dest: "{{{{ outcome_file }}}}"
            content: "{{{{ {{'failed': _failure | default(None){extra_outcome}}} | to_json }}}}"
            mode: "0600"
          check_mode: false  # a test of check mode reads it too
"""
    if not handlers:
        play += "    - name: End before the handlers\n      ansible.builtin.meta: end_play\n"
    return play


def run_role_playbook(sh, root, playbook: str, extra: dict, collections, interpreter_var: str = "extra") -> dict:
    """Run `playbook` (a role_outcome_playbook) on localhost with `extra` vars through `sh(command, check=False)`
    (a shell: this machine's, or a mount namespace's) and return its outcome. The interpreter (this Python) is an
    extra var, or with `interpreter_var="inventory"` the host's inventory variable, which a task's own
    `ansible_python_interpreter` then overrides as it does in a real inventory."""
    outcome = Path(root) / "outcome.json"
    outcome.unlink(missing_ok=True)
    extra = {**extra, "outcome_file": str(outcome)}
    inventory = "localhost,"
    if interpreter_var == "extra":
        extra["ansible_python_interpreter"] = sys.executable
    else:
        inventory = f"{root}/hosts"
        Path(inventory).write_text(f"localhost ansible_connection=local ansible_python_interpreter={sys.executable}\n")
    (Path(root) / "site.yml").write_text(playbook)
    (Path(root) / "extra.json").write_text(json.dumps(extra))
    command = Path(sys.executable).parent / "ansible-playbook"
    env = f"ANSIBLE_COLLECTIONS_PATH={collections} ANSIBLE_NOCOLOR=1"
    proc = sh(f"{env} {command} -i {inventory} -e @{root}/extra.json {root}/site.yml", check=False)
    assert proc.returncode == 0 and outcome.exists(), proc.stdout[-3000:] + proc.stderr[-3000:]
    return json.loads(outcome.read_text())


def run_local_plays(tmp_path, plays: list, hosts: dict, *args: str, collections: str = "", **env: str):
    """ansible-playbook of `plays` on `hosts` (name -> variables, each run with the local connection), with this
    repository's collection first on the collections path (or `collections`), Ansible's output without colour, and
    `env` added to the environment: the completed process."""
    inventory = {"all": {"hosts": {name: {"ansible_connection": "local", **v} for name, v in hosts.items()}}}
    (tmp_path / "inv.json").write_text(json.dumps(inventory))
    (tmp_path / "p.yml").write_text(json.dumps(plays))
    env = {
        **os.environ,
        "ANSIBLE_COLLECTIONS_PATH": collections or collections_path(tmp_path / "collections"),
        "ANSIBLE_NOCOLOR": "1",
        "ANSIBLE_LOCALHOST_WARNING": "false",
        **env,
    }
    playbook = Path(sys.executable).parent / "ansible-playbook"
    argv = [str(playbook), "-i", str(tmp_path / "inv.json"), str(tmp_path / "p.yml"), *args]
    return subprocess.run(argv, capture_output=True, text=True, env=env)
