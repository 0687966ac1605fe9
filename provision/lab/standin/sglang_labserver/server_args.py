"""The stand-in's command line, read as SGLang 0.5.23 reads it.

Where the real wheel is importable (`sglang.srt.server_args`, with its dependencies: torch,
msgspec, ...), its own `prepare_server_args` parses the command line, and `launch_command` and
`resolved_dict()` come from it. The lab's SGLang venv holds only this stand-in, so there the
parse is reproduced from the wheel's source, each step naming the file and line it copies:
argparse over the release's flag list (`flags.json`, read from the wheel when the lab builds this
package), `--config FILE.yaml` merged in front of the command line, and `launch_command` as the
merged argv joined by spaces, which carries `--api-key VALUE` when the key came from the file.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

ALIASES = {"--model": "--model-path", "--tensor-parallel-size": "--tp-size"}


@dataclass
class ParsedArgs:
    """What the server knows about its own command line."""

    args: argparse.Namespace
    launch_command: str
    resolved: dict[str, Any]
    source: str  # "sglang" (the real wheel parsed it) or "reproduced"


def load_flags() -> dict[str, bool]:
    """{flag: takes a value} for every flag of the pinned release."""
    return json.loads(resources.files("sglang_labserver").joinpath("flags.json").read_text())


def build_parser(flags: dict[str, bool] | None = None) -> argparse.ArgumentParser:
    flags = load_flags() if flags is None else flags
    # sglang/srt/server_args.py l.679: the real parser's prog
    parser = argparse.ArgumentParser(prog="sglang serve")
    groups: dict[str, list[str]] = {}
    for flag in flags:
        groups.setdefault(ALIASES.get(flag, flag), []).append(flag)
    for canonical, names in groups.items():
        names = sorted(names, key=lambda n: n != canonical)
        dest = canonical[2:].replace("-", "_")
        if flags[canonical if canonical in flags else names[0]]:
            parser.add_argument(*names, dest=dest, required=canonical == "--model-path")
        else:
            parser.add_argument(*names, dest=dest, action="store_true")
    return parser


def _load_yaml(path: str) -> Any:
    """yaml.safe_load where PyYAML is installed; else the JSON subset of YAML (what provision writes)
    and plain `key: value` lines, which is all the lab ever hands the stand-in."""
    text = Path(path).read_text()
    try:
        import yaml
    except ImportError:
        try:
            return json.loads(text) if text.strip() else None
        except ValueError:
            data = {}
            for line in text.splitlines():
                if ":" in line and not line.lstrip().startswith("#"):
                    key, value = line.split(":", 1)
                    data[key.strip()] = value.strip().strip("'\"")
            return data
    return yaml.safe_load(text)


def merge_config(argv: list[str], parser: argparse.ArgumentParser) -> list[str]:
    """sglang/srt/utils/server_args_config_parser.py ConfigArgumentMerger.merge_config_with_args
    (l.75-106): the file's options become flags placed in front of the command line, and
    `--config FILE` itself is dropped."""
    if "--config" not in argv:  # server_args.py l.683
        return argv
    indices = [i for i, a in enumerate(argv) if a == "--config"]
    if len(indices) > 1:  # l.113-114
        raise ValueError("Multiple config files specified! Only one allowed.")
    index = indices[0]
    if index == len(argv) - 1:  # l.119-120
        raise ValueError("No config file specified after --config flag!")
    path = argv[index + 1]
    if Path(path).suffix.lower() not in (".yaml", ".yml"):  # l.158-159
        raise ValueError(f"Config file must be YAML format, got: {Path(path).suffix}")
    if not Path(path).exists():  # l.161-162
        raise ValueError(f"Config file not found: {path}")
    data = _load_yaml(path) or {}
    if not isinstance(data, dict):  # l.150-151
        raise ValueError("Config file must contain a dictionary at root level")
    store_true = {
        key
        for action in parser._actions
        if isinstance(action, argparse._StoreTrueAction)
        for key in {action.dest} | {o[2:].replace("-", "_") for o in action.option_strings if o.startswith("--")}
    }
    config_args: list[str] = []
    for key, value in data.items():  # l.164-183 _convert_config_to_args
        if isinstance(value, bool):  # l.185-200 _add_boolean_arg
            if key.replace("-", "_") in store_true:
                if value:
                    config_args.append(f"--{key}")
            else:
                config_args += [f"--{key}", str(value).lower()]
        elif isinstance(value, list):  # l.202-206
            if value:
                config_args += [f"--{key}", *(str(v) for v in value)]
        elif isinstance(value, dict):
            config_args += [f"--{key}", json.dumps(value)]
        else:  # l.208-210
            config_args += [f"--{key}", str(value)]
    return config_args + argv[:index] + argv[index + 2 :]  # l.106


def redact_watermark_command_line(argv: list[str]) -> str:
    """sglang/srt/sampling/watermarking/core.py l.110-134: only the watermark config is redacted;
    `--api-key VALUE` stays in the command line."""
    out, redact_next = [], False
    for arg in argv:
        if redact_next:
            out.append("<redacted>")
            redact_next = False
        elif arg == "--watermark-config":
            out.append(arg)
            redact_next = True
        elif arg.startswith("--watermark-config="):
            out.append("--watermark-config=<redacted>")
        else:
            out.append(arg)
    return " ".join(out)


def _from_real_wheel(argv: list[str]) -> ParsedArgs | None:
    """The real wheel's parse, where this interpreter can import it."""
    try:
        from sglang.srt.server_args import prepare_server_args
    except Exception:  # the lab's venv: no sglang, or sglang without torch
        return None
    server_args = prepare_server_args(argv)  # server_args.py l.668-720
    resolved = server_args.resolved_dict()  # server_args.py l.316
    args = argparse.Namespace(**{k: v for k, v in resolved.items() if not isinstance(v, dict)})
    return ParsedArgs(args, server_args.launch_command, resolved, "sglang")


def parse(argv: list[str], use_real_wheel: bool = True) -> ParsedArgs:
    """`sglang serve`'s parse of argv (what follows `python -m sglang.launch_server`)."""
    real = _from_real_wheel(argv) if use_real_wheel else None
    if real is not None:
        return real
    parser = build_parser()
    try:
        merged = merge_config(argv, parser)
    except (OSError, ValueError) as exc:
        parser.error(str(exc))
    args = parser.parse_args(merged)  # server_args.py l.696
    # server_args.py l.717-719: _launch_command is the merged argv, keys from --config included
    return ParsedArgs(args, redact_watermark_command_line(merged), dict(vars(args)), "reproduced")
