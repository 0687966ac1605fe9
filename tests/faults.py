"""The fault matrix (issue #16): one row per injected fault, each naming the test that injects it.

docs/reliability.md is this table rendered (`table()`) with its counts (`counts()`);
tests/unit/test_reliability_doc.py checks that the document matches and that every row's test exists.
The fast rows come from their test modules (each builds its rows from the table it is parametrised by);
the rows below cite tests that need sshd targets or the lab.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Row:
    fault: str
    phase: str
    sees: str  # what the user sees: the test checks this text in the failure message, or that the run succeeds
    after: str  # the host's state after the faulty run, as the test checks it
    converges: str  # what a re-run with the fault gone does, as the test shows it
    test: str  # pytest node id
    clear: bool  # the run survived: it succeeded, or failed with one clear line the test checks
    converged: bool  # the test shows a re-run (or the same run) converging


SSH = "tests/test_apply_ssh.py::"
LAB_KERNEL = "tests/lab/test_b_kernel.py::"
LAB_GPU = "tests/lab/test_c_gpu.py::"

CITED = [
    Row("SIGINT while a host runs a task (sshd targets, verify phase)", "verify",
        "`error: interrupted by SIGINT: run record …`, exit 130; the record names each host's last task and what "
        "it leaves", "no process of the run left; host locks given back", "yes: `apply --full` succeeds",
        SSH + "test_sigint_stops_every_process_records_where_each_host_stopped_and_a_rerun_converges", True, True),
    Row("SIGTERM while a host runs a task, with a second apply started meanwhile", "verify",
        "the second apply: one `error:` line naming the run, pid and controller holding the inventory; the "
        "first: exit 143, record `interrupted`", "no process of the run left; host locks given back", "not shown",
        SSH + "test_a_second_apply_is_refused_while_the_first_holds_the_inventory_and_sigterm_stops_the_first",
        True, False),
    Row("a host unreachable over ssh", "all", "the host `unreachable` in the summary and in `verify`; exit 1",
        "the other hosts finish", "not shown",
        SSH + "test_unreachable_host_fails_run_but_others_finish", True, False),
    Row("a host lock held by another controller's run", "all",
        "`error: node1: host lock held by run … : wait for that run to end, or pass --break-lock if it is gone`",
        "the other run's lock untouched; the other hosts' locks given back", "yes, with `--break-lock`",
        SSH + "test_a_host_lock_held_by_another_controller_stops_its_host_until_break_lock", True, True),
    Row("a node frozen during its reboot (qemu `stop`)", "kernel", "the frozen node failed or unreachable; exit 1",
        "the other node not rebooted and its line not applied", "not shown",
        LAB_KERNEL + "test_a_host_that_does_not_come_back_stops_the_rollout", True, False),
    Row("a GRUB snippet that makes grub-mkconfig fail", "kernel",
        "`the new boot configuration was refused (…); the previous files were restored from … the host was not "
        "rebooted`", "grub.cfg, /etc/default/grub and the marker as before; no reboot", "not shown",
        LAB_KERNEL + "test_failed_generation_restores_the_old_config_and_does_not_reboot", True, False),
    Row("the PVE API port closed", "gpu", "`… keeps failing …`; exit 1", "config unchanged", "not shown",
        LAB_GPU + "test_api_that_is_down_gets_a_clear_error", True, False),
    Row("an API certificate from another CA", "gpu",
        "`TLS verification of https://… failed …: set proxmox_api_ca_file …`", "config unchanged", "not shown",
        LAB_GPU + "test_wrong_ca_is_a_clear_tls_error", True, False),
]  # fmt: skip


def rows() -> list[Row]:
    """Every row: the fast tests' own, then the cited ones."""
    from tests.unit.test_kernel_cmdline_faults import FAULT_ROWS as kernel
    from tests.unit.test_proxmox_lxc_gpu_faults import FAULT_ROWS as api

    return [*api, *kernel, *CITED]


def counts(table: list[Row]) -> dict[str, int]:
    return {
        "faults injected": len(table),
        "survived with a clear message": sum(r.clear for r in table),
        "re-runs that converged": sum(r.converged for r in table),
    }


def table(table: list[Row]) -> str:
    """The Markdown table of docs/reliability.md."""
    lines = ["| # | fault | phase | what the user sees | host state after | re-run converges? | test |",
             "|---|---|---|---|---|---|---|"]  # fmt: skip
    for n, r in enumerate(table, 1):
        cells = [str(n), r.fault, r.phase, r.sees, r.after, r.converges, f"`{r.test}`"]
        lines.append("| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")
    return "\n".join(lines) + "\n"
