"""The command-line flags of a pinned SGLang release, read from its wheel's source.

SGLang 0.5.x declares most server flags as annotated fields (`name: A[type, Arg(...)]` or
`A[type, "help"]`) under `sglang/srt/arg_groups/fields/`, turned into argparse options by
`add_cli_args_from_dataclass` (bool -> store_true, `cli_name`/`aliases` honoured, `no_cli`
skipped); the rest are `parser.add_argument(...)` calls in `sglang/srt/server_args.py`.
Reading that source with `ast` needs neither torch nor a GPU, so a typo in an inventory's
flags fails on the controller at apply time.

Whether a flag takes a value is argparse's: store_true/store_false/store_const/count take none, nor does
argparse.BooleanOptionalAction (which also registers `--no-<flag>`), nor an explicit `nargs=0`; SGLang's own
action classes (`sglang/srt/arg_groups/argparse_actions.py`, such as DeprecatedStoreTrueAction) are read from
that file for their `nargs` default.
"""

from __future__ import annotations

import ast
import zipfile
from pathlib import Path

FIELDS_PREFIX = "sglang/srt/arg_groups/fields/"
SERVER_ARGS = "sglang/srt/server_args.py"
ACTIONS = "sglang/srt/arg_groups/argparse_actions.py"
# argparse's own actions that take no value (Lib/argparse.py: nargs=0)
NO_VALUE_ACTIONS = ("store_true", "store_false", "store_const", "append_const", "count", "help", "version")
BOOLEAN_OPTIONAL = "BooleanOptionalAction"


def action_nargs_from_source(source: str) -> dict[str, object]:
    """{class name: its nargs default} for the argparse.Action classes of one module (None where __init__ sets
    none: argparse then takes one value)."""
    found: dict[str, object] = {}
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ClassDef):
            init = next((f for f in node.body if isinstance(f, ast.FunctionDef) and f.name == "__init__"), None)
            found[node.name] = _default(init, "nargs") if init else None
    return found


def _default(func: ast.FunctionDef, name: str) -> object:
    given = func.args.args[len(func.args.args) - len(func.args.defaults) :]
    defaults = dict(zip([a.arg for a in given], func.args.defaults, strict=True))
    kwonly = zip(func.args.kwonlyargs, func.args.kw_defaults, strict=True)
    defaults.update({a.arg: d for a, d in kwonly if d is not None})
    node = defaults.get(name)
    return node.value if isinstance(node, ast.Constant) else None


def _action_name(node: ast.expr | None) -> str | None:
    """ "store_true" for a string action, the class name for argparse.BooleanOptionalAction or a custom class."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.Attribute):
        return node.attr
    return node.id if isinstance(node, ast.Name) else None


def _flags_of(names: list[str], call: ast.Call, takes_value: bool, actions: dict[str, object]) -> dict[str, bool]:
    """{flag: takes_a_value} for one option: its action and nargs decide, as argparse does."""
    action, nargs = _action_name(_keyword(call, "action")), _keyword(call, "nargs")
    if isinstance(nargs, ast.Constant):
        takes_value = nargs.value != 0
    elif action in NO_VALUE_ACTIONS or action == BOOLEAN_OPTIONAL:
        takes_value = False
    elif action in actions:
        takes_value = actions[action] != 0
    flags = dict.fromkeys(names, takes_value)
    if action == BOOLEAN_OPTIONAL:  # Lib/argparse.py BooleanOptionalAction: "--no-" + each long option
        flags.update(dict.fromkeys(["--no-" + n[2:] for n in names if n.startswith("--")], False))
    return flags


def _is_bool(node: ast.expr) -> bool:
    """bool, Optional[bool] or bool | None."""
    if isinstance(node, ast.Name):
        return node.id == "bool"
    if isinstance(node, ast.Subscript) and getattr(node.value, "id", "") == "Optional":
        return _is_bool(node.slice)
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.BitOr):
        return (_is_bool(node.left) and _is_none(node.right)) or (_is_bool(node.right) and _is_none(node.left))
    return False


def _is_none(node: ast.expr) -> bool:
    return isinstance(node, ast.Constant) and node.value is None


def _keyword(call: ast.Call, name: str) -> ast.expr | None:
    return next((k.value for k in call.keywords if k.arg == name), None)


def _strings(node: ast.expr | None) -> list[str]:
    if isinstance(node, (ast.List, ast.Tuple)):
        return [e.value for e in node.elts if isinstance(e, ast.Constant) and isinstance(e.value, str)]
    return []


def flags_from_fields_source(source: str, actions: dict[str, object] | None = None) -> dict[str, bool]:
    """{flag: takes_a_value} for every CLI field declared in one fields/*.py module."""
    flags: dict[str, bool] = {}
    for node in ast.walk(ast.parse(source)):
        flags.update(_field_flags(node, actions or {}))
    return flags


def _field_flags(node: ast.AST, actions: dict[str, object]) -> dict[str, bool]:
    """{flag: takes_a_value} of one `name: A[type, "help"]` or `name: A[type, Arg(...)]` field; {} for anything
    else."""
    if not (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)):
        return {}
    ann = node.annotation
    if not (isinstance(ann, ast.Subscript) and getattr(ann.value, "id", "") == "A"):
        return {}
    parts = ann.slice.elts if isinstance(ann.slice, ast.Tuple) else [ann.slice]
    if len(parts) < 2:
        return {}
    type_node, meta = parts[0], parts[1]
    name = "--" + node.target.id.replace("_", "-")
    if isinstance(meta, ast.Call) and getattr(meta.func, "id", "") == "Arg":
        return _arg_flags(meta, name, not _is_bool(type_node), actions)
    if isinstance(meta, ast.Constant) and isinstance(meta.value, str):
        return {name: not _is_bool(type_node)}
    return {}


def _arg_flags(arg: ast.Call, name: str, takes_value: bool, actions: dict[str, object]) -> dict[str, bool]:
    """The flags of a field declared with Arg(...): its cli_name and aliases, none when no_cli."""
    no_cli = _keyword(arg, "no_cli")
    if isinstance(no_cli, ast.Constant) and no_cli.value is True:
        return {}
    cli_name = _keyword(arg, "cli_name")
    names = [cli_name.value if isinstance(cli_name, ast.Constant) else name, *_strings(_keyword(arg, "aliases"))]
    return _flags_of(names, arg, takes_value, actions)


def flags_from_add_argument_source(source: str, actions: dict[str, object] | None = None) -> dict[str, bool]:
    """{flag: takes_a_value} for explicit parser.add_argument("--x", ...) calls."""
    flags: dict[str, bool] = {}
    for node in ast.walk(ast.parse(source)):
        if not (isinstance(node, ast.Call) and getattr(node.func, "attr", "") == "add_argument"):
            continue
        names = [a.value for a in node.args if isinstance(a, ast.Constant) and str(a.value).startswith("--")]
        flags.update(_flags_of(names, node, True, actions or {}))
    return flags


def flags_from_wheel(wheel: Path) -> dict[str, bool]:
    """Every `sglang serve` / `python -m sglang.launch_server` flag of this wheel."""
    flags: dict[str, bool] = {}
    with zipfile.ZipFile(wheel) as zf:
        names = zf.namelist()
        actions = action_nargs_from_source(zf.read(ACTIONS).decode()) if ACTIONS in names else {}
        for name in names:
            if name.startswith(FIELDS_PREFIX) and name.endswith(".py"):
                flags.update(flags_from_fields_source(zf.read(name).decode(), actions))
        if SERVER_ARGS in names:
            flags.update(flags_from_add_argument_source(zf.read(SERVER_ARGS).decode(), actions))
    if "--model-path" not in flags:
        raise ValueError(f"{wheel}: no SGLang server flags found (not an sglang 0.5.x wheel?)")
    return dict(sorted(flags.items()))


def unknown_flags(args: list[str], known: dict[str, bool]) -> list[str]:
    """The flags in an argument list that the release does not accept (`--x=1` and `--x 1` forms).

    Like argparse (allow_abbrev), a unique prefix of a flag is accepted (`--tp` for `--tp-size`); the
    value after a flag that takes one is skipped, so a value starting with `--` is not judged."""
    unknown = []
    skip_value = False
    for arg in args:
        if skip_value:
            skip_value = False
            continue
        if not arg.startswith("--"):
            continue
        name = arg.split("=", 1)[0]
        matches = [name] if name in known else [flag for flag in known if flag.startswith(name)]
        if len(matches) != 1:
            unknown.append(name)
            continue
        skip_value = known[matches[0]] and "=" not in arg
    return unknown
