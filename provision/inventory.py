"""Load an inventory with ansible-core's own loader, then check provision's contract on top.

Ansible parses the inventory (INI, YAML, host ranges, `group_vars/` and `host_vars/`, vaulted
files, inventory plugins) and merges each host's variables with its own precedence, so what is
checked here is what `ansible-playbook` will see. The contract (docs/reference.md, "Inventory"):
- group `proxmox_hosts` holds the PVE nodes, group `gpu_containers` the LXC containers;
- each container sets `proxmox_host` (a member of `proxmox_hosts`) and `proxmox_vmid`
  (an integer 100..999999999, unique per node);
- the `proxmox_api_*` variables have fixed types;
- no value the roles write into a systemd unit, a GRUB file or the kernel command line holds a control
  character (plugins/module_utils/rendered_values.py, the rule the roles' preflight applies too);
- ssh host key checking is not turned off (unless the caller passes `--no-host-key-checking`).

Every problem is one line naming the file (and line, where Ansible knows it), the host and the
variable. Values that are Jinja templates cannot be checked before a play renders them.
"""

from __future__ import annotations

import functools
import os
import re
import shlex
import shutil
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import yaml

from provision import arg_specs, secrets
from provision.ansible_config import (
    CONNECTION_PLUGINS,
    LOCAL_CONNECTIONS,
    STRICT_KEYS,
    config_manager,
    lookup,
    plugin_definitions,
    run_setting_problems,
    run_setting_warnings,
    user_config_file,
)
from provision.ansible_values import captured_warnings, from_vault, is_template
from provision.ansible_values import origin as value_origin
from provision.errors import EMPTY_LIMIT, InventoryError, UsageError, one_line
from provision.paths import example_inventory_dir, module_util, roles_dir

PROXMOX_HOSTS = "proxmox_hosts"
GPU_CONTAINERS = "gpu_containers"
SGLANG_GATEWAYS = "sglang_gateways"  # optional: SGLang's gateway in front of the containers (roles/sglang_gateway)
# every host a run manages, in the order the plays take them
MANAGED = f"{PROXMOX_HOSTS}:{GPU_CONTAINERS}:{SGLANG_GATEWAYS}"
VMID_MIN, VMID_MAX = 100, 999_999_999
EXAMPLE_NAME = "example"
# A host name Ansible accepts but no ssh, shell or file path should get: whitespace or control characters.
_BAD_HOST_NAME = re.compile(r"[\s\x00-\x1f\x7f]")
RENDERED_INTO = "it would be written into a systemd unit, a GRUB file or the kernel command line"
# A flag's argument that names no file may be the secret itself, typed where its file was expected
NOT_ECHOED = "the argument is not shown: it names no file, and may be the password itself"
_HOST_KEY_OFF_ARGS = re.compile(
    r"StrictHostKeyChecking[= ]+(no|off|false|accept-new)\b|UserKnownHostsFile[= ]+/dev/null", re.I
)


@dataclass(frozen=True)
class VaultOptions:
    """What ansible-playbook's --vault-password-file and --vault-id would be given."""

    password_files: tuple[Path, ...] = ()
    ids: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        # absolute: ansible-playbook runs in another directory than the one these were given in
        files = tuple(Path(f).absolute() for f in self.password_files)
        ids = tuple(_absolute_vault_id(i) for i in self.ids)
        object.__setattr__(self, "password_files", files)
        object.__setattr__(self, "ids", ids)

    def playbook_args(self) -> list[str]:
        args = [a for f in self.password_files for a in ("--vault-password-file", str(f))]
        return args + [a for i in self.ids for a in ("--vault-id", i)]

    def environment(self) -> dict[str, str]:
        """The same for an ansible command given no arguments: ANSIBLE_VAULT_IDENTITY_LIST, where a password file
        is the vault id `default@FILE`, as ansible's CLI makes of --vault-password-file."""
        ids = [f"default@{f}" for f in self.password_files] + list(self.ids)
        return {"ANSIBLE_VAULT_IDENTITY_LIST": ",".join(ids)} if ids else {}


def _split_vault_id(vault_id: str) -> tuple[str | None, str]:
    """(label, source) as Ansible splits a vault id (at the first `@`), the source's `~` and `$VARS` expanded."""
    from ansible.cli import CLI
    from ansible.utils.path import unfrackpath

    label, source = CLI.split_vault_id(vault_id)
    expanded = unfrackpath(source, follow=False) if source not in ("prompt", "prompt_ask_vault_pass") else source
    return label, expanded


def _absolute_vault_id(vault_id: str) -> str:
    """`label@source`: a source that is a file here becomes its absolute path (`prompt` stays)."""
    label, source = _split_vault_id(vault_id)
    if not Path(source).exists():
        return vault_id
    return f"{label}@{source}" if label is not None else source


@dataclass
class Host:
    name: str
    groups: set[str] = field(default_factory=set)
    vars: dict[str, Any] = field(default_factory=dict)
    origin: str = ""  # where the host is defined (file:line), else the inventory source
    source: str = ""  # the inventory source
    extra: frozenset[str] = frozenset()  # the variables --extra-vars sets (above every inventory value)
    origins: dict[str, str] = field(default_factory=dict)  # where() of values rendered from a template (rendered_roles)

    def value(self, name: str, default: Any = None) -> Any:
        return self.vars.get(name, default)

    def where(self, name: str | None = None) -> str:
        """`file:line` of a variable (or of the host itself), as Ansible recorded it; --extra-vars for one it sets."""
        if name is None:
            return self.origin
        if name in self.extra:
            return "--extra-vars"
        if name in self.origins:
            return self.origins[name]
        # a value Ansible keeps no origin for (true/false, None): only the inventory is known
        return value_origin(self.vars.get(name)) or self.source


def limit_parts(limit: str) -> list[str]:
    """The host patterns of a limit, as Ansible splits it (its `@file` parts read, a line a pattern), each without its
    `&` or `!`: each must match a host, or a typo silently narrows (or, excluded, widens) the run."""
    from ansible.inventory.manager import split_host_pattern

    parts: list[str] = []
    for part in split_host_pattern(limit):
        if part.startswith("@"):
            try:
                lines = Path(part[1:]).read_text().splitlines()
            except OSError as exc:
                raise UsageError(f"--limit {part}: cannot read the limit file: {exc.strerror}") from None
            parts += limit_parts(",".join(line.strip() for line in lines if line.strip())) if any(lines) else []
        elif part.lstrip("&!"):
            parts.append(part.lstrip("&!"))
    return parts


@dataclass
class Inventory:
    path: Path
    hosts: dict[str, Host] = field(default_factory=dict)
    groups: dict[str, set[str]] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)
    vault: VaultOptions = field(default_factory=VaultOptions)
    host_key_checking: bool = True
    manager: Any = field(default=None, repr=False)  # ansible's InventoryManager, for host patterns
    loader: Any = field(default=None, repr=False)  # ansible's DataLoader (with the vault secrets), for templating
    given: str = ""  # the name or path the user gave (--inventory)

    def __str__(self) -> str:
        return self.given or str(self.path)

    def match(self, limit: str | None, pattern: str = MANAGED) -> list[str]:
        """The hosts a play on `pattern` reaches under `--limit`, by Ansible's own pattern rules."""
        try:
            with captured_warnings():  # "Could not match supplied host pattern": scope() says it once
                self.manager.subset(limit)
                return sorted(str(h.name) for h in self.manager.get_hosts(pattern=pattern))
        except Exception as exc:  # AnsibleError for a malformed pattern
            raise UsageError(f"--limit {limit}: {one_line(exc)}") from None
        finally:
            self.manager.subset(None)

    def scope(self, limit: str | None) -> list[str]:
        """`match`, refusing a limit that is blank (Ansible would run on every host), or any part of which matches no
        managed host (Ansible would only warn, and run on the rest)."""
        if limit is not None and not limit.strip():
            raise UsageError(EMPTY_LIMIT)
        parts = limit_parts(limit) if limit else []
        hosts = self.match(limit)
        for part in parts:
            if not self.match(part):
                where = f"{PROXMOX_HOSTS}, {GPU_CONTAINERS} or {SGLANG_GATEWAYS} of {self.path}"
                what = f"--limit {limit}: {part!r}" if part != limit else f"--limit {limit}"
                raise UsageError(f"{what} matches no host in {where}: nothing runs until every part of it names a host")
        return hosts

    def group(self, name: str) -> list[Host]:
        return [self.hosts[h] for h in sorted(self.groups.get(name, ()))]

    @property
    def proxmox_hosts(self) -> list[Host]:
        return self.group(PROXMOX_HOSTS)

    @property
    def gpu_containers(self) -> list[Host]:
        return self.group(GPU_CONTAINERS)

    @property
    def gateways(self) -> list[Host]:
        return self.group(SGLANG_GATEWAYS)


def resolve(name_or_path: str | Path) -> Path:
    """`prod` means `./inventory/prod`; `example` the packaged example; a path is used as given.

    No silent fallback: a name that is not found is an error listing where it was looked for."""
    text = str(name_or_path)
    given = Path(text)
    if given.exists() or "/" in text or text.startswith("."):
        if not given.exists():
            raise UsageError(f"{text}: inventory not found")
        return given.resolve()
    if text == EXAMPLE_NAME:
        return example_inventory_dir()
    local = Path.cwd() / "inventory" / text
    if local.is_dir():
        return local.resolve()
    raise UsageError(
        f"inventory {text!r} not found: looked for ./{text} and ./inventory/{text}/ in {Path.cwd()}; "
        f"pass a path, or --inventory {EXAMPLE_NAME} for the packaged example"
    )


GIVE_THE_VAULT_PASSWORD = (
    "give the password it was encrypted with: --vault-password-file, --vault-id, or vault_password_file in ansible.cfg"
)


def _chain(exc: BaseException | None) -> Iterator[BaseException]:
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        yield exc
        exc = getattr(exc, "orig_exc", None) or exc.__cause__ or exc.__context__


def _error_line(source: Path, exc: BaseException) -> str:
    message = one_line(getattr(exc, "message", None) or str(exc) or type(exc).__name__)
    where = next(filter(None, (value_origin(getattr(e, "obj", None)) for e in _chain(exc))), str(source))
    if "no vault secrets" in message or "Decryption failed" in message:
        return f"{where}: cannot decrypt: {message} ({GIVE_THE_VAULT_PASSWORD})"
    return f"{where}: {message}"


def _failure_source(exc: BaseException) -> str:
    """The file a plugin failed on: its origin path, or the source named in the plugin's description."""
    origin = getattr(exc, "obj", None)
    found = re.search(r"with source '(.+)'>", str(getattr(origin, "description", "") or ""))
    return found.group(1) if found else (value_origin(origin) or "").rsplit(":", 1)[0]


def _rank(msg: str, exc: BaseException) -> int:
    """Which plugin's failure explains a file: for a .yml/.yaml/.json file a plugin config (`plugin:`)
    or the yaml plugin, for any other file the ini plugin. Lower is better."""
    text = getattr(exc, "message", "") or str(exc)
    yamlish = Path(_failure_source(exc)).suffix in (".yml", ".yaml", ".json")
    if "'auto'" in msg:
        return 5 if "no root 'plugin' key" in text else 0
    if "'yaml'" in msg:
        return 1 if yamlish else 2
    if "'ini'" in msg:
        return 3 if yamlish else 0
    return 4


def _parse_failure(source: Path, caught: list[tuple[str, BaseException | None]]) -> list[str]:
    """One line per file no plugin could parse (the failure of the plugin that owns the file's kind),
    and one per other warning Ansible gave while parsing (e.g. a key it skipped)."""
    failures = [(msg, exc) for msg, exc in caught if exc is not None]
    by_file: dict[str, list[tuple[str, BaseException]]] = {}
    for msg, exc in failures:
        by_file.setdefault(_failure_source(exc), []).append((msg, exc))
    if len(by_file) > 1:
        by_file.pop("", None)  # a failure that names no file, beside ones that do
    lines = [_error_line(source, min(items, key=lambda i: _rank(*i))[1]) for items in by_file.values()]
    if lines:
        return lines
    quiet = ("Unable to parse", "No inventory was parsed", "No module named")
    others = [m for m, _ in caught if not m.startswith(quiet)] or [m for m, _ in caught][:1]
    return list(dict.fromkeys(f"{source}: {one_line(m)}" for m in others))


def _check_vault_sources(ids: list[str], files: list[str]) -> None:
    """Every vault password source can be read without a terminal; a source that names no file is not echoed."""
    prompts = [i for i in ids if _split_vault_id(i)[1] in ("prompt", "prompt_ask_vault_pass")]
    if prompts:
        raise UsageError(
            f"--vault-id {prompts[0]}: provision cannot prompt for a vault password (its runs have no terminal); "
            "give a password file or script instead"
        )
    for f in files:
        if not os.access(f, os.R_OK) or not Path(f).is_file():
            raise UsageError(f"--vault-password-file: no such readable file ({NOT_ECHOED})")
    for vault_id in ids:
        label, source = _split_vault_id(vault_id)
        if not Path(source).exists():
            raise UsageError(f"--vault-id {label or 'default'}@…: no such password file or script ({NOT_ECHOED})")


def _vault_secrets(loader: Any, vault: VaultOptions) -> None:
    from ansible import constants as C
    from ansible.cli import CLI

    ids = list(C.DEFAULT_VAULT_IDENTITY_LIST) + list(vault.ids)
    files = [str(f) for f in vault.password_files]
    _check_vault_sources(ids, files)
    try:
        with captured_warnings():  # each bad source is also raised: say it once
            found = CLI.setup_vault_secrets(
                loader, vault_ids=ids, vault_password_files=files, auto_prompt=False, initialize_context=False
            )
    except Exception as exc:
        labels = " ".join(_split_vault_id(i)[0] or "default" for i in ids)
        raise UsageError(f"--vault-id {labels}: {one_line(getattr(exc, 'message', None) or exc)}") from None
    loader.set_vault_secrets(found)
    try:  # ansible-core 2.19+: inline !vault values decrypt through this process-wide context
        from ansible.parsing.vault import VaultSecretsContext
    except ImportError:
        return
    VaultSecretsContext._current = VaultSecretsContext(found)  # set, not initialize(): load() may run twice


def absolute_extra_vars(values: list[str] | tuple[str, ...]) -> tuple[str, ...]:
    """--extra-vars as given, an `@FILE` made absolute: ansible-playbook reads it from the working directory, and the
    run's own is another."""
    return tuple(f"@{Path(v.strip()[1:]).resolve()}" if v.strip().startswith("@") else v for v in values)


def parse_extra_vars(loader, values: tuple[str, ...]) -> dict[str, Any]:
    """--extra-vars by ansible-playbook's rules (ansible.utils.vars.load_extra_vars): `@FILE` is YAML or JSON read by
    Ansible's loader (a vaulted file decrypted with the run's vault secrets), `{...}` or `[...]` is YAML, anything
    else key=value pairs (parse_kv); later ones win, and each must be a mapping. load_extra_vars itself keeps the
    first result it makes for the rest of the process, and provision loads inventories more than once in one."""
    from ansible.parsing.splitter import parse_kv
    from ansible.utils.vars import combine_vars

    found: dict[str, Any] = {}
    for value in values:
        try:
            if value.startswith("@"):
                data = loader.load_from_file(value[1:], trusted_as_template=True)
            elif value[:1] in ("/", "."):
                raise UsageError(f"--extra-vars {value}: a file is given as @{value}")
            elif value[:1] in ("[", "{"):
                data = loader.load(value)
            else:
                data = parse_kv(value)
        except UsageError:
            raise
        except Exception as exc:  # AnsibleError and its subclasses: a file that cannot be read or parsed
            raise UsageError(f"--extra-vars {value}: {one_line(str(exc))}") from None
        if not isinstance(data, dict):
            raise UsageError(f"--extra-vars {value}: not a mapping of variables")
        found = combine_vars(found, data)
    return found


def parse(source: Path, vault: VaultOptions = VaultOptions(), extra_vars: tuple[str, ...] = ()) -> Inventory:
    """Parse with ansible-core's InventoryManager and VariableManager; raise one line per failure."""
    from ansible import context
    from ansible.inventory.manager import InventoryManager
    from ansible.module_utils.common.collections import ImmutableDict
    from ansible.parsing.dataloader import DataLoader
    from ansible.vars.manager import VariableManager

    if not context.CLIARGS:
        context.CLIARGS = ImmutableDict()
    plugin_definitions()  # the collection loader: inventory plugins by FQCN (community.proxmox.proxmox)
    loader = DataLoader()
    try:
        _vault_secrets(loader, vault)
        with captured_warnings() as caught:
            manager = InventoryManager(loader=loader, sources=[str(source)])
        problems = _parse_failure(source, caught) if caught or not manager.hosts else []
        if problems and not manager.hosts:
            raise InventoryError(problems)
        variables = VariableManager(loader=loader, inventory=manager)
        given = parse_extra_vars(loader, extra_vars)
        extra = frozenset(given)
        inv = Inventory(path=source, vault=vault, manager=manager, loader=loader)
        for host in manager.get_hosts():
            hostvars = {**variables.get_vars(host=host, include_hostvars=False), **given}  # above every other value
            groups = {g.name for g in host.get_groups()}
            origin = value_origin(host.name) or str(source)
            inv.hosts[host.name] = Host(str(host.name), groups, dict(hostvars), origin, str(source), extra)
        for name, group in manager.groups.items():
            inv.groups[name] = {h.name for h in group.get_hosts()}
    except (InventoryError, UsageError):
        raise
    except RecursionError:
        raise InventoryError([f"{source}: the inventory nests groups or values too deeply to load"]) from None
    except Exception as exc:  # ansible raises AnsibleError and its subclasses, plugins anything
        raise InventoryError([_error_line(source, exc)]) from None
    if problems:
        raise InventoryError(problems)
    return inv


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


def _driver_rule(name: str):
    """A check from the node driver's rules (plugins/module_utils/nvidia_driver.py), the same the role applies."""
    return lambda v: getattr(module_util("nvidia_driver"), name)(v) is None


VARIABLE_TYPES.update(
    {
        "nvidia_driver_version": (
            _driver_rule("pin_problem"),
            "an NVIDIA driver version such as 580.95.05, 580.65.06 or newer (the CUDA 13 floor SGLang 0.5.23 needs), "
            "or unset (the driver not managed)",
        ),
        "nvidia_driver_installer_sha256": (_driver_rule("sha256_problem"), "the installer's sha256, 64 hex digits"),
        "nvidia_driver_installer": (_driver_rule("source_problem"), "an http(s) URL or an absolute path on the node"),
    }
)


def _kind(value: Any) -> type:
    """The YAML type a value was written as, without Ansible's tagged types (`_AnsibleTaggedInt` is an int)."""
    return next((t for t in (bool, int, float, str, list, dict) if isinstance(value, t)), type(value))


def _describe(value: Any) -> str:
    """`'110' (str)`: the value as the user wrote it, without Ansible's tagged types."""
    kind = _kind(value)
    plain = kind(value) if kind in (int, float, str, list, dict) else value
    return f"{plain!r} ({kind.__name__})"


# variables a host has before its play that the play fills in: the facts (empty here)
_PLAY_ONLY = frozenset({"ansible_facts"})
# the lookups a template may call and still be rendered at check: they read the controller's environment, as the run
# will, and change nothing
_CHECK_LOOKUPS = frozenset({"env", "ansible.builtin.env"})


@functools.cache
def template_reads(text: str) -> tuple[frozenset[str], bool] | None:
    """(the variables a template reads, whether it calls only lookups that read the environment); None where Jinja
    cannot parse it."""
    import jinja2
    from jinja2 import meta, nodes

    try:  # jinja's own filters and tests only: the compile behind find_undeclared_variables refuses Ansible's
        environment = jinja2.Environment()
        environment.filters = _AnyName(environment.filters)
        environment.tests = _AnyName(environment.tests)
        tree = environment.parse(text)
        names = frozenset(meta.find_undeclared_variables(tree)) - {"lookup", "query", "q"}
    except Exception:  # jinja's TemplateError, or whatever a template Ansible would render differently raises here
        return None
    calls = [c for c in tree.find_all(nodes.Call) if isinstance(c.node, nodes.Name)]
    lookups = [c for c in calls if c.node.name in ("lookup", "query", "q")]
    quiet = all(c.args and isinstance(c.args[0], nodes.Const) and c.args[0].value in _CHECK_LOOKUPS for c in lookups)
    return names, quiet


class _AnyName(dict):
    """A filter or test table that holds every name: which variables a template reads does not depend on them."""

    def __contains__(self, name: object) -> bool:
        return True

    def get(self, name: str, default: Any = None) -> Any:
        return super().get(name) or _any_value


def _any_value(*args: Any, **kwargs: Any) -> None:
    return None


def _renders_from_inventory(value: Any, variables: dict) -> bool:
    """A template the inventory alone renders as the run will: every variable it reads is the host's, and its only
    lookups read the environment. One with a `default` of a fact would render its fallback here, not the run's."""
    reads = template_reads(value)
    return reads is not None and reads[1] and reads[0] <= set(variables) - _PLAY_ONLY


def rendered(inv: Inventory, host: Host, name: str) -> Any:
    """A host's variable as Ansible renders it for that host, from the inventory alone (a template rendered with
    the host's inventory variables); UsageError naming the file and variable where that needs more (facts)."""
    value = host.vars.get(name)
    if not is_template(value):
        return value
    from ansible.template import Templar

    try:
        return Templar(loader=inv.loader, variables=host.vars).template(value)
    except Exception as exc:
        reason = one_line(exc)
        raise UsageError(
            f"{host.where(name)}: host {host.name}: {name}: cannot be rendered before the run: {reason}"
        ) from None


def rendered_roles(inv: Inventory, host: Host) -> Host:
    """The host with each role variable that is a template rendered as Ansible will render it, where the inventory
    alone renders it (_renders_from_inventory); one that needs more (facts, another host's variables, a lookup of
    anything but the environment) stays a template, for the roles to check once rendered. Vaulted values stay as
    they are."""
    from ansible.template import Templar

    templar = Templar(loader=inv.loader, variables=host.vars)
    values, origins = dict(host.vars), {}
    for name in sorted(arg_specs.declared() & set(host.vars)):
        value = host.vars[name]
        if not is_template(value) or from_vault(value) or not _renders_from_inventory(value, host.vars):
            continue
        try:
            with captured_warnings():  # a lookup that cannot render here warns; the run says it where it matters
                values[name] = templar.template(value)
        except Exception:  # facts or hostvars it needs exist only in a play
            continue
        origins[name] = host.where(name)
    return replace(host, vars=values, origins=origins)


def _check_groups(inv: Inventory) -> list[str]:
    if not inv.hosts:
        return [f"{inv.path}: no hosts: Ansible read it as an empty inventory"]
    problems = [
        f"{inv.path}: group {group} is missing (the inventory contract needs it)"
        for group in (PROXMOX_HOSTS, GPU_CONTAINERS)
        if group not in inv.groups
    ]
    both = set(inv.groups.get(PROXMOX_HOSTS, ())) & set(inv.groups.get(GPU_CONTAINERS, ()))
    problems += [f"{inv.path}: host {name}: is in both {PROXMOX_HOSTS} and {GPU_CONTAINERS}" for name in sorted(both)]
    for group in (PROXMOX_HOSTS, GPU_CONTAINERS):  # a gateway is a host of its own: a CT without GPUs, or any Debian
        shared = set(inv.groups.get(SGLANG_GATEWAYS, ())) & set(inv.groups.get(group, ()))
        problems += [f"{inv.path}: host {name}: is in both {group} and {SGLANG_GATEWAYS}" for name in sorted(shared)]
    problems += [
        f"{inv.path}: host {name!r}: a host name may not contain whitespace or control characters"
        for name in sorted(inv.hosts)
        if _BAD_HOST_NAME.search(name)
    ]
    return problems


def _check_types(host: Host) -> list[tuple[str, str, str]]:
    """(where, host, problem) for each variable of the wrong type, after Ansible's precedence."""
    found = []
    for name, (check, expected) in VARIABLE_TYPES.items():
        value = host.vars.get(name)
        if value is None or is_template(value) or from_vault(value) or check(value):
            continue
        got = f"a value of type {_kind(value).__name__}" if name in secrets.declared_secrets() else _describe(value)
        found.append((host.where(name), host.name, f"{name}: expected {expected}, got {got}"))
    return found


def _per_source(found: list[tuple[str, str, str]]) -> list[str]:
    """One line per (file:line, problem), naming every host that inherits it."""
    hosts: dict[tuple[str, str], list[str]] = {}
    for where, host, problem in found:
        hosts.setdefault((where, problem), []).append(host)
    return [
        f"{where}: host{'s' if len(set(names)) > 1 else ''} {', '.join(sorted(set(names)))}: {problem}"
        for (where, problem), names in hosts.items()
    ]


def _check_container(inv: Inventory, ct: Host, vmids: dict[tuple[str, int], str]) -> list[str]:
    nodes = inv.groups.get(PROXMOX_HOSTS, set())
    node = ct.vars.get("proxmox_host")
    problems = []
    if node is None:
        problems.append(f"{ct.where()}: host {ct.name}: proxmox_host: missing (name its PVE node)")
    elif isinstance(node, str) and not is_template(node) and node not in nodes:
        problems.append(
            f"{ct.where('proxmox_host')}: host {ct.name}: proxmox_host: {node!r} is not a host in {PROXMOX_HOSTS}"
        )
    vmid = ct.vars.get("proxmox_vmid")
    where = f"{ct.where('proxmox_vmid')}: host {ct.name}: proxmox_vmid"
    if vmid is None:
        return [*problems, f"{ct.where()}: host {ct.name}: proxmox_vmid: missing (the container's VMID)"]
    if is_template(vmid):
        return problems
    if not isinstance(vmid, int) or isinstance(vmid, bool):
        return [*problems, f"{where}: expected an integer, got {_describe(vmid)}"]
    if not VMID_MIN <= vmid <= VMID_MAX:
        return [*problems, f"{where}: {vmid} is out of range {VMID_MIN}..{VMID_MAX}"]
    if isinstance(node, str):
        other = vmids.setdefault((node, int(vmid)), ct.name)
        if other != ct.name:
            problems.append(f"{where}: {vmid} is already used by {other} on node {node}")
    return problems + _check_ct_spec(ct)


def _check_ct_spec(ct: Host) -> list[str]:
    """The container's proxmox_ct_spec, by the rule the proxmox_lxc_ct module applies (module_utils/lxc_spec.py)."""
    if "proxmox_ct_spec" not in ct.vars:
        return []
    found = module_util("lxc_spec").problems(ct.vars["proxmox_ct_spec"])
    return [f"{ct.where('proxmox_ct_spec')}: host {ct.name}: {problem}" for problem in found]


def _setting_source(host: Host, origin: str) -> str:
    """Where a setting came from, as a place: the inventory file for `var: NAME`, else Ansible's origin."""
    if origin.startswith("var: "):
        return host.where(origin.removeprefix("var: "))
    return origin.removeprefix("env: ").strip() or origin


def _host_key_findings(manager: Any, host: Host, checking: bool, said: str) -> list[tuple[str, str, str]]:
    """(where, host, problem) for each way this host's effective settings trust unknown keys."""
    from ansible.module_utils.parsing.convert_bool import boolean

    found = []
    for plugin in CONNECTION_PLUGINS:
        value, origin = lookup(manager, ("host_key_checking", plugin), host.vars)
        if origin not in ("default", said) and not boolean(value, strict=False):
            found.append((_setting_source(host, origin), host.name, f"{origin[5:]} turns host key checking off"))
    value, origin = lookup(manager, ("host_key_auto_add", "paramiko_ssh"), host.vars)
    if boolean(value, strict=False):
        found.append((_setting_source(host, origin), host.name, "paramiko's host_key_auto_add trusts unknown keys"))
    for name in ("ssh_args", "ssh_common_args", "ssh_extra_args"):
        value, origin = lookup(manager, (name, "ssh"), host.vars)
        if _HOST_KEY_OFF_ARGS.search(str(value or "")):
            found.append((_setting_source(host, origin), host.name, f"{name} turns ssh host key checking off"))
    value, origin = lookup(manager, ("ssh_args", "ssh"), host.vars)
    if not checking and origin.startswith("var: ") and "UserKnownHostsFile=/dev/null" not in str(value):
        problem = (
            f"{origin[5:]} replaces the ssh_args that keep unverified keys out of known_hosts under "
            "--no-host-key-checking; add -o UserKnownHostsFile=/dev/null to it"
        )
        found.append((_setting_source(host, origin), host.name, problem))
    return found


SSH_CONNECTIONS = ("ssh", "ansible.builtin.ssh", "smart")


def _ssh_arguments(manager: Any, host: Host, ssh_args_origin: str) -> list[str]:
    """The options Ansible's ssh connection gives ssh for this host, in its order."""
    args = [] if ssh_args_origin.startswith("var: ") else shlex.split(STRICT_KEYS)  # provision's word goes first
    for name in ("ssh_args", "ssh_common_args", "ssh_extra_args"):
        value = lookup(manager, (name, "ssh"), host.vars)[0]
        args += [] if is_template(value) else shlex.split(str(value or ""))
    return args


def _ssh_effective(manager: Any, host: Host) -> tuple[dict[str, str], str]:
    """ssh's own view of the options it would use for this host (`ssh -G`, its config files included), given the
    arguments Ansible passes it, and where the first of those come from ({} where ssh cannot tell: no ssh here, a
    templated address, another connection plugin)."""
    ssh = shutil.which("ssh")
    target = host.vars.get("ansible_host") or host.name
    if not ssh or host.vars.get("ansible_connection", "ssh") not in SSH_CONNECTIONS or is_template(target):
        return {}, ""
    origin = lookup(manager, ("ssh_args", "ssh"), host.vars)[1]
    port, user = host.vars.get("ansible_port"), host.vars.get("ansible_user")
    argv = [
        ssh,
        "-G",
        *_ssh_arguments(manager, host, origin),
        *(["-p", str(port)] if port else []),
        *(["-l", str(user)] if user else []),
        str(target),
    ]
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=10, stdin=subprocess.DEVNULL)
    except (OSError, subprocess.TimeoutExpired):
        return {}, ""
    options = dict(line.split(" ", 1) for line in proc.stdout.splitlines() if " " in line)
    where = _setting_source(host, origin) if origin.startswith("var: ") else "ssh configuration"
    return (options if proc.returncode == 0 else {}), where


def _ssh_config_findings(manager: Any, host: Host) -> list[tuple[str, str, str]]:
    """(where, host, problem) where ssh's effective options (its config files included: ~/.ssh/config,
    /etc/ssh/ssh_config.d/, a -F file) would trust an unknown host key, or could verify none."""
    options, where = _ssh_effective(manager, host)
    known_hosts = f"{options.get('userknownhostsfile', '')} {options.get('globalknownhostsfile', '')}".split()
    found = []
    strict = options.get("stricthostkeychecking", "true")
    if strict in ("false", "accept-new"):  # "ask" asks nobody in a run: an unknown key is refused
        found.append(
            (
                where,
                host.name,
                f"ssh's configuration says StrictHostKeyChecking {strict} (ssh -G), and the "
                "inventory's ssh_args replace the ones where provision says StrictHostKeyChecking=yes (add "
                "-o StrictHostKeyChecking=yes to them)",
            )
        )
    if known_hosts and set(known_hosts) <= {"/dev/null", "none"}:
        found.append(
            (
                where,
                host.name,
                "ssh's configuration keeps no known_hosts file (ssh -G: UserKnownHostsFile "
                "and GlobalKnownHostsFile /dev/null or none): no host key can be verified",
            )
        )
    return found


def host_key_checking_problems(inv: Inventory, checking: bool = True) -> list[str]:
    """Where the user's ansible.cfg, environment or inventory would trust an unknown ssh host key.
    With checking on (the default) every such setting is a problem; with --no-host-key-checking only
    an inventory ssh_args that would let ssh record the unverified keys."""
    from ansible import constants as C

    manager = config_manager(user_config_file())
    problems = []
    value, origin = C.config.get_config_value_and_origin("HOST_KEY_CHECKING")
    if checking and not value:
        problems.append(f"{origin}: host_key_checking is off")
    hosts = sorted(inv.hosts.values(), key=lambda h: h.name)
    found = [f for host in hosts for f in _host_key_findings(manager, host, checking, origin)]
    if not checking:
        return _per_source([f for f in found if "--no-host-key-checking" in f[2]])
    said = {f[1] for f in found}  # what the settings' text already shows is not asked of ssh again
    found += [f for host in hosts if host.name not in said for f in _ssh_config_findings(manager, host)]
    hint = "; provision keeps it on: remove that setting, or pass --no-host-key-checking to accept any host key"
    return [p + hint for p in problems + _per_source(found)]


@functools.cache
def rendered_variables() -> tuple[str, ...]:
    """The variables the roles write into a systemd unit, its environment file, a GRUB file or the kernel command
    line: the keys of each role's `_<role>_rendered_values` (roles/*/vars/main.yml), the lists their own preflight
    checks on the host."""
    names: set[str] = set()
    for path in sorted(roles_dir().glob("*/vars/main.yml")):
        for key, value in (yaml.safe_load(path.read_text()) or {}).items():
            if key.endswith("_rendered_values") and isinstance(value, dict):
                names |= set(value)
    return tuple(sorted(names))


def _check_rendered(host: Host) -> list[tuple[str, str, str]]:
    """(where, host, problem) for each control character in a value the roles would render (templates are
    checked by the roles once rendered)."""
    rule = module_util("rendered_values")
    found = []
    for name in rendered_variables():
        value = host.vars.get(name)
        if value is None or is_template(value):
            continue
        for problem in rule.value_problems({name: value}):
            found.append((host.where(name), host.name, f"{problem}: {RENDERED_INTO}"))
    return found


def _check_model_source(host: Host) -> list[tuple[str, str, str]]:
    """(where, host, problem) for each problem of `sglang_model_source` (module_utils/model_source.py, the rule
    the sglang role's preflight and its weights module apply too); a templated value is checked by the role."""
    value = host.vars.get("sglang_model_source")
    if value is None or is_template(value) or from_vault(value):
        return []
    problems = module_util("model_source").source_problems(value)
    return [(host.where("sglang_model_source"), host.name, f"sglang_model_source: {p}") for p in problems]


def _check_driver_pin(host: Host) -> list[tuple[str, str, str]]:
    """(where, host, problem) for a node whose driver is pinned without the installer's sha256: the driver phase
    runs only an installer whose sha256 it knows, and it runs after the kernel phase, which may reboot."""
    version = host.vars.get("nvidia_driver_version")
    if PROXMOX_HOSTS not in host.groups or is_template(version) or not module_util("nvidia_driver").pinned(version):
        return []
    if host.vars.get("nvidia_driver_installer_sha256"):
        return []
    return [
        (
            host.where("nvidia_driver_version"),
            host.name,
            f"nvidia_driver_version is pinned ({version}) but "
            "nvidia_driver_installer_sha256 is not set: the driver phase runs only an installer whose sha256 it "
            "knows; set it, or unset the pin to keep the node's driver",
        )
    ]


# variables with rules of their own here, stricter than their argument spec's type: checked once, by those
CHECKED_BY_OWN_RULES = frozenset({*VARIABLE_TYPES, "proxmox_vmid", "proxmox_ct_spec", "sglang_model_source"})


def _check_specs(host: Host) -> list[tuple[str, str, str]]:
    """(where, host, problem) against the argument specs of the roles that run on the host (provision/arg_specs.py)."""
    found = arg_specs.host_problems(host.groups, host.vars, CHECKED_BY_OWN_RULES)
    found += [(v, p) for v, p in arg_specs.bound_problems(host.vars) if v not in CHECKED_BY_OWN_RULES]
    return [(host.where(var) if var in host.vars else host.where(), host.name, problem) for var, problem in found]


def require(inv: Inventory, hosts: list[str], phases: list[str] | tuple[str, ...], reboot: str | None = None) -> None:
    """InventoryError naming every variable a run of these phases on these hosts would need and does not have."""
    problems = required_problems(inv, hosts, list(phases), reboot)
    if problems:
        raise InventoryError(problems)


def required_problems(inv: Inventory, hosts: list[str], phases: list[str], reboot: str | None = None) -> list[str]:
    """One line per variable the roles of these phases (and the facts step) require of these hosts that the inventory
    leaves unset or empty, and per host whose phases talk to the PVE API without its address or a secret for it:
    said before a run that would need them, and by `inventory check` for every phase. `reboot` is the run's
    --reboot, where it gives one."""
    playbooks = ("facts", *phases)
    found = [
        (host.where(var) if var in host.vars else host.where(), host.name, problem)
        for host in (inv.hosts[name] for name in sorted(hosts))
        for var, problem in arg_specs.missing(host.groups, host.vars, playbooks)
    ]
    found += [p for name in sorted(hosts) for p in _check_api(inv.hosts[name], phases, reboot)]
    return _per_source(found)


def _node_reboots(host: Host, phases: list[str], reboot: str | None) -> bool:
    """Whether the kernel or driver phase may reboot this node in this run (--reboot sets both phases' setting)."""
    kernel = reboot or host.vars.get("kernel_cmdline_reboot", "auto")
    driver = host.vars.get("nvidia_driver_reboot")  # the driver phase's own, which follows the kernel phase's
    driver = kernel if reboot or driver is None or is_template(driver) else driver
    return ("kernel" in phases and kernel != "never") or ("driver" in phases and driver != "never")


def _api_use(host: Host, phases: list[str], reboot: str | None) -> tuple[str, bool] | None:
    """(what talks to the PVE API for this host in these phases, whether only a password will do), or None. PVE lets
    only root@pam's password change devN entries and bind mounts, never an API token."""
    v = host.vars
    if GPU_CONTAINERS in host.groups:
        source = v.get("sglang_model_source")
        if "gpu" in phases and v.get("gpu_passthrough_api_backend", "https") == "https":
            return "the gpu phase writes its devN entries through the PVE API", True
        if "sglang" in phases and isinstance(source, dict) and source.get("type") == "node_dir":
            return "the sglang phase bind-mounts its model directory through the PVE API", True
        return None
    if PROXMOX_HOSTS in host.groups and _node_reboots(host, phases, reboot):
        return "before a reboot, the kernel and driver phases read its guests, quorum and HA through the PVE API", False
    return None


def _check_api(host: Host, phases: list[str], reboot: str | None) -> list[tuple[str, str, str]]:
    use = _api_use(host, phases, reboot)
    if use is None:
        return []
    what, password_only = use

    def given(name: str) -> bool:  # a vaulted value is given, and is not decrypted here to say so
        value = host.vars.get(name)
        return from_vault(value) or is_template(value) or bool(value)

    if not given("proxmox_api_host"):
        return [(host.where(), host.name, f"proxmox_api_host: missing or empty: {what}")]
    token = given("proxmox_api_token_id") and given("proxmox_api_token_secret")
    if given("proxmox_api_password") or (token and not password_only):
        return []
    secret = (
        "proxmox_api_password (root@pam's; PVE refuses API tokens there)"
        if password_only
        else ("proxmox_api_password, or proxmox_api_token_id with proxmox_api_token_secret")
    )
    return [(host.where(), host.name, f"{secret}: missing or empty: {what}")]


def _check_unknown(host: Host) -> list[tuple[str, str, str]]:
    """(where, host, problem) for each variable with a role's prefix that no role declares, and no template of the
    host's reads (such as `sglang_models_root` in `sglang_model_path: "{{ sglang_models_root }}/m"`). A
    removed one is warned about with what replaced it."""
    read = {n for v in host.vars.values() if is_template(v) for n in (template_reads(v) or (frozenset(),))[0]}
    unknown = arg_specs.host_unknown(host.groups, host.vars)
    return [
        (host.where(var), host.name, f"{var}: {why}")
        for var, why in unknown
        if var not in REMOVED_VARIABLES and var not in read
    ]


# Items a variable's value may hold, counted as Ansible will expand it (each alias again): more is refused before
# anything that renders or walks it (a unit file, a kernel line, a JSON record) takes minutes or memory over it
MAX_ITEMS = 10_000


def _item_count_over(value: Any, limit: int = MAX_ITEMS) -> bool:
    stack, count = [value], 0
    while stack:
        item = stack.pop()
        count += 1
        if count > limit:
            return True
        if isinstance(item, dict):
            stack.extend(item.values())
        elif isinstance(item, list | tuple):
            stack.extend(item)
    return False


def _check_vault(host: Host) -> list[tuple[str, str, str]]:
    """(where, host, problem) for each variable holding an inline `!vault` value that no vault password given
    decrypts: named here, before any check or task reads it."""
    from ansible.errors import AnsibleError

    found = []
    for name, value in sorted(host.vars.items()):
        for leaf in secrets.leaves(value):
            if type(leaf).__name__ != "EncryptedString":
                continue
            try:
                str(leaf)  # decrypts, with the vault secrets the inventory was loaded with
            except AnsibleError as exc:
                reason = one_line(str(exc)).rstrip(".")
                found.append(
                    (
                        host.where(name),
                        host.name,
                        f"{name}: cannot decrypt its !vault value: {reason} ({GIVE_THE_VAULT_PASSWORD})",
                    )
                )
                break
    return found


def _check_size(host: Host) -> list[tuple[str, str, str]]:
    return [
        (
            host.where(name),
            host.name,
            f"{name}: its value holds more than {MAX_ITEMS} items once its YAML aliases "
            "are expanded: nothing provision runs needs that many",
        )
        for name, value in sorted(host.vars.items())
        # a value read from the inventory's files (Ansible's own, such as `groups`, grow with the fleet)
        if isinstance(value, dict | list | tuple) and value_origin(value) and _item_count_over(value)
    ]


def _check_connection(host: Host) -> list[tuple[str, str, str]]:
    """A managed host must be reached, not run here: `local` would run a node's or container's tasks (and its
    reboot) on the controller itself."""
    if str(host.vars.get("ansible_connection", "")).rsplit(".", 1)[-1] not in LOCAL_CONNECTIONS:
        return []
    why = "would run its tasks, reboots included, on this controller: remove it, provision reaches its hosts over ssh"
    return [(host.where("ansible_connection"), host.name, f"ansible_connection: local {why}")]


# Ansible's vars plugin (host_group_vars) reads these names, with or without one of these extensions
VARS_DIRS = ("group_vars", "host_vars")
VARS_EXTENSIONS = ("", ".yml", ".yaml", ".json")


def vars_file_warnings(inv: Inventory) -> list[str]:
    """group_vars and host_vars entries Ansible reads for no host: named for no group or host of the inventory
    (a typo, or a group of another inventory: their variables, secrets among them, never apply), links that lead
    nowhere."""
    base = inv.path if inv.path.is_dir() else inv.path.parent
    known = {"group_vars": set(inv.groups) | {"all"}, "host_vars": set(inv.hosts)}
    warnings = []
    for kind in VARS_DIRS:
        entries = sorted((base / kind).iterdir()) if (base / kind).is_dir() else []
        for entry in entries:
            name = next((entry.name[: -len(x)] for x in VARS_EXTENSIONS[1:] if entry.name.endswith(x)), entry.name)
            if entry.is_symlink() and not entry.exists():
                warnings.append(f"{entry}: a link to nothing ({os.readlink(entry)}): no variables are read from it")
            elif not entry.name.startswith(".") and name not in known[kind]:
                what = kind.split("_")[0]
                warnings.append(f"{entry}: no {what} of the inventory is called {name!r}: its variables reach no host")
    return warnings


def _host_problems(hosts: list[Host], checks: tuple) -> list[str]:
    return [line for check in checks for line in _per_source([p for host in hosts for p in check(host)])]


def validate(inv: Inventory, host_key_checking: bool = True) -> list[str]:
    """Return one line per problem; an empty list means the inventory is usable."""
    problems = _check_groups(inv)
    hosts = sorted(inv.hosts.values(), key=lambda h: h.name)
    unreadable = _host_problems(hosts, (_check_size, _check_vault))
    if unreadable:  # the checks below would walk such a value, or decrypt it
        return problems + unreadable
    problems += _host_problems(hosts, (_check_types, _check_unknown))
    problems += _host_problems([rendered_roles(inv, h) for h in hosts], (_check_specs, _check_rendered))
    problems += _per_source(
        [p for ct in sorted(inv.gpu_containers, key=lambda h: h.name) for p in _check_model_source(ct)]
    )
    problems += _host_problems(hosts, (_check_driver_pin, _check_connection))
    vmids: dict[tuple[str, int], str] = {}
    for ct in inv.gpu_containers:
        problems += _check_container(inv, ct, vmids)
    return problems + host_key_checking_problems(inv, host_key_checking) + run_setting_problems()


def unverified_tls_warnings(inv: Inventory) -> list[str]:
    """Where proxmox_api_validate_certs is false for a container that talks to the PVE API over https: its
    password or token goes to whoever answers there (said before anything runs, and again by the module)."""
    found = [
        (
            ct.where("proxmox_api_validate_certs"),
            ct.name,
            "proxmox_api_validate_certs is false: the PVE API's TLS "
            "certificate is NOT verified, and the API password or token goes to whoever answers; set "
            "proxmox_api_ca_file to the CA that signed it instead",
        )
        for ct in inv.gpu_containers
        if ct.vars.get("proxmox_api_validate_certs") is False and ct.vars.get("gpu_passthrough_api_backend") != "ssh"
    ]
    return _per_source(found)


LOOPBACK = ("127.0.0.1", "::1", "localhost")


def open_api_warnings(inv: Inventory) -> list[str]:
    """Where a container serves beyond its own loopback without an API key: whoever reaches the address may use the
    model (SGLang checks no key when none is set)."""
    found = []
    for ct in inv.gpu_containers:
        listen, key = ct.vars.get("sglang_host", LOOPBACK[0]), ct.vars.get("sglang_api_key") or ""
        if is_template(listen) or is_template(key) or from_vault(key) or key or str(listen) in LOOPBACK:
            continue
        found.append(
            (
                ct.where("sglang_host"),
                ct.name,
                f"sglang_host is {listen} and sglang_api_key is empty: the "
                "API answers anyone who can reach that address; set sglang_api_key (from vault or the "
                "environment)",
            )
        )
    return _per_source(found)


# Variables an earlier release read and this one ignores, with what replaced each (one state directory for every role)
REMOVED_VARIABLES = {
    name: "provision_state_dir (roles/provision_common), one state directory for every role"
    for name in ("kernel_cmdline_state_dir", "gpu_diag_state_dir", "sglang_state_dir", "sglang_bench_state_dir")
}


def removed_variable_warnings(inv: Inventory) -> list[str]:
    """Where the inventory still sets a variable no role reads any more: it would be ignored without a word."""
    found = [
        (host.where(name), host.name, f"{name} is no longer read: set {instead}")
        for host in inv.hosts.values()
        for name, instead in REMOVED_VARIABLES.items()
        if name in host.vars
    ]
    return _per_source(found)


def plain_text_secret_warnings(inv: Inventory) -> list[str]:
    warnings = []
    seen: set[tuple[str, str]] = set()
    for host in inv.hosts.values():
        for name in secrets.declared_secrets():
            value = host.vars.get(name)
            where = host.where(name)
            if from_vault(value) or not value or is_template(value) or (where, name) in seen:
                continue
            seen.add((where, name))
            warnings.append(
                f"{where}: {name} is in plain text; use ansible-vault or "
                f"\"{{{{ lookup('ansible.builtin.env', 'NAME') }}}}\""
            )
    return warnings


def loaded(
    inventory: str | Path | Inventory,
    vault: VaultOptions | None = None,
    host_key_checking: bool = True,
    extra_vars: tuple[str, ...] = (),
) -> Inventory:
    """The inventory a command works on: the one its caller loaded and checked already (the CLI loads each command's
    once, and hands it on), or else `load`ed now."""
    if isinstance(inventory, Inventory):
        return inventory
    return load(inventory, vault, host_key_checking, extra_vars)


def load(
    name_or_path: str | Path,
    vault: VaultOptions | None = None,
    host_key_checking: bool = True,
    extra_vars: tuple[str, ...] = (),
) -> Inventory:
    """Load with Ansible, check the contract, and return it; raise InventoryError listing every problem. `extra_vars`
    (--extra-vars, absolute_extra_vars) are every host's variables above the inventory's, checked as they are."""
    source = resolve(name_or_path)
    inv = parse(source, vault or VaultOptions(), extra_vars)
    inv.host_key_checking, inv.given = host_key_checking, str(name_or_path)
    problems = validate(inv, host_key_checking)
    if problems:
        raise InventoryError(problems, frozenset(secrets.values(inv)))
    inv.warnings = plain_text_secret_warnings(inv) + unverified_tls_warnings(inv) + removed_variable_warnings(inv)
    inv.warnings += secrets.weak_warnings(inv) + vars_file_warnings(inv)
    inv.warnings += open_api_warnings(inv) + run_setting_warnings(len(inv.hosts))
    return inv
