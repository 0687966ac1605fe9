"""Command line: parses flags, calls the Python API, prints the result. Nothing else.

Exit codes: 0 every host succeeded; 1 a host failed or was unreachable; 2 usage or
inventory error (nothing was contacted); 3 `bench` found a regression against its baseline.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from rich.console import Console

from provision import __version__
from provision.errors import (
    EXIT_FAILED,
    EXIT_OK,
    EXIT_REGRESSION,
    EXIT_USAGE,
    InventoryError,
    ProvisionError,
    UsageError,
)


def _common(p: argparse.ArgumentParser, limit: bool = True) -> None:
    p.add_argument("--inventory", "-i", required=True, help="inventory name (inventory/NAME) or directory")
    if limit:
        p.add_argument("--limit", "-l", help="Ansible host pattern to restrict the run to")
    p.add_argument("--json", action="store_true", help="print a machine-readable summary on stdout")


def _runs_dir(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--runs-dir",
        type=Path,
        default=Path(os.environ.get("PROVISION_RUNS_DIR", ".provision/runs")),
        help="where run records go (default: $PROVISION_RUNS_DIR or .provision/runs)",
    )


def _ansible_opts(p: argparse.ArgumentParser) -> None:
    p.add_argument("--vault-password-file", type=Path, help="passed to ansible-playbook")
    p.add_argument(
        "--no-host-key-checking",
        dest="host_key_checking",
        action="store_false",
        help="DANGEROUS: accept any ssh host key (checking is on by default)",
    )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="provision",
        description="Take a Proxmox VE GPU host to a verified SGLang endpoint.",
    )
    parser.add_argument("--version", action="version", version=f"provision {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p = sub.add_parser("apply", help="converge hosts: kernel args, GPU passthrough, SGLang service")
    _common(p)
    p.add_argument("--tags", "-t", help="comma-separated phases: kernel,gpu,sglang,verify")
    p.add_argument("--check", action="store_true", help="report what would change without changing it")
    p.add_argument("--diff", action="store_true", help="show file and config differences")
    p.add_argument("--reboot", choices=("auto", "never"), help="reboot hosts whose kernel args changed")
    p.add_argument("--yes", "-y", action="store_true", help="do not ask for confirmation")
    _full(p)
    _runs_dir(p)
    _ansible_opts(p)

    p = sub.add_parser("rollback", help="restore the previous kernel command line of nodes and reboot them")
    _common(p)
    p.add_argument("--reboot", choices=("auto", "never"), help="reboot the nodes whose command line was restored")
    p.add_argument("--yes", "-y", action="store_true", help="do not ask for confirmation")
    p.set_defaults(check=False, diff=False, tags=None)
    _runs_dir(p)
    _ansible_opts(p)

    p = sub.add_parser("plan", help="apply in --check --diff mode and summarise what would change")
    _common(p)
    p.add_argument("--tags", "-t", help="comma-separated phases: kernel,gpu,sglang,verify")
    _full(p)
    _runs_dir(p)
    _ansible_opts(p)

    p = sub.add_parser("verify", help="prove the deployment with testinfra checks")
    _common(p)
    p.add_argument("--junit", type=Path, help="write JUnit XML here")
    p.add_argument("--checks", help="only the checks matching this pytest -k expression (e.g. 'smoke or health')")
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
        "--prompts-per-level", type=int, default=10, metavar="K",
        help="each level sends K x its concurrency prompts (default 10)",
    )  # fmt: skip
    p.add_argument("--baseline", type=Path, help="baseline JSON to compare with (e.g. docs/baselines/scenario.json)")
    p.add_argument(
        "--threshold", type=float, default=0.10,
        help="a throughput drop or p99 TTFT rise beyond this fraction is a regression (default 0.10)",
    )  # fmt: skip
    _runs_dir(p)

    p = sub.add_parser("lab", help="the test lab: VMs, a container and a Proxmox API on this machine")
    lab_sub = p.add_subparsers(dest="lab_command", required=True, metavar="SUBCOMMAND")
    c = lab_sub.add_parser("up", help="build (or reuse) the image, boot the lab, write inventory/lab/")
    c.add_argument("--hosts", type=int, default=2, help="lab PVE hosts: 1 = GRUB, 2 = + systemd-boot (default 2)")
    c.add_argument(
        "--containers", type=int, default=1, help="SGLang containers (nspawn), for fleet timings (default 1)"
    )
    c.add_argument(
        "--cold-boot", action="store_true",
        help="boot the VMs from their disks instead of resuming their booted snapshots (and save none)",
    )  # fmt: skip
    c.add_argument(
        "--pve-version", type=int, choices=(8, 9), default=9,
        help="the Proxmox VE the API behaves as: 8 keeps every devN change pending until the CT restarts (default 9)",
    )  # fmt: skip
    c.add_argument(
        "--gpu-link", choices=("pcie", "nvlink"), default="pcie",
        help="the link nvidia-smi topo -m reports between the fake GPUs: PHB (PCIe) or NV18 (default pcie)",
    )  # fmt: skip
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
    if not sys.stdin.isatty():
        raise ProvisionError(f"{args.command} {what}: pass --yes to confirm (no terminal to ask)")
    answer = console.input(
        f"Apply to inventory {args.inventory!r}{' limit ' + args.limit if args.limit else ''}? [y/N] "
    )
    if answer.strip().lower() not in ("y", "yes"):
        raise ProvisionError("aborted: nothing was changed")


def _cmd_inventory_check(args: argparse.Namespace, out: Console, err: Console) -> int:
    from provision import inventory

    inv = inventory.load(args.inventory)
    for warning in inv.warnings:
        print(f"warning: {warning}", file=sys.stderr)
    report = {
        "inventory": str(inv.path),
        "valid": True,
        "proxmox_hosts": [h.name for h in inv.proxmox_hosts],
        "gpu_containers": [h.name for h in inv.gpu_containers],
        "warnings": inv.warnings,
    }
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        out.print(
            f"{inv.path}: ok ({len(inv.proxmox_hosts)} proxmox_hosts, {len(inv.gpu_containers)} gpu_containers)",
            highlight=False,
        )
    return EXIT_OK


def _cmd_rollback(args: argparse.Namespace, out: Console, err: Console) -> int:
    from provision import apply as apply_mod
    from provision import inventory

    if not args.limit:
        raise UsageError("rollback needs --limit HOST: roll back the nodes you mean, by name or pattern")
    opts = apply_mod.ApplyOptions(
        inventory=args.inventory,
        limit=args.limit,
        reboot=args.reboot,
        runs_dir=args.runs_dir,
        host_key_checking=args.host_key_checking,
        vault_password_file=args.vault_password_file,
    )
    inventory.load(opts.inventory)
    _confirm(args, err)
    result = apply_mod.apply(opts, console=err, kind="rollback", playbook=apply_mod.ROLLBACK_PLAYBOOK)
    if args.json:
        print(json.dumps(result.to_dict(), indent=2, default=str))
    else:
        apply_mod.print_result(out, result, "rollback")
    return EXIT_OK if result.succeeded else EXIT_FAILED


def _full(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--full", action="store_true", help="run every phase's tasks, even where inputs and watched state are unchanged"
    )


def _cmd_apply(args: argparse.Namespace, out: Console, err: Console, plan: bool = False) -> int:
    from provision import apply as apply_mod
    from provision import inventory

    opts = apply_mod.ApplyOptions(
        inventory=args.inventory,
        limit=args.limit,
        tags=apply_mod.parse_tags(args.tags),
        check=plan or args.check,
        diff=plan or args.diff,
        reboot=None if plan else args.reboot,
        runs_dir=args.runs_dir,
        host_key_checking=args.host_key_checking,
        vault_password_file=args.vault_password_file,
        full=getattr(args, "full", False),
    )
    inventory.load(opts.inventory)  # validate before asking anything
    if not plan:
        _confirm(args, err)
    result = apply_mod.apply(opts, console=err, kind="plan" if plan else "apply")
    if args.json:
        data = result.to_dict()
        if plan:
            data["would_change"] = apply_mod.plan_summary(result)
        print(json.dumps(data, indent=2, default=str))
    else:
        apply_mod.print_result(out, result, "plan (check mode: nothing was changed)" if plan else "apply")
        if plan:
            for host, tasks in sorted(apply_mod.plan_summary(result).items()):
                out.print(
                    f"{host}: {len(tasks)} change(s) pending" if tasks else f"{host}: up to date", highlight=False
                )
                for task in tasks:
                    out.print(f"  ~ {task}", highlight=False, markup=False)
    return EXIT_OK if result.succeeded else EXIT_FAILED


def _cmd_verify(args: argparse.Namespace, out: Console, err: Console) -> int:
    from provision import inventory, verify

    inventory.load(args.inventory)
    if args.after_reboot:
        args.check = False
        _confirm(args, err, what="reboots every host in the inventory")
    report = verify.verify(
        args.inventory,
        limit=args.limit,
        junit=args.junit,
        runs_dir=args.runs_dir,
        after_reboot=args.after_reboot,
        select=args.checks,
    )
    if args.json:
        print(json.dumps(report.to_dict(), indent=2))
    else:
        verify.print_report(out, report)
    return EXIT_OK if report.passed else EXIT_FAILED


def _cmd_capacity(args: argparse.Namespace, out: Console, err: Console) -> int:
    from provision import verify

    report = verify.verify(
        args.inventory, limit=args.limit, runs_dir=args.runs_dir, select="test_capacity_report",
        session_tokens=args.session_tokens,
    )  # fmt: skip
    if args.json:
        print(json.dumps({"capacity": report.capacity, "checks": [c.__dict__ for c in report.checks]}, indent=2))
    else:
        verify.print_capacity(out, report)
        for check in report.checks:
            if not check.passed:
                out.print(f"[red]{check.host}[/]: {check.reason}", highlight=False)
    return EXIT_OK if report.passed and report.capacity else EXIT_FAILED


def _console(stderr: bool) -> Console:
    # In logs and pipes, don't wrap at 80 columns: one message stays one line.
    stream = sys.stderr if stderr else sys.stdout
    return Console(stderr=stderr, soft_wrap=True, width=None if stream.isatty() else 200)


def _cmd_diag(args: argparse.Namespace, out: Console, err: Console) -> int:
    from provision import diag

    report = diag.diag(args.inventory, limit=args.limit, include_hosts=args.hosts, runs_dir=args.runs_dir, console=err)
    if args.json:
        print(json.dumps(report.to_dict(), indent=2))
    else:
        diag.print_report(out, report)
    return EXIT_OK if report.healthy else EXIT_FAILED


def _cmd_bench(args: argparse.Namespace, out: Console, err: Console) -> int:
    from provision import bench

    opts = bench.BenchOptions(
        inventory=args.inventory,
        concurrency=bench.parse_concurrency(args.concurrency),
        input_len=args.input_len,
        output_len=args.output_len,
        prompts_per_level=args.prompts_per_level,
        baseline=args.baseline,
        threshold=args.threshold,
        limit=args.limit,
        runs_dir=args.runs_dir,
    )
    result = bench.bench(opts, console=err)
    if args.json:
        print(json.dumps(result.to_dict(), indent=2, default=str))
    else:
        bench.print_result(out, result)
    if result.regressed:
        return EXIT_REGRESSION
    return EXIT_OK if result.complete else EXIT_FAILED


def _cmd_lab(args: argparse.Namespace, out: Console, err: Console) -> int:
    from provision.lab.lab import Lab

    lab = Lab()
    progress = lambda message: err.print(message, highlight=False, markup=False)  # noqa: E731
    if args.lab_command == "up":
        status = lab.up(hosts=args.hosts, progress=progress, cold_boot=args.cold_boot, containers=args.containers,
                        pve_version=args.pve_version, gpu_link=args.gpu_link)  # fmt: skip
    elif args.lab_command == "down":
        lab.down(progress=progress)
        return EXIT_OK
    else:
        status = lab.status()
    if getattr(args, "json", False):
        print(json.dumps(status, indent=2))
    else:
        out.print_json(json.dumps(status))
    return EXIT_OK if status.get("up") else EXIT_FAILED


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    out, err = _console(stderr=False), _console(stderr=True)
    try:
        if args.command == "inventory":
            return _cmd_inventory_check(args, out, err)
        if args.command == "apply":
            return _cmd_apply(args, out, err)
        if args.command == "rollback":
            return _cmd_rollback(args, out, err)
        if args.command == "plan":
            return _cmd_apply(args, out, err, plan=True)
        if args.command == "verify":
            return _cmd_verify(args, out, err)
        if args.command == "lab":
            return _cmd_lab(args, out, err)
        if args.command == "capacity":
            return _cmd_capacity(args, out, err)
        if args.command == "diag":
            return _cmd_diag(args, out, err)
        if args.command == "bench":
            return _cmd_bench(args, out, err)
    except InventoryError as exc:
        for line in exc.problems:
            print(f"error: {line}", file=sys.stderr)
        return EXIT_USAGE
    except ProvisionError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        err.print("interrupted", highlight=False)
        return EXIT_FAILED
    parser.error(f"unknown command {args.command}")
    return EXIT_USAGE


if __name__ == "__main__":
    sys.exit(main())
