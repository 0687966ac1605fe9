"""`provision apply` and `provision plan`: converge hosts by running the site playbook."""

from __future__ import annotations

import itertools
import signal
from contextlib import AbstractContextManager, ExitStack, nullcontext
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from provision import interrupts, locks
from provision import inventory as inventory_mod
from provision.errors import Interrupted, ProvisionError, UsageError
from provision.paths import module_util
from provision.progress import SILENT, Progress
from provision.record import DEFAULT_RUNS_DIR, SUMMARY, RunRecord
from provision.runner import PlaybookConfig, RunResult, UserOptions, base_extravars, playbook_tasks, run_playbook

PHASES = module_util("provision_phases").PHASES
PART_TAGS = module_util("provision_phases").PART_TAGS
SITE_PLAYBOOK = "site.yml"
ROLLBACK_PLAYBOOK = "rollback.yml"
RETIRE_PLAYBOOK = "retire.yml"
RETIRE_PHASES = ("gpu", "kernel")  # what a retire undoes of them needs what they need of the inventory to reach it
UNLOCK_PLAYBOOK = "unlock.yml"
RENEW_PLAYBOOK = "renew.yml"
HOST_LOCK_LEFT = (
    "this run's host lock is left there: the next run from this controller takes it over; "
    "others wait for its lease or pass --break-lock"
)


@dataclass
class ApplyOptions:
    inventory: str | inventory_mod.Inventory  # a name or path, or the inventory the CLI loaded (inventory.loaded)
    limit: str | None = None
    tags: list[str] = field(default_factory=list)
    check: bool = False
    diff: bool = False
    reboot: str | None = None  # auto | never; None leaves the inventory's choice
    runs_dir: Path = DEFAULT_RUNS_DIR
    host_key_checking: bool = True
    vault: inventory_mod.VaultOptions = field(default_factory=inventory_mod.VaultOptions)
    full: bool = False  # run every phase's tasks, even where its recorded fingerprint still holds
    break_lock: bool = False  # take a host lock another controller's run holds (never a live run of this one)
    user: UserOptions = field(default_factory=UserOptions)  # --extra-vars, --skip-tags, -v: ansible-playbook's own
    retire_weights: bool = False  # provision retire --weights: remove a Hugging Face download of the weights too


def parse_tags(text: str | None, flag: str = "--tags") -> list[str]:
    """The phases --tags (or --skip-tags) names, and for --tags the parts of a phase (PART_TAGS); none given: none.
    A blank one is refused: --tags would run every phase, and --skip-tags leave none out. A part is never skipped
    alone: the phase would then be recorded as converged without it."""
    if text is None:
        return []
    tags = [t.strip() for t in text.split(",") if t.strip()]
    if not tags:
        phases = ", ".join(PHASES)
        does = "would run every phase" if flag == "--tags" else "leaves no phase out"
        raise UsageError(f"{flag} is empty: it {does}; name phases ({phases}) or leave it out")
    parts = list(PART_TAGS) if flag == "--tags" else []
    unknown = [t for t in tags if t not in (*PHASES, *parts)]
    if unknown:
        choose = ", ".join(PHASES) + (f"; or parts of one: {', '.join(parts)}" if parts else "")
        raise UsageError(f"{flag}: unknown phase(s) {', '.join(unknown)}; choose from {choose}")
    return tags


def tagged_phases(tags: list[str], skip_tags: tuple[str, ...] = ()) -> list[str]:
    """The phases a run with these --tags (and --skip-tags) runs (a part's is its phase), in order; no tags: every
    phase. The rule is the one the playbooks' stale groups follow (provision_phases.selected)."""
    return module_util("provision_phases").selected(tags, skip_tags)


def user_extra_problems(inv, opts: ApplyOptions) -> list[str]:
    """--extra-vars that would replace what provision sets itself for the run (its own facts, the host lock's
    request, --reboot and --full) or a role's internal variable (a leading underscore): refused, naming them."""
    own = {*base_extravars(), *_extravars(opts), "provision_lock"}
    given = next(iter(inv.hosts.values())).extra if inv.hosts else frozenset()
    clash = sorted(n for n in given if n in own or n.startswith("_"))
    return [f"--extra-vars {n}: provision sets it itself for this run (or a role keeps it to itself)" for n in clash]


def _extravars(opts: ApplyOptions) -> dict[str, Any]:
    extra: dict[str, Any] = {}
    if opts.reboot is not None:
        if opts.reboot not in ("auto", "never"):
            raise UsageError(f"--reboot: expected auto or never, got {opts.reboot!r}")
        extra["kernel_cmdline_reboot"] = opts.reboot
        # the driver phase's own reboot, and a serving container restarted for a pending devN or nesting change, are
        # reboots too: never is never, whatever the inventory sets for them
        extra["nvidia_driver_reboot"] = opts.reboot
        extra["gpu_passthrough_restart"] = opts.reboot
    if opts.full:
        extra["provision_state_skip"] = False
    if opts.retire_weights:
        extra["sglang_retire_weights"] = True
    return extra


def retire_problems(inv, scope: list[str]) -> list[str]:
    """What `provision retire` refuses in its scope, one line each: a host that is neither a container nor a node
    (a gateway is not retired), and a node whose kernel arguments would come off while a container of the inventory
    that runs on it, outside the scope, still serves with them."""
    problems = []
    containers = {h.name for h in inv.gpu_containers}
    nodes = {h.name for h in inv.proxmox_hosts}
    for name in scope:
        if name not in containers | nodes:
            problems.append(f"retire: {name} is in neither gpu_containers nor proxmox_hosts: leave it out of --limit")
    for node in sorted(nodes.intersection(scope)):
        serving = [c.name for c in inv.gpu_containers if c.value("proxmox_host") == node and c.name not in scope]
        if serving:
            problems.append(
                f"retire: node {node} runs {', '.join(serving)} of the inventory, outside --limit: retire "
                f"{'them' if len(serving) > 1 else 'it'} with the node, or leave the node out"
            )
    return problems


def apply(
    opts: ApplyOptions, progress: Progress | None = None, kind: str = "apply", playbook: str = SITE_PLAYBOOK
) -> RunResult:
    """Validate the inventory, take the inventory's lock and each host's (not in check mode), run the playbook
    (site.yml), give the host locks back, write the run record and return the result.

    Raises LockHeld when another run holds the inventory, and Interrupted, once the record is written, when
    SIGINT or SIGTERM stopped the run. `progress` hears the run as it goes (silent when left out)."""
    inv = inventory_mod.loaded(opts.inventory, opts.vault, opts.host_key_checking, opts.user.extra_vars)
    clashes = user_extra_problems(inv, opts)
    if clashes:
        raise UsageError("; ".join(clashes))
    scope = inv.scope(opts.limit)
    lock_set = None if opts.check else locks.LockSet.of(inv, scope)
    with RunRecord(opts.runs_dir, kind, inv) as record, ExitStack() as stack:
        held = lock_set and _lock(stack, opts, inv, record, kind, lock_set)
        return _converge(opts, inv, scope, record, progress or SILENT, kind, playbook, held)


def _lock(stack: ExitStack, opts: ApplyOptions, inv, record: RunRecord, kind: str, lock_set: locks.LockSet):
    """Hold the inventory's controller lock for the rest of the stack; the lock set with the run's host lock
    request."""
    holder = locks.Holder.for_run(record.name, f"provision {kind} --inventory {opts.inventory}")
    try:
        stack.enter_context(locks.controller_lock(inv.path, holder))
    except ProvisionError:
        record.discard()  # nothing ran: no record
        raise
    return replace(lock_set, request=locks.host_lock_request(holder, opts.break_lock))


def _converge(opts, inv, scope, record: RunRecord, progress: Progress, kind, playbook, held) -> RunResult:
    """Run the playbook (renewing the leases of the run's host locks, `held`, meanwhile), give back the host locks
    it left, and write the record."""
    extravars = {**_extravars(opts), **({"provision_lock": held.request} if held else {})}
    with _renewal(opts, inv, record, held) as renewal:
        result = run_playbook(
            playbook,
            inv.path,
            record=record,
            host_count=len(inv.hosts),
            limit=opts.limit,
            tags=opts.tags,
            check=opts.check,
            diff=opts.diff,
            extravars=extravars,
            host_key_checking=opts.host_key_checking,
            vault=opts.vault,
            raise_interrupt=False,
            user=opts.user,
            progress=progress.playbook(f"provision {kind} --inventory {opts.inventory}"),
        )
    result.host_states = host_states(result, scope)
    summary = {"command": kind, "inventory": str(inv.path), "limit": opts.limit, "tags": opts.tags, **result.to_dict()}
    if held:
        for error in dict.fromkeys(renewal.errors):
            progress.warning(f"renewing the leases of the run's host locks failed: {record.redact(error)}")
        summary["host_locks_left"] = _release_left(opts, inv, record, held)
        for host in summary["host_locks_left"]:
            progress.warning(f"{host}: {HOST_LOCK_LEFT}")
    if result.interrupted:
        summary["stopped_at"] = stopped_at(result)
    record.write_summary(summary)
    if result.interrupted:
        message = f"interrupted by {result.interrupted}: run record {record.path} (where each host stopped: {SUMMARY})"
        raise Interrupted(message, signal.Signals[result.interrupted], record.redact(summary), result.host_states)
    return result


def _renewal(opts: ApplyOptions, inv, record: RunRecord, held: locks.LockSet | None) -> AbstractContextManager:
    """While the run lasts, renew the leases of its host locks (locks.LeaseRenewal): renew.yml on the lock set,
    each turn kept in the record under renew/<n>/."""
    if not held:
        return nullcontext()
    turns = itertools.count(1)

    def renew(stop) -> None:
        run_playbook(
            RENEW_PLAYBOOK,
            inv.path,
            record=record.child("renew").child(str(next(turns))),
            host_count=len(held.hosts),
            limit=",".join(held.hosts),
            extravars={"provision_lock": held.request},
            host_key_checking=opts.host_key_checking,
            vault=opts.vault,
            raise_interrupt=False,
            cancel=stop.is_set,
        )

    return locks.LeaseRenewal(renew, held.period_s)


def _release_left(opts: ApplyOptions, inv, record: RunRecord, held: locks.LockSet) -> list[str]:
    """Give back the host locks that the run's last play did not (a failed host, a playbook Ansible stopped, a
    signal): unlock.yml again, on those hosts alone (a container's node by its own name). Returns the hosts still
    locked."""
    left = locks.left_locked(record.path, held.nodes)
    if not left:
        return []
    again = record.child("unlock")
    run_playbook(
        UNLOCK_PLAYBOOK,
        inv.path,
        record=again,
        host_count=len(left),
        limit=",".join(left),
        extravars={"provision_lock": held.request},
        host_key_checking=opts.host_key_checking,
        vault=opts.vault,
        raise_interrupt=False,
    )
    return sorted(set(left) - locks.released(again.path, held.nodes))


def list_tasks(opts: ApplyOptions, inv, playbook: str = SITE_PLAYBOOK) -> str:
    """--list-tasks: ansible-playbook's own listing of the plays and tasks of the run these options make."""
    config = PlaybookConfig(
        playbook,
        inv.path,
        len(inv.hosts),
        opts.limit,
        opts.tags,
        opts.check,
        opts.diff,
        _extravars(opts),
        opts.host_key_checking,
        opts.vault,
        opts.user,
    )
    return playbook_tasks(config)


def stopped_at(result: RunResult) -> dict[str, dict[str, Any]]:
    """Per host, the last task that started, whether it finished, and what that leaves on the host."""
    return {
        host: {**last, "leaves": interrupts.left_behind(last["task"], last["role"], last["finished"])}
        for host, last in sorted(result.last_tasks.items())
    }


def host_states(result: RunResult, scope: list[str]) -> dict[str, str]:
    """Per host the run was meant for: unreachable, failed, interrupted (a signal stopped the run), not reached
    (no play ran for it, or Ansible stopped before its turn, or the run ended in error with no host to blame),
    changed (changes pending, in check mode) or ok (up to date)."""
    blamed = any(s.failed or s.unreachable for s in result.hosts.values())
    broken = (result.rc != 0 or result.status != "successful") and not blamed
    return {host: _host_state(result, host, broken) for host in scope}


def _host_state(result: RunResult, host: str, broken: bool) -> str:
    """One host's state in host_states; `broken`: the run ended in error with no host to blame."""
    stats = result.hosts.get(host)
    if stats is not None and stats.unreachable:
        return "unreachable"
    if stats is not None and stats.failed:
        return "failed"
    if result.interrupted:
        return "interrupted"
    if stats is None or broken or (result.aborted and host not in result.last_play_hosts):
        return "not reached"
    if stats.changed:
        return "changes pending" if result.check else "changed"
    return "up to date" if result.check else "ok"
