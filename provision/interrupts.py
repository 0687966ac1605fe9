"""SIGINT and SIGTERM during a run: stop every process of the run, and say what each host was left in.

ansible-runner starts ansible-playbook through pexpect, on a pty of its own: it leads its own session, so the
terminal's Ctrl-C never reaches it, and runner's own cancel SIGKILLs that one process group only. Mitogen's ssh
processes on a pty and ssh's ControlPersist masters start sessions of their own too, and outlive it.

So runner.run_playbook traps both signals while runner runs (`SignalTrap`) and gives runner its
`cancel_callback`: once a signal came, the callback stops the run (`stop_run`): TERM to every process group that
holds a process of the run, up to GRACE_S seconds for them to go, then KILL. A process is the run's when its
environment carries RUN_MARKER=<the run's private data dir>, which every process the run starts inherits, or when
its command line names a path in that directory (an ssh ControlPersist master's title names its socket there, and
its title overwrites its environment). The same sweep after every run ends those masters, which would otherwise
idle on for their timeout.

What each host was left in is read from the last task that started on it: `left_behind`, from LEFT_BY_TASK.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable

from provision.locks import NODE_READ_TASK, NODE_RELEASE_TASK, READ_TASK, RELEASE_TASK
from provision.paths import module_util
from provision.run_processes import GRACE_S, RUN_MARKER, run_processes, stop_run

__all__ = ["GRACE_S", "RUN_MARKER", "SignalTrap", "left_behind", "run_processes", "stop_run"]


# How many traps have been entered in this process: the CLI tells a signal that came before any run (it ends the
# command at once) from one that came once a run had begun (its trap took it, or its clean-up is under way)
traps_entered = 0


class SignalTrap:
    """While entered (in the main thread), SIGINT and SIGTERM are remembered instead of acted on: the first one
    makes `cancel_callback` stop the run. Nested traps restore the outer one's handlers on exit."""

    # SIGHUP too: the operator's ssh session to the controller dropped (exit 129, the run stopped and recorded)
    SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)

    def __init__(self) -> None:
        self.signum: int | None = None
        self._previous: dict[int, object] = {}
        self._stopped = False

    def __enter__(self) -> SignalTrap:
        global traps_entered
        traps_entered += 1
        if threading.current_thread() is threading.main_thread():
            self._previous = {s: signal.signal(s, self._caught) for s in self.SIGNALS}
        return self

    def __exit__(self, *exc: object) -> None:
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)

    def _caught(self, signum: int, frame: object) -> None:
        if self.signum is None:
            self.signum = signum

    @property
    def name(self) -> str:
        return signal.Signals(self.signum).name if self.signum else ""

    def cancel_callback(self, marker: str, stop: Callable[[], bool] | None = None) -> Callable[[], bool]:
        """runner's cancel_callback: once a signal came, or `stop()` says so (the caller's own reason: a lease
        renewal whose run has ended), stop the run's processes (once) and say so."""

        def cancel() -> bool:
            if self.signum is None and not (stop and stop()):
                return False
            if not self._stopped:
                self._stopped = True
                stop_run(marker)
            return True

        return cancel


# roles/sglang/tasks/ready.yml's tasks: every sglang phase checks readiness, after a restart of either kind or none;
# where a rolling restart took the server out of its gateways, it stays out until the next run
_UNTIL_NEXT_RUN = "; where a rolling restart took it out of its gateways, the next run puts it back"
_READINESS_BEING_CHECKED = "SGLang service's readiness being checked" + _UNTIL_NEXT_RUN
_NOT_READY = "SGLang service did not become ready, its journal being read" + _UNTIL_NEXT_RUN

# What a host is left in when the run stops in a task: (while the task ran, once it had finished). One table for
# every phase; a task not named here is described by its phase. Keyed by task name because the task a run stopped
# in returned nothing: its start event, and so its name, is all there is. tests/unit/provision/test_interrupts.py checks
# that every task named here exists.
LEFT_BY_TASK: dict[str, tuple[str, str]] = {
    READ_TASK: (
        "nothing changed; the host lock may be this run's (the next run from this controller takes it over)",
        "nothing changed",
    ),
    "Plan the merge, writing nothing": (
        "nothing changed: the merge of the kernel arguments was being planned in check mode",
        "nothing changed: the merge of the kernel arguments was planned in check mode",
    ),
    "Merge the wanted arguments into the bootloader's kernel command line": (
        "kernel command line (or, for a trial boot, a one-shot entry) being written (a backup is kept), boot config "
        "not regenerated, not rebooted: the next run removes a trial entry left behind",
        "kernel command line (or, for a trial boot, a one-shot entry) written, boot config not regenerated, "
        "not rebooted: the next run removes a trial entry left behind",
    ),
    # also run after a trial boot that passed (its commit): "not rebooted into it" holds before and after that boot
    "Regenerate the boot configuration for this bootloader": (
        "boot config being regenerated, not rebooted into it: run apply again to regenerate it",
        "boot config written, not rebooted into it",
    ),
    "Check that the generated boot configuration carries the new arguments": (
        "boot config written, not checked, not rebooted into it",
        "boot config written, not rebooted into it",
    ),
    "Put the node in HA maintenance mode": (
        "HA maintenance mode being asked for: the node's HA services may be moving away; not rebooted: run apply "
        "again, or take it off (ha-manager crm-command node-maintenance disable <node>)",
        "node in HA maintenance mode, its HA services moving away; not rebooted: run apply again, or take it off "
        "(ha-manager crm-command node-maintenance disable <node>)",
    ),
    "Wait for the HA services to leave the node": (
        "node in HA maintenance mode, its HA services moving away; not rebooted: run apply again, or take it off "
        "(ha-manager crm-command node-maintenance disable <node>)",
        "node in HA maintenance mode, its HA services moved away; not rebooted: run apply again, or take it off "
        "(ha-manager crm-command node-maintenance disable <node>)",
    ),
    "Take the node out of HA maintenance mode": (
        "rebooted; HA maintenance mode being taken off (ha-manager crm-command node-maintenance disable <node>)",
        "rebooted; HA maintenance mode taken off: HA moves the node's services back",
    ),
    "Reboot into the new kernel command line": (
        "reboot under way or done: the node may be booting the new line (once, from its trial entry, where one was "
        "written: its default entry is the old line), its findings not recorded",
        "rebooted into the new line (from its trial entry, where one was written), its findings not recorded",
    ),
    "Remove the trial boot entry of a node that came back on its old line": (
        "back on its old line after the trial boot, the default unchanged; the trial entry being removed",
        "back on its old line after the trial boot, the default unchanged, the trial entry removed",
    ),
    "Write the trial boot's kernel command line into the default boot configuration": (
        "trial boot passed; its line being written as the default (a backup is kept), boot config not regenerated",
        "trial boot passed; its line written as the default, boot config not regenerated",
    ),
    "Check the running kernel's arguments and record this boot's IOMMU and SEV-SNP findings": (
        "rebooted, findings being recorded",
        "rebooted, findings recorded, phase not recorded",
    ),
    "Restore the previous kernel command line from the latest backup": (
        "previous kernel command line being restored, boot config not regenerated, not rebooted",
        "previous kernel command line restored, boot config not regenerated, not rebooted",
    ),
    "Regenerate the boot configuration with the restored line": (
        "boot config being regenerated with the restored line, not rebooted",
        "boot config written with the restored line, not rebooted",
    ),
    "Reboot into the restored kernel command line": (
        "reboot into the restored line under way or done",
        "rebooted into the restored line",
    ),
    "Rebuild the initramfs without nouveau": (
        "nouveau blacklisted, the initramfs being rebuilt (update-initramfs): the next run rebuilds it",
        "nouveau blacklisted, initramfs rebuilt, NVIDIA driver not installed",
    ),
    "Reboot the node": (
        "reboot under way or done (to unload nouveau, or to load the new NVIDIA module); its guests not waited for",
        "rebooted; its onboot guests not waited for",
    ),
    "Run the NVIDIA installer with DKMS": (
        "NVIDIA installer cut short: the node may hold a partial driver install; the next run installs it again",
        "NVIDIA installer ran, its result and module not checked (a reboot may be due to load it); the next run checks",
    ),
    "Pass the GPU device nodes into the container through the Proxmox API": (
        "the container's devN entries being changed through the API: the container may be restarting",
        "devN entries set, NVIDIA userspace not checked",
    ),
    "Run the NVIDIA installer without the kernel module": (
        "NVIDIA userspace install cut short: the container may hold a partial install",
        "NVIDIA userspace installed, not checked",
    ),
    "Install SGLang into its venv": ("SGLang venv partly installed", "SGLang installed, service not configured"),
    "Install the SGLang systemd unit": ("SGLang unit being written", "SGLang unit written, service not restarted"),
    # the sglang role's handler, which its flush_handlers task runs (the meta task itself runs on no host): it notes
    # the restart, which tasks/restart.yml does
    "Restart sglang": (
        "SGLang unit changed, service not restarted yet: the next run restarts it",
        "SGLang unit changed, service not restarted yet: the next run restarts it",
    ),
    "Restart the server at once (no running gateway sends it requests)": (
        "SGLang service restarting",
        "SGLang service restarted, readiness not checked",
    ),
    "Restart the server (it finishes the requests in flight first)": (
        "SGLang service restarting, out of its gateways: the next run puts it back",
        "SGLang service restarted, out of its gateways: the next run puts it back",
    ),
    # roles/sglang/tasks/ready.yml: a rolling restart has the server out of its gateways until the task after these
    # (the mark it left on each gateway's host tells the next run)
    "Read how often systemd has restarted the server so far": (_READINESS_BEING_CHECKED, _READINESS_BEING_CHECKED),
    "Poll SGLang until it is ready, or until it has exited sglang_ready_exits times": (
        _READINESS_BEING_CHECKED,
        "SGLang service ready" + _UNTIL_NEXT_RUN,
    ),
    **dict.fromkeys(
        (
            "Stop when the server kept exiting, or stopped for good",
            "Read the last journal lines of the service, the API key replaced on the host",
            "Stop with the journal tail",
        ),
        (_NOT_READY, _NOT_READY),
    ),
    "Take the servers out of their gateways, and wait until each sends them nothing new": (
        "servers being taken out of their gateways: the next run puts them back",
        "servers out of their gateways, not restarted: the next run puts them back",
    ),
    "Put the servers back into their gateways, and wait until each counts them ready and healthy": (
        "servers being put back into their gateways: the next run puts back any still out",
        "servers back in their gateways, the marks of their leaving not cleared: the next run clears them",
    ),
    "Clear the marks of the servers back in their gateways": (
        "servers back in their gateways, the marks of their leaving being cleared: the next run clears any left",
        "servers back in their gateways",
    ),
    "Record the converged phase in the state directory": (
        "phase done, its record being written: the next run does the phase again",
        "phase done and recorded",
    ),
    RELEASE_TASK: ("run done, host lock being given back", "run done, host lock given back"),
    NODE_READ_TASK: (
        "nothing changed; the host lock of the container's node may be this run's (the next run from this "
        "controller takes it over)",
        "nothing changed",
    ),
    NODE_RELEASE_TASK: (
        "run done, the host lock of the container's node being given back",
        "run done, the host lock of the container's node given back",
    ),
}


def left_behind(task: str, role: str = "", finished: bool = False) -> str:
    """What stopping in (or just after) `task` leaves on a host."""
    if task in LEFT_BY_TASK:
        return LEFT_BY_TASK[task][1 if finished else 0]
    phase = module_util("provision_phases").PHASE_OF_ROLE.get(role.rsplit(".", 1)[-1], "")
    where = f"the {phase} phase" if phase else "the run"
    if finished:
        return f"{where} stopped after {task!r}: run apply again to finish it"
    return f"{where} stopped in {task!r}: run apply again to finish it"
