"""Command line: parses flags, calls the Python API, prints the result. Nothing else.

Exit codes: 0 every host succeeded (`plan`: nothing would change); 1 a host failed or was
unreachable, or another run holds a lock; 2 usage or inventory error (nothing was contacted); 3 `bench`
found a regression against its baseline; 4 `plan`: changes are pending; 130 / 143 / 129 SIGINT / SIGTERM /
SIGHUP stopped the command (a run's record written). `--json` prints one envelope for every command, errors
included (docs/json.md).
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import json
import os
import signal
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rich.console import Console

from provision import __version__, locks, output, secrets
from provision.errors import (
    EMPTY_LIMIT,
    EXIT_FAILED,
    EXIT_OK,
    EXIT_PENDING,
    EXIT_REGRESSION,
    EXIT_SIGNAL_BASE,
    EXIT_USAGE,
    Interrupted,
    InventoryError,
    ProvisionError,
    Signalled,
    UsageError,
)
from provision.paths import module_util
from provision.record import DEFAULT_RUNS_DIR

PHASE_LIST = ",".join(module_util("provision_phases").PHASES)
PART_LIST = ",".join(module_util("provision_phases").PART_TAGS)

JSON_SCHEMA_VERSION = 1


class _Parser(argparse.ArgumentParser):
    """argparse that raises a UsageError (one line, exit 2, the JSON envelope with --json)
    instead of printing its usage and exiting."""

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("allow_abbrev", False)  # `--lim` is not `--limit`: a flag is given whole or refused
        super().__init__(*args, **kwargs)

    def error(self, message: str):  # type: ignore[override]
        raise UsageError(f"{self.prog}: {message}")


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return value


def _runs_dir_path(text: str) -> Path:
    path = Path(text)
    existing = next((p for p in (path, *path.parents) if p.exists()), None)
    if existing is not None and not existing.is_dir():
        raise argparse.ArgumentTypeError(f"{existing} is not a directory")
    if existing is not None and not os.access(existing, os.W_OK | os.X_OK):
        raise argparse.ArgumentTypeError(f"{existing} is not writable")
    return path


def _output_file(text: str) -> Path:
    path = Path(text)
    if path.is_dir():
        raise argparse.ArgumentTypeError(f"{text} is a directory")
    parent = path.parent if str(path.parent) else Path(".")
    if not parent.is_dir():
        raise argparse.ArgumentTypeError(f"{parent} does not exist")
    if not os.access(parent, os.W_OK | os.X_OK) or (path.exists() and not os.access(path, os.W_OK)):
        raise argparse.ArgumentTypeError(f"{text} is not writable")
    return path


def _limit(text: str) -> str:
    """A --limit as ansible-playbook reads it from this directory: its `@FILE` parts made absolute (the playbook runs
    in another directory). A blank one is refused here, before anything is loaded."""
    from ansible.inventory.manager import split_host_pattern

    if not text.strip():
        raise argparse.ArgumentTypeError(EMPTY_LIMIT.removeprefix("--limit "))
    parts = split_host_pattern(text)
    if not any(p.startswith("@") for p in parts):
        return text
    return ",".join(f"@{Path(p[1:]).resolve()}" if p.startswith("@") else p for p in parts)


def _common(p: argparse.ArgumentParser, limit: bool = True) -> None:
    p.add_argument(
        "--inventory",
        "-i",
        required=True,
        help="./inventory/NAME, a path (an inventory directory or file, any format Ansible reads), "
        "or 'example' for the packaged example",
    )
    if limit:
        p.add_argument("--limit", "-l", type=_limit, help="Ansible host pattern to restrict the run to (@FILE: a list)")
    p.add_argument("--json", action="store_true", help="print the JSON envelope on stdout (docs/json.md)")
    _ansible_opts(p)


def _runs_dir(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--runs-dir",
        type=_runs_dir_path,
        default=Path(os.environ.get("PROVISION_RUNS_DIR", DEFAULT_RUNS_DIR)),
        help=f"where run records go (default: $PROVISION_RUNS_DIR or {DEFAULT_RUNS_DIR})",
    )


def _ansible_opts(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--vault-password-file",
        type=Path,
        action="append",
        default=[],
        help="as ansible-playbook's (repeatable); the inventory is read with it too",
    )
    p.add_argument(
        "--vault-id", action="append", default=[], metavar="[LABEL@]SOURCE", help="as ansible-playbook's (repeatable)"
    )
    p.add_argument(
        "--no-host-key-checking",
        dest="host_key_checking",
        action="store_false",
        help="DANGEROUS: accept any ssh host key (checking is on by default)",
    )


def _playbook_opts(p: argparse.ArgumentParser, skip: bool = True) -> None:
    """ansible-playbook's own options, with its meanings, for the commands that converge."""
    p.add_argument(
        "--extra-vars",
        "-e",
        action="append",
        default=[],
        metavar="KEY=VALUE|YAML|@FILE",
        help="as ansible-playbook's (repeatable): variables above every inventory value, checked as the inventory's",
    )
    if skip:
        p.add_argument("--skip-tags", help=f"comma-separated phases to leave out: {PHASE_LIST}")
    p.add_argument("--verbose", "-v", action="count", default=0, help="as ansible-playbook's, up to -vvvv")
    p.add_argument("--user", "-u", help="as ansible-playbook's: connect as this user where the inventory names none")
    p.add_argument("--become", "-b", action="store_true", help="as ansible-playbook's: become root for every task")
    p.add_argument("--list-hosts", action="store_true", help="print the hosts the run would reach, and run nothing")
    p.add_argument(
        "--list-tasks", action="store_true", help="print ansible-playbook's list of the run's tasks, and run nothing"
    )


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="provision",
        description="Take a Proxmox VE GPU host to a verified SGLang endpoint.",
    )
    parser.add_argument("--version", action="version", version=f"provision {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND", parser_class=_Parser)

    p = sub.add_parser("apply", help="converge hosts: kernel args, NVIDIA driver, GPU passthrough, SGLang service")
    _common(p)
    p.add_argument("--tags", "-t", help=f"comma-separated phases: {PHASE_LIST}; or parts of one: {PART_LIST}")
    p.add_argument("--check", action="store_true", help="report what would change without changing it")
    p.add_argument("--diff", action="store_true", help="show file and config differences")
    p.add_argument(
        "--reboot",
        choices=("auto", "never"),
        help="reboot nodes whose kernel args changed, and containers whose devN or nesting change is pending",
    )
    p.add_argument("--yes", "-y", action="store_true", help="do not ask for confirmation")
    _full(p)
    _break_lock(p)
    _runs_dir(p)
    _playbook_opts(p)

    p = sub.add_parser("rollback", help="restore the previous kernel command line of nodes and reboot them")
    _common(p)
    p.add_argument("--reboot", choices=("auto", "never"), help="reboot the nodes whose command line was restored")
    p.add_argument("--yes", "-y", action="store_true", help="do not ask for confirmation")
    p.set_defaults(check=False, diff=False, tags=None)
    _break_lock(p)
    _runs_dir(p)

    p = sub.add_parser("retire", help="take containers, and their nodes, back out of provision's management")
    _common(p)
    p.add_argument("--weights", action="store_true", help="also remove weights the run downloaded from Hugging Face")
    p.add_argument("--check", action="store_true", help="report what would be removed without removing it")
    p.add_argument("--diff", action="store_true", help="show file and config differences")
    p.add_argument("--reboot", choices=("auto", "never"), help="reboot nodes whose kernel arguments came off")
    p.add_argument("--yes", "-y", action="store_true", help="do not ask for confirmation")
    p.set_defaults(tags=None)
    _break_lock(p)
    _runs_dir(p)
    _playbook_opts(p, skip=False)

    p = sub.add_parser("plan", help="apply in --check --diff mode and summarise what would change")
    _common(p)
    p.add_argument("--tags", "-t", help=f"comma-separated phases: {PHASE_LIST}; or parts of one: {PART_LIST}")
    _full(p)
    _runs_dir(p)
    _playbook_opts(p)

    p = sub.add_parser("verify", help="prove the deployment: every host read once through Ansible, then the checks")
    _common(p)
    p.add_argument("--junit", type=_output_file, help="write JUnit XML here")
    p.add_argument("--checks", help="only the checks matching this pytest -k expression (e.g. 'smoke or health')")
    p.add_argument("--check-dir", type=Path, help="your own testinfra files (test_*.py) are here (default: ./checks)")
    p.add_argument("--after-reboot", action="store_true", help="reboot nodes, then containers, one at a time, first")
    p.add_argument("--yes", "-y", action="store_true", help="with --after-reboot: do not ask for confirmation")
    _runs_dir(p)

    p = sub.add_parser("capacity", help="serving capacity of each SGLang container, in sessions")
    _common(p)
    p.add_argument("--session-tokens", default="32768", help="session sizes to count, comma-separated (default 32768)")
    _runs_dir(p)

    p = sub.add_parser("diag", help="GPU peer-to-peer and NCCL correctness diagnostic on the containers")
    _common(p)
    p.add_argument("--hosts", action="store_true", help="also run it on the Proxmox nodes")
    _runs_dir(p)

    p = sub.add_parser("bench", help="throughput sweep with SGLang's own benchmark client, with a report")
    _common(p)
    p.add_argument(
        "--concurrency", default="1,4,16,32,64,128", help="levels, comma-separated (default 1,4,16,32,64,128)"
    )
    p.add_argument("--input-len", type=int, default=1024, help="prompt tokens per request, fixed (default 1024)")
    p.add_argument("--output-len", type=int, default=1024, help="answer tokens per request, fixed (default 1024)")
    p.add_argument(
        "--prompts-per-level",
        type=int,
        default=10,
        metavar="K",
        help="each level sends K x its concurrency prompts (default 10)",
    )
    p.add_argument("--baseline", type=Path, help="baseline JSON to compare with (e.g. docs/baselines/scenario.json)")
    p.add_argument(
        "--through-gateway",
        action="store_true",
        help="run the client on each host of sglang_gateways, against the gateway: the fleet's throughput",
    )
    p.add_argument(
        "--threshold",
        type=float,
        default=0.10,
        help="a throughput drop or p99 TTFT rise beyond this fraction is a regression (default 0.10)",
    )
    _runs_dir(p)

    p = sub.add_parser("lab", help="the test lab: VMs, a container and a Proxmox API on this machine")
    lab_sub = p.add_subparsers(dest="lab_command", required=True, metavar="SUBCOMMAND")
    c = lab_sub.add_parser("up", help="build (or reuse) the image, boot the lab, write inventory/lab/")
    c.add_argument(
        "--hosts", type=int, choices=(1, 2), default=2, help="lab PVE hosts: 1 = GRUB, 2 = + systemd-boot (default 2)"
    )
    c.add_argument(
        "--containers", type=_positive_int, default=1, help="SGLang containers (nspawn), for fleet timings (default 1)"
    )
    c.add_argument(
        "--cold-boot",
        action="store_true",
        help="boot the VMs from their disks instead of resuming their booted snapshots (and save none)",
    )
    c.add_argument(
        "--pve-version",
        type=int,
        choices=(8, 9),
        default=9,
        help="the Proxmox VE the API behaves as: 8 keeps every devN change pending until the CT restarts (default 9)",
    )
    c.add_argument(
        "--bare",
        action="store_true",
        help="nodes without an NVIDIA driver (the driver phase installs it), no container (CT 101 not created)",
    )
    c.add_argument(
        "--gpu-link",
        choices=("pcie", "nvlink"),
        default="pcie",
        help="the link nvidia-smi topo -m reports between the fake GPUs: PHB (PCIe) or NV18 (default pcie)",
    )
    c.add_argument(
        "--nodes",
        choices=("vm", "nspawn"),
        default="vm",
        help="the PVE nodes: qemu VMs (bootloaders, real reboots; default), or nspawn containers that boot in seconds "
        "with the profile's kernel arguments already on their line, for work that needs no bootloader (docs/lab.md)",
    )
    c.add_argument(
        "--gateway",
        action="store_true",
        help="one more CT, without GPUs, in group sglang_gateways: SGLang's gateway in front of the containers",
    )
    c = lab_sub.add_parser(
        "kernel", help="install a newer kernel on a lab node, as a kernel update does; it boots it at its next reboot"
    )
    c.add_argument("node", help="the lab node (a VM: pve-grub or pve-sdboot)")
    c.add_argument("--headers", action="store_true", help="install its headers too, as proxmox-default-headers does")
    c = lab_sub.add_parser("down", help="stop everything the lab started and remove its state")
    c = lab_sub.add_parser("status", help="what is running")
    c.add_argument("--json", action="store_true")

    p = sub.add_parser("inventory", help="inventory tools")
    inv_sub = p.add_subparsers(dest="inventory_command", required=True, metavar="SUBCOMMAND")
    c = inv_sub.add_parser("check", help="validate an inventory without contacting any host")
    _common(c, limit=False)
    return parser


def _confirm(args: argparse.Namespace, console: Console, what: str = "changes hosts and may reboot them") -> None:
    if args.yes or getattr(args, "check", False):
        return
    if not sys.stdin.isatty():  # a usage error: nothing was contacted
        raise UsageError(f"{args.command} {what}: pass --yes to confirm (no terminal to ask)")
    answer = console.input(
        f"Apply to inventory {args.inventory!r}{' limit ' + args.limit if args.limit else ''}? [y/N] "
    )
    if answer.strip().lower() not in ("y", "yes"):
        raise ProvisionError("aborted: nothing was changed")


@dataclass
class Outcome:
    """What a command returns to main(): its exit code, its hosts' states and its JSON payload."""

    exit_code: int
    result: dict[str, Any] = field(default_factory=dict)
    hosts: dict[str, str] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)  # one line each, printed after `error: `


def _vault(args: argparse.Namespace):
    from provision.inventory import VaultOptions

    return VaultOptions(tuple(args.vault_password_file), tuple(args.vault_id))


def _load(args: argparse.Namespace, err: Console):
    """The inventory, validated, before anything runs: its warnings printed now, and its secrets (with the
    environment's) kept for main() to scrub the error lines and the JSON envelope with."""
    from provision import inventory, present, secrets

    inv = inventory.load(args.inventory, _vault(args), args.host_key_checking, _extra_vars(args))
    args.loaded = inv  # handed to the command's API call, which uses it instead of loading it again
    present.print_warnings(err, inv.warnings)
    args.secrets = secrets.values(inv)
    _runs_dir_outside(getattr(args, "runs_dir", None), inv.path)
    return inv


def _extra_vars(args: argparse.Namespace) -> tuple[str, ...]:
    from provision import inventory

    return inventory.absolute_extra_vars(getattr(args, "extra_vars", None) or [])


def _runs_dir_outside(runs_dir: Path | None, inventory: Path) -> None:
    """Run records hold what a run said about its hosts: never inside the inventory, where Ansible would read them
    as inventory sources and a commit of the inventory would carry them."""
    if runs_dir is None:
        return
    inv_dir = Path(inventory).resolve()
    inv_dir = inv_dir if inv_dir.is_dir() else inv_dir.parent
    if Path(runs_dir).resolve().is_relative_to(inv_dir):
        raise UsageError(
            f"the runs dir {runs_dir} is inside the inventory {inv_dir}: keep run records outside it (--runs-dir, or "
            "PROVISION_RUNS_DIR)"
        )


def _cmd_inventory_check(args: argparse.Namespace, out: Console, err: Console) -> Outcome:
    from provision import apply as apply_mod
    from provision import inventory, present

    inv = _load(args, err)
    inventory.require(inv, inv.match(None), apply_mod.PHASES)  # what a full apply would need
    if not args.json:
        present.print_inventory_check(out, inv)
    result = {
        "inventory": str(inv.path),
        "proxmox_hosts": [h.name for h in inv.proxmox_hosts],
        "gpu_containers": [h.name for h in inv.gpu_containers],
        "warnings": inv.warnings,
    }
    return Outcome(EXIT_OK, result, {h: "valid" for h in inv.match(None)})


def _apply_options(args: argparse.Namespace, plan: bool = False, **overrides: Any):
    from provision import apply as apply_mod
    from provision import runner

    fields = {
        "inventory": getattr(args, "loaded", None) or args.inventory,
        **_run_options(args),
        "tags": apply_mod.parse_tags(getattr(args, "tags", None)),
        "check": plan or getattr(args, "check", False),
        "diff": plan or getattr(args, "diff", False),
        "reboot": None if plan else args.reboot,
        "full": getattr(args, "full", False),
        "break_lock": getattr(args, "break_lock", False),
        "user": runner.UserOptions(
            _extra_vars(args),
            tuple(apply_mod.parse_tags(getattr(args, "skip_tags", None), "--skip-tags")),
            min(getattr(args, "verbose", 0), 4),
            getattr(args, "user", None),
            getattr(args, "become", False),
        ),
    }
    return apply_mod.ApplyOptions(**{**fields, **overrides})


def _cmd_rollback(args: argparse.Namespace, out: Console, err: Console) -> Outcome:
    from provision import apply as apply_mod
    from provision import present

    if not args.limit:
        raise UsageError("rollback needs --limit HOST: roll back the nodes you mean, by name or pattern")
    _load(args, err).scope(args.limit)  # validate before asking anything
    opts = _apply_options(args)
    _confirm(args, err)
    result = apply_mod.apply(opts, progress=_progress(err), kind="rollback", playbook=apply_mod.ROLLBACK_PLAYBOOK)
    if not args.json:
        present.print_apply(out, result, "rollback")
    code = EXIT_OK if result.succeeded else EXIT_FAILED
    return Outcome(code, result.to_dict(), result.host_states, errors=locks.held_errors(result))


def _cmd_retire(args: argparse.Namespace, out: Console, err: Console) -> Outcome:
    from provision import apply as apply_mod
    from provision import inventory, present

    if not args.limit:
        raise UsageError("retire needs --limit HOST: name the containers (and nodes) to retire, by name or pattern")
    inv = _load(args, err)
    opts = _apply_options(args, retire_weights=args.weights)
    scope = inv.scope(args.limit)
    problems = apply_mod.user_extra_problems(inv, opts) + apply_mod.retire_problems(inv, scope)  # before asking
    if problems:
        raise UsageError("; ".join(problems))
    # what the devN removal and the node's line need of the inventory (the API's secret: devN wants a password)
    inventory.require(inv, scope, apply_mod.RETIRE_PHASES, opts.reboot)
    listed = _listing(args, out, opts, inv, scope, apply_mod.RETIRE_PLAYBOOK)
    if listed:
        return listed
    _confirm(args, err, "stops and removes the SGLang service, the GPU entries and the kernel arguments")
    result = apply_mod.apply(opts, progress=_progress(err), kind="retire", playbook=apply_mod.RETIRE_PLAYBOOK)
    if not args.json:
        present.print_apply(out, result, "retire")
    code = EXIT_OK if result.succeeded else EXIT_FAILED
    return Outcome(code, result.to_dict(), result.host_states, errors=locks.held_errors(result))


def _break_lock(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--break-lock",
        action="store_true",
        help="take a host lock another controller's run holds, and say whose it was (only when that run is gone); "
        "a live run of this controller is never broken",
    )


def _full(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--full", action="store_true", help="run every phase's tasks, even where inputs and watched state are unchanged"
    )


def _plan_exit(states: dict[str, str]) -> int:
    if any(s in ("failed", "unreachable", "not reached") for s in states.values()):
        return EXIT_FAILED
    return EXIT_PENDING if "changes pending" in states.values() else EXIT_OK


def _cmd_apply(args: argparse.Namespace, out: Console, err: Console, plan: bool = False) -> Outcome:
    from provision import apply as apply_mod
    from provision import inventory, present

    inv = _load(args, err)
    opts = _apply_options(args, plan)
    # validate before asking anything: the scope, --extra-vars, and what the roles of the chosen phases require of it
    scope = inv.scope(args.limit)
    clashes = apply_mod.user_extra_problems(inv, opts)
    if clashes:
        raise UsageError("; ".join(clashes))
    phases = apply_mod.tagged_phases(opts.tags, opts.user.skip_tags)
    inventory.require(inv, scope, phases, opts.reboot)
    listed = _listing(args, out, opts, inv, scope)
    if listed:
        return listed
    if not plan:
        _confirm(args, err)
    result = apply_mod.apply(opts, progress=_progress(err), kind="plan" if plan else "apply")
    data = result.to_dict()
    if plan:
        data["would_change"] = result.changed_by_host()
    if not args.json:
        title = "plan (check mode: nothing was changed)" if plan else "apply"
        present.print_apply(out, result, title, show_diff=opts.diff)
    code = _plan_exit(result.host_states) if plan else (EXIT_OK if result.succeeded else EXIT_FAILED)
    return Outcome(code, data, result.host_states, locks.held_errors(result))


def _listing(args: argparse.Namespace, out: Console, opts, inv, scope: list[str], playbook: str = "") -> Outcome | None:
    """--list-hosts or --list-tasks, as ansible-playbook lists them for `playbook` (the site's by default); None
    when neither was asked for."""
    from provision import apply as apply_mod

    if args.list_hosts:
        return _list_hosts(out, args, inv, scope)
    if not args.list_tasks:
        return None
    listing = apply_mod.list_tasks(opts, inv, playbook or apply_mod.SITE_PLAYBOOK)
    if not args.json:
        out.print(listing, end="", highlight=False, markup=False)
    return Outcome(EXIT_OK, {"tasks": listing})


def _list_hosts(out: Console, args: argparse.Namespace, inv, scope: list[str]) -> Outcome:
    """--list-hosts: the hosts the run would reach, by group, as ansible-playbook lists them; nothing runs."""
    from provision import inventory

    groups = {
        g: [h for h in scope if g in inv.hosts[h].groups] for g in (inventory.PROXMOX_HOSTS, inventory.GPU_CONTAINERS)
    }
    if not args.json:
        for group, names in groups.items():
            out.print(f"{group} ({len(names)}):", highlight=False)
            for name in names:
                out.print(f"  {name}", highlight=False, markup=False)
    return Outcome(EXIT_OK, {"hosts": groups})


def _checks_hosts(checks) -> dict[str, str]:
    hosts: dict[str, str] = {}
    for check in checks:
        if check.host:
            hosts[check.host] = "failed" if not check.passed or hosts.get(check.host) == "failed" else "passed"
    return hosts


def _cmd_verify(args: argparse.Namespace, out: Console, err: Console) -> Outcome:
    from provision import present, verify

    inv = _load(args, err)
    inv.scope(args.limit)
    verify.user_checks(args.check_dir)  # a --check-dir that is not there stops here, before any host is asked
    if args.after_reboot:
        args.check = False
        _confirm(args, err, what="reboots every host in the inventory")
    report = verify.verify(
        inv,
        junit=args.junit,
        after_reboot=args.after_reboot,
        select=args.checks,
        check_dir=args.check_dir,
        **_run_options(args, err),
    )
    if not args.json:
        present.print_verify(out, report)
    return Outcome(EXIT_OK if report.passed else EXIT_FAILED, report.to_dict(), _checks_hosts(report.checks))


def _cmd_capacity(args: argparse.Namespace, out: Console, err: Console) -> Outcome:
    from provision import present, verify
    from provision.capacity import parse_session_tokens

    sizes = parse_session_tokens(args.session_tokens)
    inv = _load(args, err)
    inv.scope(args.limit)
    report = verify.capacity_report(inv, session_tokens=sizes, **_run_options(args, err))
    if not args.json:
        present.print_capacity_run(out, report)
    result = {"capacity": report.capacity, "checks": [c.__dict__ for c in report.checks]}
    ok = report.passed and report.capacity
    return Outcome(EXIT_OK if ok else EXIT_FAILED, result, _checks_hosts(report.checks))


def _run_options(args: argparse.Namespace, err: Console | None = None) -> dict:
    """What every command that runs playbooks passes to the API the same way: which hosts, where the record goes,
    how hosts and vault are trusted, and (with `err`) where progress shows."""
    options = {"limit": args.limit, "runs_dir": args.runs_dir, "vault": _vault(args)}
    options["host_key_checking"] = args.host_key_checking
    return options | ({"progress": _progress(err)} if err is not None else {})


def _progress(err: Console):
    """What the API says while it runs, on stderr: each playbook's live table, notes and warnings."""
    from provision import present

    return present.ConsoleProgress(err)


def _console(stderr: bool) -> Console:
    # In logs and pipes, don't wrap at 80 columns: one message stays one line.
    stream = sys.stderr if stderr else sys.stdout
    width = None if stream is not None and stream.isatty() else 200
    return (
        Console(stderr=True, soft_wrap=True, width=width)
        if stderr
        else Console(file=output.Stdout(), width=width, soft_wrap=True)
    )


def _cmd_diag(args: argparse.Namespace, out: Console, err: Console) -> Outcome:
    from provision import diag, present

    inv = _load(args, err)
    inv.scope(args.limit)
    report = diag.diag(inv, include_hosts=args.hosts, **_run_options(args, err))
    if not args.json:
        present.print_diag(out, report)
    hosts = {h: str(r.get("verdict", "unknown")) for h, r in report.results.items()}
    return Outcome(EXIT_OK if report.healthy else EXIT_FAILED, report.to_dict(), hosts)


def _cmd_bench(args: argparse.Namespace, out: Console, err: Console) -> Outcome:
    from provision import bench, present

    concurrency = bench.parse_concurrency(args.concurrency)
    inv = _load(args, err)
    inv.scope(args.limit)
    opts = bench.BenchOptions(
        inventory=inv,
        concurrency=concurrency,
        input_len=args.input_len,
        output_len=args.output_len,
        prompts_per_level=args.prompts_per_level,
        baseline=args.baseline,
        threshold=args.threshold,
        through_gateway=args.through_gateway,
        **_run_options(args),
    )
    result = bench.bench(opts, progress=_progress(err))
    if not args.json:
        present.print_bench(out, result)
    data = result.to_dict()
    code = EXIT_REGRESSION if result.regressed else EXIT_OK if result.complete else EXIT_FAILED
    return Outcome(code, data, dict(getattr(result, "host_states", {}) or {}))


def _cmd_lab(args: argparse.Namespace, out: Console, err: Console) -> Outcome:
    from provision import present
    from provision.lab.lab import Lab

    lab = Lab()
    progress = lambda message: err.print(message, highlight=False, markup=False)  # noqa: E731
    if args.lab_command == "up":
        status = lab.up(
            hosts=args.hosts,
            progress=progress,
            cold_boot=args.cold_boot,
            containers=args.containers,
            pve_version=args.pve_version,
            gpu_link=args.gpu_link,
            bare=args.bare,
            nodes=args.nodes,
            gateway=args.gateway,
        )
    elif args.lab_command == "kernel":
        release = lab.install_kernel(args.node, headers=args.headers)
        out.print(
            f"{args.node}: kernel {release} installed{' with its headers' if args.headers else ''}; "
            "the node boots it at its next reboot",
            highlight=False,
            markup=False,
        )
        return Outcome(EXIT_OK, {"node": args.node, "kernel": release, "headers": args.headers})
    elif args.lab_command == "down":
        lab.down(progress=progress)
        return Outcome(EXIT_OK, {"up": False})
    else:
        status = lab.status()
    if not getattr(args, "json", False):
        present.print_lab_status(out, status)
    return Outcome(EXIT_OK if status.get("up") else EXIT_FAILED, status)


COMMANDS = {
    "inventory": _cmd_inventory_check,
    "apply": _cmd_apply,
    "rollback": _cmd_rollback,
    "retire": _cmd_retire,
    "plan": lambda args, out, err: _cmd_apply(args, out, err, plan=True),
    "verify": _cmd_verify,
    "lab": _cmd_lab,
    "capacity": _cmd_capacity,
    "diag": _cmd_diag,
    "bench": _cmd_bench,
}


def envelope(command: str, outcome: Outcome, errors: list[str] | None = None) -> dict[str, Any]:
    """The one JSON shape every command prints with --json (docs/json.md)."""
    return {
        "schema_version": JSON_SCHEMA_VERSION,
        "command": command,
        "ok": outcome.exit_code == EXIT_OK,
        "exit_code": outcome.exit_code,
        "hosts": outcome.hosts,
        "result": outcome.result,
        "errors": errors or [],
    }


def _command_name(argv: list[str]) -> str:
    return next((a for a in argv if a in COMMANDS), "provision")


def _one_line(text: str) -> str:
    """An error is one line: control characters (a host name's newline) shown escaped."""
    return str(text).replace("\r", "\\r").replace("\n", "\\n").replace("\t", " ")


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if sys.stderr is None:  # started with descriptor 2 closed: error lines have nowhere to go
        sys.stderr = open(os.devnull, "w")  # noqa: SIM115 -- for the life of the process
    with _signals_end_the_command() as late, output.envelope_stream("--json" in argv) as stdout:
        try:
            return _main(argv, late, stdout)
        except Signalled as exc:  # in the moment between the command's end and its output
            _stop_children()
            return _finish(argv, stdout, argparse.Namespace(), [_stopped_by(exc)], _signal_outcome(exc))


def _stopped_by(exc: Signalled) -> str:
    return f"stopped by {signal.Signals(exc.signum).name} before any host was changed"


def _signal_outcome(exc: Signalled) -> Outcome:
    return Outcome(EXIT_SIGNAL_BASE + exc.signum)


def _stop_children() -> None:
    """SIGTERM to every process this one started that is still there (an inventory or vault password script that
    Ansible runs while the inventory loads): they end with the command."""
    pending, seen = [str(os.getpid())], set()
    while pending:
        pid = pending.pop()
        for task in Path(f"/proc/{pid}/task").glob("*"):
            with contextlib.suppress(OSError):
                pending += [c for c in (task / "children").read_text().split() if c not in seen]
        if pid != str(os.getpid()) and pid not in seen:
            seen.add(pid)
            with contextlib.suppress(OSError):
                os.kill(int(pid), signal.SIGTERM)


def _after_late_signal(late: list[int], errors: list[str], outcome: Outcome) -> tuple[list[str], Outcome]:
    """A signal that came once a run had begun, but outside its trap (while its record was written, its locks given
    back): the command ended as it would have, and now says so, with 128 + the signal."""
    if not late or outcome.exit_code >= EXIT_SIGNAL_BASE:
        return errors, outcome
    name = signal.Signals(late[0]).name
    line = f"{name} came as the run was ending: it ended, its record is written and its host locks given back"
    return [*errors, line], Outcome(EXIT_SIGNAL_BASE + late[0], outcome.result, outcome.hosts, outcome.errors)


def _main(argv: list[str], late: list[int], stdout: output.Writer | None) -> int:
    out, err = _console(stderr=False), _console(stderr=True)
    errors: list[str] = []
    args = argparse.Namespace()
    try:
        args = build_parser().parse_args(argv)
        outcome = COMMANDS[args.command](args, out, err)
        errors = outcome.errors
    except InventoryError as exc:
        errors, outcome = exc.problems, Outcome(EXIT_USAGE)
        args.secrets = exc.secrets
    except Interrupted as exc:  # the run record is written; the envelope carries its summary
        errors, outcome = [str(exc)], Outcome(exc.exit_code, exc.result, exc.hosts)
    except ProvisionError as exc:
        errors, outcome = [" ".join(str(exc).split("\n"))], Outcome(exc.exit_code)
    except KeyboardInterrupt:  # Ctrl-C outside a run (a run traps it: Interrupted)
        _stop_children()
        errors, outcome = ["interrupted"], Outcome(EXIT_SIGNAL_BASE + signal.SIGINT)
    except Signalled as exc:  # SIGTERM or SIGHUP outside a run
        _stop_children()
        errors, outcome = [_stopped_by(exc)], _signal_outcome(exc)
    except (BrokenPipeError, output.StdoutLost) as exc:  # stdout's reader went away, or its file is full: say so
        errors, outcome = [output.lost("the output", output.cause(exc))], Outcome(EXIT_FAILED)
        output.gone()
    except Exception as exc:  # a bug: still one line (and the envelope); the traceback on request
        unreadable = _ansible_config_error(exc)  # an ansible.cfg Ansible cannot read: the user's to fix, named
        if unreadable:
            return _finish(argv, stdout, args, [unreadable], Outcome(EXIT_USAGE))
        if os.environ.get("PROVISION_DEBUG"):
            raise
        detail = f"{type(exc).__name__}: {exc}"
        errors = [f"internal error: {detail} (PROVISION_DEBUG=1 shows the traceback)"]
        outcome = Outcome(EXIT_FAILED)
    return _finish(argv, stdout, args, *_after_late_signal(late, errors, outcome))


@contextlib.contextmanager
def _signals_end_the_command() -> Iterator[list[int]]:
    """SIGINT, SIGTERM and SIGHUP before any run end the command at once (KeyboardInterrupt, Signalled), so that it
    still prints its line and envelope and exits 128 + the signal's number. Once a run has begun, its own trap takes
    them while it runs; one that comes outside the trap (the run's record being written, its locks given back) is
    only noted in the yielded list, so that nothing of that clean-up is cut short. The handlers the caller had are
    back afterwards (main() also runs inside other Python programs and tests)."""
    late: list[int] = []
    if threading.current_thread() is not threading.main_thread():
        yield late
        return
    from provision import interrupts

    before = interrupts.traps_entered

    def handler(signum: int, frame: object) -> None:
        if interrupts.traps_entered > before:
            late.append(signum)
        elif signum == signal.SIGINT:
            raise KeyboardInterrupt
        else:
            raise Signalled(signum)

    previous = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
    for signum in previous:
        signal.signal(signum, handler)
    try:
        yield late
    finally:
        for signum, handler_before in previous.items():
            signal.signal(signum, handler_before)


def _finish(
    argv: list[str], stdout: output.Writer | None, args: argparse.Namespace, errors: list[str], outcome: Outcome
) -> int:
    """The error lines on stderr and, with --json, the one envelope on `stdout` (the real one: `output.py`). A
    stdout closed by its reader ends the output there, with the command's own exit code; one that cannot take it (a
    full disk) fails the command. A signal that comes while they are written is let go: the command is ending with
    its own code, and half an envelope would be no JSON at all."""
    if threading.current_thread() is threading.main_thread():
        for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            signal.signal(signum, signal.SIG_IGN)
    # the environment's secrets, and what the inventory's load found (also when it failed)
    redactor = secrets.Redactor(secrets.values() | set(getattr(args, "secrets", ())))
    errors = [redactor.text(_one_line(line)) for line in errors]
    for line in errors:
        print(f"error: {line}", file=sys.stderr)
    if stdout is None:
        return outcome.exit_code
    data = redactor.obj(envelope(_command_name(argv), outcome, errors))
    try:
        stdout.write(json.dumps(data, indent=2, default=str) + "\n")
        stdout.flush()
    except (OSError, output.StdoutLost) as exc:  # its reader went away (EPIPE), or its file is full (ENOSPC)
        error = output.cause(exc)
        print(f"error: {output.lost('the JSON envelope', error)}", file=sys.stderr)
        output.gone(getattr(stdout, "fd", 1))
        if error.errno != errno.EPIPE and outcome.exit_code == EXIT_OK:
            return EXIT_FAILED  # the file a script reads the result from is empty
    return outcome.exit_code


def _ansible_config_error(exc: Exception) -> str | None:
    """One line for an ansible.cfg that Ansible cannot read, or a setting of it or of the environment that Ansible
    refuses (each names the file, or the variable, and the key), else None."""
    from ansible.errors import AnsibleOptionsError

    from provision import ansible_config

    if not isinstance(exc, AnsibleOptionsError):
        return None
    text = " ".join(str(exc).split())
    if "config file" in text:
        return f"Ansible cannot read its configuration: {text}"
    return ansible_config.refused_setting(text)


if __name__ == "__main__":
    sys.exit(main())
