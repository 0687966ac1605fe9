"""The fault matrix: one row per injected fault, each naming the test that injects it.

docs/reliability.md is this table rendered (`table()`) with its counts (`counts()`);
tests/unit/docs/test_reliability_doc.py checks that the document matches and that every row's test exists.
`python -m tests.faults` writes them into the document again.
The fast rows come from their test modules (each builds its rows from the table it is parametrised by);
the rows below cite tests that need sshd targets or the lab.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from pathlib import Path


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
    kind: str = ""  # the class of fault (rows(): by where it comes from, where the row does not say)


SSH = "tests/test_apply_ssh.py::"
LAB_KERNEL = "tests/lab/test_kernel.py::"
LAB_GPU = "tests/lab/test_gpu.py::"
LAB_SGLANG = "tests/lab/test_sglang.py::"
LAB_GATEWAY = "tests/lab/test_gateway.py::"
NOT_SHOWN = "not shown by this test"

# Each says only what its test asserts.
CITED = [
    Row(
        "SIGINT while both hosts run a task (sshd targets)",
        "verify",
        "`error: interrupted by SIGINT: run record …`, exit 130; the record says per host the last task, that it had "
        "not finished, and what that leaves",
        "no process of the run left; host locks given back",
        "yes: `apply --full` succeeds",
        SSH + "test_sigint_stops_every_process_records_where_each_host_stopped_and_a_rerun_converges",
        True,
        True,
    ),
    Row(
        "a second apply while the first runs, then SIGTERM to the first",
        "verify",
        "the second: exit 1, one `error:` line naming the inventory's lock, the run, its pid and controller; the "
        "first: exit 143, record `interrupted`",
        "no process of the first run left; host locks given back",
        NOT_SHOWN,
        SSH + "test_a_second_apply_is_refused_while_the_first_holds_the_inventory_and_sigterm_stops_the_first",
        True,
        False,
    ),
    Row(
        "ssh connection dropped mid-task (the host's sshd sessions killed)",
        "verify",
        "the host `unreachable` with `Connection to … closed by remote host`; exit 1",
        "the other host finished; the dropped host's lock given back by provision afterwards",
        "yes: `apply --full` succeeds",
        SSH + "test_an_ssh_connection_dropped_mid_task_fails_its_host_only_and_a_rerun_converges",
        True,
        True,
    ),
    Row(
        "a host whose ssh port is closed",
        "all",
        "the host `unreachable` in the summary and failed in `verify`; exit 1",
        "the other hosts ran with no failure",
        NOT_SHOWN,
        SSH + "test_unreachable_host_fails_run_but_others_finish",
        True,
        False,
    ),
    Row(
        "a host lock held by another controller's run",
        "all",
        "`error: node1: host lock held by run … : wait for that run to end, or pass --break-lock if it is gone`",
        "the other run's lock untouched; the other host's lock given back",
        "yes, with `--break-lock`",
        SSH + "test_a_host_lock_held_by_another_controller_stops_its_host_until_break_lock",
        True,
        True,
    ),
    Row(
        "a host lock left by a crashed run of this controller, or past its lease",
        "all",
        "`took over the host lock of a run of this controller that is gone: run …`, or `took the host lock whose "
        "lease had run out, held by run …`",
        "the lock given back at the end",
        "yes, in the same run",
        SSH + "test_a_host_lock_is_taken_over_from_a_gone_run_of_this_controller_or_an_expired_lease",
        True,
        True,
    ),
    Row(
        "a run longer than its hosts' lease (30 s; the run held at a gate past it), and a second run of the same "
        "hosts from another inventory meanwhile",
        "verify",
        "the second: exit 1, `error: <host>: host lock held by run … : wait for that run to end, or pass "
        "--break-lock if it is gone` for each host, naming the first run",
        "the first run's locks renewed (`taken_at` later than when they were taken), given back when it ends",
        "yes: the first run finishes (exit 0)",
        SSH + "test_a_run_longer_than_its_lease_keeps_its_host_locks",
        True,
        True,
    ),
    Row(
        "the host lock of a container's node held by another run, under `apply --limit ct1`",
        "all",
        "`error: ct1: host lock of its node node1 held by run … : wait for that run to end, or pass --break-lock if "
        "it is gone`; `--check` is not stopped (it takes no lock)",
        "the other run's lock untouched; ct1's lock given back; node1's records untouched",
        "yes, with `--break-lock`: node1's lock taken and given back, node1 otherwise untouched; a lock there of a "
        "gone run of this controller is taken over without it",
        SSH + "test_apply_limited_to_a_container_stops_on_its_nodes_host_lock_until_break_lock",
        True,
        True,
    ),
    Row(
        "a run of node1 alone while `apply --limit ct1` runs, then SIGINT to the latter",
        "verify",
        "the run of node1: exit 1, `error: node1: host lock held by run …` naming the `--limit ct1` run; that run: "
        "exit 130, record `interrupted`",
        "no process of the run left; both ct1's and node1's locks given back by provision afterwards",
        NOT_SHOWN,
        SSH + "test_apply_limited_to_a_container_holds_its_nodes_host_lock_and_an_interrupt_gives_it_back",
        True,
        False,
    ),
    Row(
        "an unknown ssh host key",
        "all",
        "the host `unreachable`; `verify` names the host key; exit 1",
        "with the `--no-host-key-checking` opt-out, no unverified key written to any known_hosts file",
        NOT_SHOWN,
        SSH + "test_unknown_host_key_is_refused",
        True,
        False,
    ),
    Row(
        "a node frozen in its trial boot (qemu `stop` once the kernel with the new line prints its command line), "
        "then reset (qemu `system_reset`)",
        "kernel",
        "exit 1; `<node>: the trial boot did not come up on the new line (running: …); the default boot entry is "
        "unchanged (…), trial entry removed; nothing else was changed`",
        "the frozen node back on its old line, its default boot configuration (GRUB files, grub.cfg, "
        "/etc/kernel/cmdline, the ESP's entries) as before and no trial entry left; the other node's boot "
        "configuration untouched and not rebooted",
        "yes: the next run boots each node's trial and makes it the default; no trial entry is left",
        LAB_KERNEL + "test_a_trial_boot_that_hangs_comes_back_on_the_old_line_and_stops_the_rollout",
        True,
        True,
    ),
    Row(
        "a running VM the inventory does not own on the node to reboot (created through the lab's API)",
        "kernel",
        "exit 1, `pve-grub: not rebooting: guests running that the inventory does not own: VM 105 (snp-tenant); …`",
        "not rebooted (same boot id); boot files and change marker as before",
        NOT_SHOWN,
        LAB_KERNEL + "test_a_running_guest_the_inventory_does_not_own_stops_the_reboot",
        True,
        False,
    ),
    Row(
        "an NVIDIA installer whose sha256 is not the inventory's (ansible-playbook on this machine)",
        "gpu",
        "`<host>: <source> has sha256 …, not gpu_passthrough_userspace_installer_sha256 (…); it was removed and not "
        "run`",
        "the installer not run and not left in the downloads directory",
        NOT_SHOWN,
        "tests/unit/roles/gpu_passthrough/test_userspace.py::test_a_wrong_checksum_removes_the_file_and_runs_nothing",
        True,
        False,
    ),
    Row(
        "a file planted where the NVIDIA installer goes (ansible-playbook on this machine)",
        "gpu",
        "the run succeeds",
        "the planted file replaced by the checked installer, which ran from a root-only (0700) "
        "directory; the planted one never ran",
        "yes: the next run finds the userspace current and runs nothing",
        "tests/unit/roles/gpu_passthrough/test_userspace.py::"
        "test_the_checked_installer_runs_from_a_root_only_directory_and_a_planted_one_is_replaced",
        True,
        True,
    ),
    Row(
        "a GRUB snippet that makes grub-mkconfig fail (`kernel_cmdline_trial_boot: off`: before any reboot)",
        "kernel",
        "`the new boot configuration was refused (…); the previous files were restored from … not rebooted`",
        "grub.cfg, /etc/default/grub and the change marker as before; no reboot",
        NOT_SHOWN,
        LAB_KERNEL + "test_failed_generation_restores_the_old_config_and_does_not_reboot",
        True,
        False,
    ),
    Row(
        "an API token, which PVE refuses devN (403)",
        "gpu",
        "`… only root@pam … ticket login …`, no traceback",
        "config unchanged (same digest)",
        NOT_SHOWN,
        LAB_GPU + "test_token_auth_explains_the_root_pam_rule_and_changes_nothing",
        True,
        False,
    ),
    Row(
        "PVE refuses a devN whose path is missing on the node (500 `Device … does not exist`)",
        "gpu",
        "`… /dev/nvidia1 … does not exist on node pve-grub …`, not retried",
        "one PUT, refused",
        NOT_SHOWN,
        LAB_GPU + "test_a_devn_path_missing_on_the_node_is_named",
        True,
        False,
    ),
    Row(
        "the PVE API port closed",
        "gpu",
        "`… keeps failing …`; exit 1",
        "not checked",
        NOT_SHOWN,
        LAB_GPU + "test_api_that_is_down_gets_a_clear_error",
        True,
        False,
    ),
    Row(
        "an API certificate from another CA",
        "gpu",
        "`TLS verification of https://127.0.0.1… failed …: set proxmox_api_ca_file …`",
        "not checked",
        NOT_SHOWN,
        LAB_GPU + "test_wrong_ca_is_a_clear_tls_error",
        True,
        False,
    ),
    Row(
        "SGLang never becomes ready",
        "sglang",
        "`… did not become ready on /health_generate within 15s …` with the journal's tail, the API key redacted",
        "no key in any record",
        NOT_SHOWN,
        LAB_SGLANG + "test_a_server_that_never_becomes_ready_fails_within_the_timeout[env]",
        True,
        False,
    ),
    Row(
        "SIGINT while the first node runs the kernel phase (a reboot due)",
        "kernel",
        "`error: interrupted by SIGINT: run record …`, exit 130; the record `interrupted`, naming the node's last task "
        "(the plan of the merge, not finished) and what it leaves",
        "no process of the run left, no host lock left, neither node rebooted nor its boot configuration changed",
        "yes: the next test's `apply --tags kernel` reboots each node once into the line",
        LAB_KERNEL + "test_sigint_in_the_kernel_phase_leaves_no_process_and_an_interrupted_record",
        True,
        True,
    ),
    Row(
        "SIGINT while the gpu phase's API module writes the devN entries (dropped underneath, the container "
        "rebooted without its nodes)",
        "gpu",
        "`error: interrupted by SIGINT: run record …`, exit 130; the record `interrupted`, naming the container's "
        "last task (`Pass the GPU device nodes into the container through the Proxmox API`) and that its devN "
        "entries were being changed",
        "no process of the run left (the module runs on the controller), no host lock left",
        "yes: `apply --tags gpu` writes every entry and the nodes are inside (mode 666)",
        LAB_GPU + "test_sigint_while_the_api_writes_the_entries_then_a_rerun_converges",
        True,
        True,
    ),
    Row(
        "SIGINT while the sglang service restarts for a changed unit",
        "sglang",
        "`error: interrupted by SIGINT: run record …`, exit 130; the record `interrupted`, naming the task "
        "`Restart the server at once (no running gateway sends it requests)` and `SGLang service restarting`",
        "no process of the run left, no host lock left",
        "yes: `apply --tags sglang` runs the unit with the new stop timeout (`TimeoutStopUSec=2min 3s`), active, "
        "`/health_generate` 200",
        LAB_SGLANG + "test_sigint_while_the_service_restarts_then_a_rerun_serves_again",
        True,
        True,
    ),
    Row(
        "SIGINT while the first of two workers behind a gateway restarts for a changed flag (a rollout)",
        "sglang",
        "`error: interrupted by SIGINT: run record …`, exit 130; the record says sglang-01 was left `… out of its "
        "gateways: the next run puts it back`",
        "the gateway lists the other worker alone; a mark for sglang-01 on the gateway's host",
        "yes: the next apply puts it back, both workers ready and healthy, the mark gone",
        LAB_GATEWAY + "test_a_rollout_stopped_with_a_worker_out_is_finished_by_the_next_apply",
        True,
        True,
    ),
    Row(
        "the last healthy worker of a gateway due a restart for a changed flag",
        "sglang",
        "exit 1, `sglang-01: restarting it takes out the last healthy server(s) of gateway sglang-gw (model "
        "lab-standin): sglang-01: … Set sglang_gateway_allow_outage=true to go on anyway …`",
        "the worker still in the gateway, ready",
        "yes: `apply -e sglang_gateway_allow_outage=true` restarts it",
        LAB_GATEWAY + "test_the_last_healthy_worker_is_refused_unless_the_inventory_allows_it",
        True,
        True,
    ),
    Row(
        "one worker's SGLang killed (SIGKILL to the unit) while a client sends requests through the gateway",
        "sglang",
        "the client: the requests it sent all completed (the gateway retried those the worker refused); apply exits 0",
        "after apply, the gateway lists both workers ready and healthy",
        "yes: apply",
        LAB_GATEWAY + "test_a_worker_killed_hard_under_load_is_back_in_the_gateway_after_apply",
        True,
        True,
    ),
    Row(
        "the gateway's host cannot sandbox a unit (a CT without `features: nesting=1`: systemd fails the unit's mount "
        "namespace)",
        "gateway",
        "exit 1, `sglang-gw: systemd cannot sandbox the gateway's unit on this host: a unit with ProtectSystem=strict "
        "and PrivateTmp= failed before it ran, with status 226/NAMESPACE; on a Proxmox CT, set features nesting=1 "
        "(pct set <vmid> --features nesting=1) and restart it`",
        "the gateway's unit file as it was",
        "yes, with nesting on and the container restarted: `apply --tags gateway` serves through the gateway, both "
        "workers ready and healthy",
        LAB_GATEWAY + "test_a_gateway_host_without_nesting_is_refused_before_anything_changes",
        True,
        True,
    ),
    Row(
        "the container stopped through the API (as `pct stop`) while the sglang phase installs SGLang into its venv",
        "sglang",
        "exit 1, the container failed or unreachable with one line: `unreachable: the connection was lost while "
        "the task ran (the host stopped, rebooted or lost its network: …); run apply again once it answers ssh`, "
        "or ssh's own `Connection refused` for the next task, or pip's failure when the stop killed it first",
        "the container stopped, its venv without the server package",
        "yes, once the container is started again: "
        "`apply --tags sglang` installs again and the service answers `/health_generate` 200",
        LAB_SGLANG + "test_the_container_stopped_mid_install_is_named_and_a_rerun_converges",
        True,
        True,
    ),
    Row(
        "a container that served before its node's reboot does not serve again after it (module, in process)",
        "kernel",
        "`sglang-01: sglang did not serve again within 3s (… does not answer 200); the rollout stops here, "
        "before the next node reboots`",
        "not checked: the module's own test; the rollout's stop is the next row's lab test",
        NOT_SHOWN,
        "tests/unit/plugins/modules/test_sglang_serving.py::"
        "test_a_server_that_never_serves_again_fails_naming_the_container_within_the_wait",
        True,
        False,
    ),
    Row(
        "a container that served before its node's reboot does not serve again after it (its unit disabled inside; "
        "`verify --after-reboot`)",
        "verify",
        "exit 1; the reboot failure on pve-grub: `sglang-01: sglang did not serve again within 10s (…); the rollout "
        "stops here, before the next node reboots`",
        "pve-grub rebooted, pve-sdboot (the next node) not rebooted",
        NOT_SHOWN,
        "tests/lab/test_verify.py::test_a_container_that_does_not_serve_again_stops_the_rolling_reboot",
        True,
        False,
    ),
    Row(
        "kill -9 of a running apply (the OOM killer, a CI runner's hard kill), both hosts in a task",
        "verify",
        "nothing from the killed provision; its run's watchdog stops the run",
        "within 10 s no process of the run "
        "left and its private data dir (runner's environment, with the PVE password) removed; no file under "
        "$TMPDIR holds the password",
        "yes: the next `apply --full` takes the dead run's host locks over and succeeds",
        SSH + "test_kill_9_of_apply_stops_its_run_within_seconds_leaves_no_secret_and_a_rerun_converges_alone",
        True,
        True,
    ),
    Row(
        "the user's ssh config says `StrictHostKeyChecking accept-new`, the host's key is in no known_hosts (Mitogen)",
        "all",
        "apply: the host `unreachable`, exit 1; verify: every check of the host failed `unreachable`, exit 1",
        "the known_hosts file still empty: no key trusted or recorded",
        NOT_SHOWN,
        SSH + "test_a_user_ssh_config_that_accepts_new_keys_does_not_make_provision_trust_them[mitogen_linear]",
        True,
        False,
    ),
    Row(
        "the same, with Ansible's own ssh connection (linear strategy)",
        "all",
        "apply: the host `unreachable`, exit 1; verify: every check of the host failed `unreachable`, exit 1",
        "the known_hosts file still empty",
        NOT_SHOWN,
        SSH + "test_a_user_ssh_config_that_accepts_new_keys_does_not_make_provision_trust_them[linear]",
        True,
        False,
    ),
    Row(
        "a tenant VM the inventory does not own runs on a node that never had the profile (apply, reboot auto)",
        "kernel",
        "exit 1: `<node>: not rebooting: guests running that the inventory does not own: VM 105 "
        "(snp-tenant); …; nothing was written: the boot configuration, the trial entry and the one-shot are as "
        "they were`",
        "boot files, ESP entries, grubenv and the systemd-boot EFI variables byte-identical; no "
        "trial entry; the node not rebooted",
        NOT_SHOWN,
        LAB_KERNEL + "test_a_refused_reboot_writes_nothing_on_a_node_that_never_had_the_profile",
        True,
        False,
    ),
    Row(
        "a node reboots by itself (no apply) into a line whose IOMMU arguments differ from those P2P on was decided "
        "for; then a pending line that translates",
        "sglang",
        "the server starts with P2P off and its journal says `provision: starting with GPU P2P off: P2P on was "
        "decided for another boot (…)`; verify fails naming the start guard. With the pending line, apply decides "
        "`off` for the next boot",
        "serving, with NCCL_P2P_DISABLE=1 and --disable-custom-all-reduce",
        "yes: apply decides for the boot that runs, verify passes, and the node's next boot serves with P2P off",
        "tests/lab/test_verify.py::test_p2p_is_decided_for_the_next_boot_and_guarded_at_start",
        True,
        True,
    ),
    Row(
        "`forks = banana` in ./ansible.cfg (Ansible refuses it as it first loads its settings)",
        "all",
        "exit 2, one line: `…/ansible.cfg [defaults] forks: Config 'DEFAULT_FORKS' from "
        "'…/ansible.cfg' has an invalid value: …`",
        "no host contacted",
        NOT_SHOWN,
        "tests/unit/provision/test_cli_bad_inputs.py::"
        "test_a_setting_ansible_refuses_is_a_usage_error_naming_where_it_is_set"
        "[cfg-forks]",
        True,
        False,
        "hostile input: the environment",
    ),
    Row(
        "`ANSIBLE_FORKS=-x` in the environment, beside an ansible.cfg that sets forks",
        "all",
        "exit 2, one line: `$ANSIBLE_FORKS: Config 'DEFAULT_FORKS' from 'env: ANSIBLE_FORKS' has an invalid value: …`",
        "no host contacted",
        NOT_SHOWN,
        "tests/unit/provision/test_cli_bad_inputs.py::"
        "test_a_setting_ansible_refuses_is_a_usage_error_naming_where_it_is_set"
        "[env-forks]",
        True,
        False,
        "hostile input: the environment",
    ),
    Row(
        "`ANSIBLE_STDOUT_CALLBACK=json` (sshd targets)",
        "verify",
        "one warning: `… stdout_callback = json: "
        "provision's runs use Ansible's default stdout callback …`; the run succeeds",
        "converged, nothing changed",
        "yes: the run itself",
        SSH + "test_a_users_callbacks_change_nothing_provision_reads[stdout-json]",
        True,
        True,
        "hostile input: the environment",
    ),
    Row(
        "`ANSIBLE_GATHERING=sometimes`, a setting with a list of values",
        "all",
        "exit 2, one line naming the variable and the values it takes: `… It takes: implicit, explicit, smart.`",
        "no host contacted",
        NOT_SHOWN,
        "tests/unit/provision/test_cli_bad_inputs.py::"
        "test_a_setting_ansible_refuses_is_a_usage_error_naming_where_it_is_set"
        "[env-choice]",
        True,
        False,
        "hostile input: the environment",
    ),
]

# Faults in the matrix's scope that no test injects yet (docs/reliability.md lists them apart from the table).
NOT_YET = [
    "the container stopped mid-install of the gpu phase's NVIDIA userspace (the sglang phase's venv has a lab test)",
]


def rows() -> list[Row]:
    """Every row: the fast tests' own (PVE API, kernel regeneration, the trial boot's commit), then the cited ones."""
    from tests.unit.plugins.module_utils.test_pve_api_tfa import FAULT_ROWS as second_factor
    from tests.unit.plugins.modules.test_kernel_cmdline_trial import FAULT_ROWS as trial
    from tests.unit.plugins.modules.test_proxmox_lxc_gpu_faults import FAULT_ROWS as api
    from tests.unit.plugins.modules.test_pve_node_guests import FAULT_ROWS as before_reboot
    from tests.unit.provision.test_cli_bad_inputs import FAULT_ROWS as hostile
    from tests.unit.roles.kernel_cmdline.test_regenerate_faults import FAULT_ROWS as kernel

    sources = [
        (api, "hard fault: the PVE API"),
        (second_factor, ""),
        (kernel, "hard fault: kernel line regeneration"),
        (trial, "hard fault: the trial boot"),
        (before_reboot, "hard fault: the check before a reboot"),
        (CITED, "hard fault: runs, locks, hosts and services"),
        (hostile, ""),
    ]
    return [row if row.kind else replace(row, kind=kind) for found, kind in sources for row in found]


def counts(table: list[Row]) -> dict[str, int]:
    return {
        "faults injected": len(table),
        "survived with a clear message": sum(r.clear for r in table),
        "re-runs that converged": sum(r.converged for r in table),
    }


def table(table: list[Row]) -> str:
    """The Markdown table of docs/reliability.md."""
    lines = [
        "| # | class | fault | phase | what the user sees | host state after | re-run converges? | test |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for n, r in enumerate(table, 1):
        cells = [str(n), r.kind, r.fault, r.phase, r.sees, r.after, r.converges, f"`{r.test}`"]
        lines.append("| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")
    return "\n".join(lines) + "\n"


def rewrite(doc: Path) -> None:
    """Put the table and the counts into `doc` in place of the ones it has (its other text stays)."""
    text, rendered = doc.read_text(), rows()
    text = re.sub(r"(?m)^\| # \| (?:class \| )?fault .*\n(^\|.*\n)*", lambda _: table(rendered), text, count=1)
    for name, value in counts(rendered).items():
        text = re.sub(rf"(?m)^- {re.escape(name)}: \*\*\d+\*\*$", f"- {name}: **{value}**", text, count=1)
    doc.write_text(text)


if __name__ == "__main__":
    rewrite(Path(__file__).resolve().parents[1] / "docs" / "reliability.md")
