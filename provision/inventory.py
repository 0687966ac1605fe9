"""Load an Ansible YAML inventory and validate it before any host is contacted.

The contract (README, "Inventory reference"):
- `hosts.yml` (or `hosts.yaml`) plus optional `group_vars/` and `host_vars/`;
- group `proxmox_hosts` holds the PVE nodes, group `gpu_containers` the LXC containers;
- each container sets `proxmox_host` (a member of `proxmox_hosts`) and `proxmox_vmid`
  (an integer 100..999999999, unique per node);
- the `proxmox_api_*` variables have fixed types.

Every problem is reported as one line that names the file, the host and the variable.
Values that are Jinja templates or vault-encrypted cannot be checked here and are accepted.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from provision.errors import InventoryError

PROXMOX_HOSTS = "proxmox_hosts"
GPU_CONTAINERS = "gpu_containers"
VMID_MIN, VMID_MAX = 100, 999_999_999
SECRET_VARIABLES = ("proxmox_api_password", "proxmox_api_token_secret", "sglang_api_key")


class _Key(str):
    """A mapping key that remembers the line it was read from."""

    line: int = 0


class VaultValue(str):
    """An `!vault` value: opaque here, decrypted by Ansible at run time."""


class _Loader(yaml.SafeLoader):
    pass


def _construct_mapping(loader: _Loader, node: yaml.MappingNode) -> dict:
    loader.flatten_mapping(node)
    mapping: dict = {}
    for key_node, value_node in node.value:
        key = loader.construct_object(key_node, deep=True)
        if isinstance(key, str):
            key = _Key(key)
            key.line = key_node.start_mark.line + 1
        mapping[key] = loader.construct_object(value_node, deep=True)
    return mapping


_Loader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)
_Loader.add_constructor("!vault", lambda loader, node: VaultValue(loader.construct_scalar(node)))
_Loader.add_constructor("!unsafe", lambda loader, node: loader.construct_scalar(node))


@dataclass
class Variable:
    value: Any
    file: Path
    line: int = 0

    @property
    def where(self) -> str:
        return f"{self.file}:{self.line}" if self.line else str(self.file)

    @property
    def is_unevaluated(self) -> bool:
        """True for templates and vault values, whose real value only Ansible knows."""
        return isinstance(self.value, VaultValue) or (isinstance(self.value, str) and "{{" in self.value)


@dataclass
class Host:
    name: str
    file: Path
    line: int
    groups: set[str] = field(default_factory=set)
    vars: dict[str, Variable] = field(default_factory=dict)

    def value(self, name: str, default: Any = None) -> Any:
        var = self.vars.get(name)
        return default if var is None else var.value


@dataclass
class Inventory:
    path: Path
    hosts: dict[str, Host] = field(default_factory=dict)
    groups: dict[str, set[str]] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)

    def group(self, name: str) -> list[Host]:
        return [self.hosts[h] for h in sorted(self.groups.get(name, ()))]

    @property
    def proxmox_hosts(self) -> list[Host]:
        return self.group(PROXMOX_HOSTS)

    @property
    def gpu_containers(self) -> list[Host]:
        return self.group(GPU_CONTAINERS)


def _read_yaml(path: Path, problems: list[str]) -> Any:
    try:
        return yaml.load(path.read_text(encoding="utf-8"), Loader=_Loader)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        where = f"{path}:{mark.line + 1}:{mark.column + 1}" if mark else str(path)
        problems.append(f"{where}: YAML syntax error: {exc.problem or exc.context}")
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as exc:
        problems.append(f"{path}: cannot read: {exc}")
    return None


def _var_files(directory: Path, name: str) -> list[Path]:
    """Ansible's layout: `<dir>/<name>.yml|.yaml|<no ext>` or every YAML file in `<dir>/<name>/`."""
    files = [directory / f"{name}{ext}" for ext in (".yml", ".yaml", "")]
    found = [f for f in files if f.is_file()]
    sub = directory / name
    if sub.is_dir():
        found += sorted(p for p in sub.iterdir() if p.suffix in (".yml", ".yaml") and p.is_file())
    return found


class _Parser:
    def __init__(self, root: Path):
        self.root = root
        self.problems: list[str] = []
        self.inv = Inventory(path=root)
        # group -> list of (var name, Variable) defined in hosts.yml, and parent links
        self.group_vars: dict[str, dict[str, Variable]] = {}
        self.children: dict[str, set[str]] = {}

    def parse(self) -> Inventory:
        hosts_file = next((self.root / n for n in ("hosts.yml", "hosts.yaml") if (self.root / n).is_file()), None)
        if hosts_file is None:
            raise InventoryError([f"{self.root}: no hosts.yml in the inventory directory"])
        data = _read_yaml(hosts_file, self.problems)
        if self.problems:
            raise InventoryError(self.problems)
        if not isinstance(data, dict):
            raise InventoryError([f"{hosts_file}: expected a mapping of groups at the top (e.g. 'all:')"])
        for group_name, body in data.items():
            self._group(hosts_file, str(group_name), body)
        self._expand_children()
        self._merge_vars()
        return self.inv

    def _group(self, file: Path, name: str, body: Any) -> None:
        self.inv.groups.setdefault(name, set())
        self.children.setdefault(name, set())
        if body is None:
            return
        if not isinstance(body, dict):
            self.problems.append(f"{file}:{getattr(name, 'line', 0)}: group {name}: expected a mapping")
            return
        for key in body:
            if key not in ("hosts", "vars", "children"):
                self.problems.append(
                    f"{file}:{key.line}: group {name}: unknown key {key!r} (expected hosts, vars or children)"
                )
        hosts = body.get("hosts") or {}
        if not isinstance(hosts, dict):
            self.problems.append(f"{file}: group {name}: 'hosts' must be a mapping of host names")
            hosts = {}
        for host_name, host_vars in hosts.items():
            host = self.inv.hosts.setdefault(
                str(host_name), Host(name=str(host_name), file=file, line=getattr(host_name, "line", 0))
            )
            self.inv.groups[name].add(host.name)
            if host_vars is None:
                continue
            if not isinstance(host_vars, dict):
                self.problems.append(f"{file}:{host.line}: host {host.name}: expected a mapping of variables")
                continue
            for var, value in host_vars.items():
                host.vars[str(var)] = Variable(value, file, getattr(var, "line", 0))
        group_vars = body.get("vars") or {}
        if isinstance(group_vars, dict):
            self.group_vars.setdefault(name, {}).update(
                {str(k): Variable(v, file, getattr(k, "line", 0)) for k, v in group_vars.items()}
            )
        for child, child_body in (body.get("children") or {}).items():
            self.children[name].add(str(child))
            self._group(file, str(child), child_body)

    def _expand_children(self) -> None:
        def members(group: str, seen: frozenset = frozenset()) -> set[str]:
            if group in seen:
                return set()
            result = set(self.inv.groups.get(group, ()))
            for child in self.children.get(group, ()):
                result |= members(child, seen | {group})
            return result

        for group in list(self.inv.groups):
            self.inv.groups[group] = members(group)
        self.inv.groups["all"] = set(self.inv.hosts)
        for group, hosts in self.inv.groups.items():
            for host in hosts:
                self.inv.hosts[host].groups.add(group)

    def _file_vars(self, directory: str, name: str) -> dict[str, Variable]:
        result: dict[str, Variable] = {}
        for path in _var_files(self.root / directory, name):
            data = _read_yaml(path, self.problems)
            if data is None:
                continue
            if not isinstance(data, dict):
                self.problems.append(f"{path}: expected a mapping of variables")
                continue
            result.update({str(k): Variable(v, path, getattr(k, "line", 0)) for k, v in data.items()})
        return result

    def _merge_vars(self) -> None:
        # Ansible's order: 'all' first, then other groups (alphabetical), inventory host
        # vars, then host_vars/ files. Each later source wins.
        ordered = ["all", *sorted(g for g in self.inv.groups if g != "all")]
        group_layers = {g: {**self.group_vars.get(g, {}), **self._file_vars("group_vars", g)} for g in ordered}
        for host in self.inv.hosts.values():
            merged: dict[str, Variable] = {}
            for group in ordered:
                if host.name in self.inv.groups.get(group, ()):
                    merged.update(group_layers[group])
            merged.update(host.vars)
            merged.update(self._file_vars("host_vars", host.name))
            host.vars = merged


# Variable name -> (checker, description of what is expected)
def _is_str(v: Any) -> bool:
    return isinstance(v, str) and v != ""


def _is_bool(v: Any) -> bool:
    return isinstance(v, bool)


def _is_port(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and 1 <= v <= 65535


def _is_user(v: Any) -> bool:
    return isinstance(v, str) and "@" in v


def _is_token_id(v: Any) -> bool:
    return isinstance(v, str) and v != "" and "!" not in v


VARIABLE_TYPES: dict[str, tuple[Any, str]] = {
    "proxmox_api_host": (_is_str, "a host name or address"),
    "proxmox_api_port": (_is_port, "an integer port from 1 to 65535"),
    "proxmox_api_user": (_is_user, "a PVE user with its realm, e.g. root@pam"),
    "proxmox_api_password": (_is_str, "a string (from vault or the environment)"),
    "proxmox_api_token_id": (
        _is_token_id,
        "the token name only, e.g. provision (the user comes from proxmox_api_user)",
    ),
    "proxmox_api_token_secret": (_is_str, "a string (from vault or the environment)"),
    "proxmox_api_validate_certs": (_is_bool, "true or false"),
    "proxmox_api_ca_file": (_is_str, "a path to a PEM CA bundle"),
    "proxmox_host": (_is_str, "the inventory name of a host in proxmox_hosts"),
}


def _describe(value: Any) -> str:
    return f"{value!r} ({type(value).__name__})"


def validate(inv: Inventory) -> list[str]:
    """Return one line per problem; an empty list means the inventory is usable."""
    problems: list[str] = []
    hosts_file = next((inv.path / n for n in ("hosts.yml", "hosts.yaml") if (inv.path / n).is_file()), inv.path)
    for group in (PROXMOX_HOSTS, GPU_CONTAINERS):
        if group not in inv.groups:
            problems.append(f"{hosts_file}: group {group} is missing (the inventory contract needs it)")
    nodes = set(inv.groups.get(PROXMOX_HOSTS, ()))
    both = nodes & set(inv.groups.get(GPU_CONTAINERS, ()))
    for name in sorted(both):
        h = inv.hosts[name]
        problems.append(f"{h.file}:{h.line}: host {name}: is in both {PROXMOX_HOSTS} and {GPU_CONTAINERS}")

    for host in sorted(inv.hosts.values(), key=lambda h: h.name):
        for var_name, (check, expected) in VARIABLE_TYPES.items():
            var = host.vars.get(var_name)
            if var is None or var.is_unevaluated or var.value is None:
                continue
            if not check(var.value):
                problems.append(
                    f"{var.where}: host {host.name}: {var_name}: expected {expected}, got {_describe(var.value)}"
                )

    vmids: dict[tuple[str, int], str] = {}
    for ct in inv.gpu_containers:
        node = ct.vars.get("proxmox_host")
        if node is None:
            problems.append(f"{ct.file}:{ct.line}: host {ct.name}: proxmox_host: missing (name its PVE node)")
        elif not node.is_unevaluated and isinstance(node.value, str) and node.value not in nodes:
            problems.append(
                f"{node.where}: host {ct.name}: proxmox_host: {node.value!r} is not a host in {PROXMOX_HOSTS}"
            )
        vmid = ct.vars.get("proxmox_vmid")
        if vmid is None:
            problems.append(f"{ct.file}:{ct.line}: host {ct.name}: proxmox_vmid: missing (the container's VMID)")
            continue
        if vmid.is_unevaluated:
            continue
        value = vmid.value
        if not isinstance(value, int) or isinstance(value, bool):
            problems.append(f"{vmid.where}: host {ct.name}: proxmox_vmid: expected an integer, got {_describe(value)}")
            continue
        if not VMID_MIN <= value <= VMID_MAX:
            problems.append(
                f"{vmid.where}: host {ct.name}: proxmox_vmid: {value} is out of range {VMID_MIN}..{VMID_MAX}"
            )
            continue
        if node is not None and isinstance(node.value, str):
            other = vmids.setdefault((node.value, value), ct.name)
            if other != ct.name:
                problems.append(
                    f"{vmid.where}: host {ct.name}: proxmox_vmid: {value} is already used by {other} "
                    f"on node {node.value}"
                )
    return problems


def plain_text_secret_warnings(inv: Inventory) -> list[str]:
    warnings = []
    seen: set[tuple[str, str]] = set()
    for host in inv.hosts.values():
        for name in SECRET_VARIABLES:
            var = host.vars.get(name)
            if var is None or var.is_unevaluated or not var.value or (var.where, name) in seen:
                continue
            seen.add((var.where, name))
            warnings.append(
                f"{var.where}: {name} is in plain text; use ansible-vault or "
                f"\"{{{{ lookup('ansible.builtin.env', 'NAME') }}}}\""
            )
    return warnings


def load(name_or_path: str | Path) -> Inventory:
    """Load and validate an inventory; raise InventoryError listing every problem."""
    from provision.paths import resolve_inventory

    root = resolve_inventory(str(name_or_path))
    parser = _Parser(root)
    inv = parser.parse()
    problems = parser.problems + validate(inv)
    if problems:
        raise InventoryError(problems)
    inv.warnings = plain_text_secret_warnings(inv)
    return inv
