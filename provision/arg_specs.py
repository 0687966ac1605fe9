"""Every variable of a host, checked before anything runs against the argument specs of the roles that run on it
(roles/*/meta/argument_specs.yml, entry point `main`, and provision_common's `shared`), by ansible-core's own
ArgumentSpecValidator: the check the roles make when they start, made at `inventory check` and before `apply`, so
that a wrong type or a missing model path is said before the kernel, driver and gpu phases, and their reboots, have
run.

Which roles run on which group is read from the packaged playbooks (a play's `hosts:` and its roles, or the roles its
tasks include). A value Ansible renders at run time (a template) or decrypts (vault) is checked by the role then.
A host variable named like a role's variables that no role declares is reported with the nearest declared name: a
typo (`sglang_tp_szie`) would otherwise be ignored, and the role would run with its default.
"""

from __future__ import annotations

import difflib
import functools
import re
from pathlib import Path
from typing import Any

import yaml

from provision.ansible_values import from_vault, is_template
from provision.paths import playbooks_dir, roles_dir

COLLECTION = "provision.pve_sglang."
# the variables a role declares begin with its name, and a few with a shared prefix (roles/provision_common)
EXTRA_PREFIXES = ("proxmox_api_", "provision_")
# The specs give integers a type only. Counts and durations (seconds, exits, repeats, GPUs, tokens) start at 1, and
# a port runs from 1 to 65535: an integer option so named out of that range is refused before the run it would fail.
_AT_LEAST_ONE = re.compile(r"(_timeout|_sec|_s|_exits|_repeats|_tp_size|_len|_per_concurrency)$")


@functools.cache
def _specs() -> dict[str, dict]:
    return {
        path.parents[1].name: (yaml.safe_load(path.read_text()) or {}).get("argument_specs", {})
        for path in sorted(roles_dir().glob("*/meta/argument_specs.yml"))
    }


# the entry point that holds a role's variables: `main`, but provision_common's `shared`, which the playbooks include
# once per run (its meta/argument_specs.yml says why)
ENTRY_POINT = {"provision_common": "shared"}


@functools.cache
def role_options() -> dict[str, dict[str, dict]]:
    """role -> the options of its `main` entry point (ENTRY_POINT names another)."""
    return {
        role: specs.get(ENTRY_POINT.get(role, "main"), {}).get("options", {}) or {} for role, specs in _specs().items()
    }


@functools.cache
def declared() -> frozenset[str]:
    """Every variable some entry point of some role declares."""
    return frozenset(
        option for specs in _specs().values() for entry in specs.values() for option in (entry.get("options") or {})
    )


@functools.cache
def dependencies(role: str) -> frozenset[str]:
    """The collection's roles `role` depends on (meta/main.yml), itself included, transitively."""
    meta = yaml.safe_load((roles_dir() / role / "meta" / "main.yml").read_text()) or {}
    found = {role}
    for dep in meta.get("dependencies") or []:
        name = dep.get("role", "") if isinstance(dep, dict) else str(dep)
        if name.startswith(COLLECTION) and name.removeprefix(COLLECTION) not in found:
            found |= dependencies(name.removeprefix(COLLECTION))
    return frozenset(found)


@functools.cache
def role_defaults(role: str) -> dict[str, Any]:
    path = roles_dir() / role / "defaults" / "main.yml"
    return (yaml.safe_load(path.read_text()) or {}) if path.is_file() else {}


def _roles_in(node: Any) -> set[str]:
    """The collection's roles a play or task list names: `roles:` entries, include_role and import_role."""
    found: set[str] = set()
    if isinstance(node, dict):
        for key, value in node.items():
            if key in ("role", "name") and isinstance(value, str) and value.startswith(COLLECTION):
                found.add(value.removeprefix(COLLECTION))
            elif key in ("roles", "tasks", "pre_tasks", "post_tasks", "block", "rescue", "always") or key.endswith(
                ("include_role", "import_role")
            ):
                found |= _roles_in(value)
    elif isinstance(node, list):
        for item in node:
            found |= _roles_in(item if not isinstance(item, str) else {"role": item})
    return found


@functools.cache
def roles_by_group(playbooks: tuple[str, ...] | None = None) -> dict[str, frozenset[str]]:
    """group -> the roles the packaged plays (of `playbooks`, names without .yml; None: all) run on it, with their
    dependencies (a play on `proxmox_hosts:&provision_stale_kernel` runs on proxmox_hosts)."""
    groups: dict[str, set[str]] = {}
    paths = sorted(Path(playbooks_dir()).glob("*.yml"))
    for path in (p for p in paths if playbooks is None or p.stem in playbooks):
        for play in yaml.safe_load(path.read_text()) or []:
            if not isinstance(play, dict) or not isinstance(play.get("hosts"), str):
                continue
            targets = [p for p in play["hosts"].split(":") if p and p[0] not in "&!{"]
            roles = set().union(*(dependencies(r) for r in _roles_in(play)))
            for group in targets:
                groups.setdefault(group, set()).update(roles)
    return {group: frozenset(roles) for group, roles in groups.items()}


def _roles(groups: set[str], playbooks: tuple[str, ...] | None = None) -> list[str]:
    return sorted(set().union(*(roles_by_group(playbooks).get(g, ()) for g in groups)))


def _checkable(value: Any) -> bool:
    return value is not None and not is_template(value) and not from_vault(value)


def missing(groups: set[str], variables: dict, playbooks: tuple[str, ...] | None = None) -> list[tuple[str, str]]:
    """(variable, problem) for each variable a role of these playbooks requires of a host in `groups` that its
    (inventory) variables leave unset or empty, where the role's default is empty too."""
    found = _missing(_roles(groups, playbooks), variables)
    return [(var, f"{var}: missing or empty: the roles that run on this host need it") for var in found]


def host_problems(groups: set[str], variables: dict, checked_elsewhere=frozenset()) -> list[tuple[str, str]]:
    """(variable, problem) for a host in `groups` with these (inventory) variables: a value of the wrong type or out
    of its choices (ArgumentSpecValidator's own words). Variables in `checked_elsewhere` have stricter rules of their
    own (provision/inventory.py VARIABLE_TYPES). Presence is missing()'s to say, for the commands that run the roles:
    a templated value, left out of what is validated here, is there."""
    from ansible.module_utils.common.arg_spec import ArgumentSpecValidator

    options: dict[str, dict] = {}
    for role in _roles(groups):
        for option, spec in role_options().get(role, {}).items():
            if option not in checked_elsewhere:
                options.setdefault(option, {**spec, "required": False})
    params = {k: v for k, v in variables.items() if k in options and _checkable(v)}
    result = ArgumentSpecValidator(options).validate(params)
    return [(_named(message, params), message) for message in result.error_messages]


@functools.cache
def int_options() -> frozenset[str]:
    """Every integer option of every entry point of every role."""
    return frozenset(
        option
        for specs in _specs().values()
        for entry in specs.values()
        for option, spec in (entry.get("options") or {}).items()
        if (spec or {}).get("type") == "int"
    )


def bound_problems(variables: dict) -> list[tuple[str, str]]:
    """(variable, problem) for each integer option out of its range (_AT_LEAST_ONE, ports)."""
    found = []
    for var, value in sorted(variables.items()):
        if var not in int_options() or not _checkable(value) or type(value) is bool:
            continue
        if not isinstance(value, int):
            continue  # the type is host_problems()'s to say
        if var.endswith("_port") and not 1 <= value <= 65535:
            found.append((var, f"{var}: {value} is not a port (1 to 65535)"))
        elif _AT_LEAST_ONE.search(var) and value < 1:
            found.append((var, f"{var}: {value} is less than 1 (it counts seconds, tries or items)"))
    return found


def host_unknown(groups: set[str], variables: dict) -> list[tuple[str, str]]:
    """(variable, problem) for each variable named like a role's of this host that no role declares: a typo that
    would leave the role's own value in force without a word."""
    return _unknown(_roles(groups), variables)


def _missing(roles: list[str], variables: dict) -> list[str]:
    """Required options the host leaves unset or empty, where the role's default is empty too."""
    missing = []
    for role in roles:
        for option, spec in role_options().get(role, {}).items():
            value = variables.get(option, role_defaults(role).get(option))
            if spec.get("required") and (value is None or (isinstance(value, str) and not value.strip())):
                missing.append(option)
    return sorted(set(missing))


def _named(message: str, params: dict) -> str:
    """The variable an Ansible validation message is about (its first quoted or named parameter)."""
    return next((p for p in sorted(params, key=len, reverse=True) if p in message), "")


def _unknown(roles: list[str], variables: dict) -> list[tuple[str, str]]:
    """Host variables named like the variables of a role of this host that no role declares."""
    names = declared()
    prefixes = tuple(f"{role}_" for role in roles) + EXTRA_PREFIXES
    found = []
    for var in sorted(variables):
        if var.startswith(prefixes) and var not in names:
            near = difflib.get_close_matches(var, sorted(names), n=1)
            hint = f"; did you mean {near[0]}?" if near else ""
            found.append((var, f"no role declares it (roles/*/meta/argument_specs.yml){hint}"))
    return found
