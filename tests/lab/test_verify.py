"""The whole site against the lab, then `provision verify`: every check passes on a converged lab,
each fails with its own message when its condition is broken, and --after-reboot proves it again."""

from __future__ import annotations

import json
import time
import xml.etree.ElementTree as ET

import pytest

from tests.conftest import run_provision
from tests.lab.common import apply, failed_checks, restart_and_wait_ready, set_host_vars, wait_ready

LAB_CHANGES = {"kernel", "gpu", "sglang", "ct"}  # tests/lab/conftest.py
LAB_NODES = "nspawn"  # no bootloader, no kernel line changed: nodes as nspawn containers (docs/lab.md)

KEY = {"sglang_api_key": "{{ lookup('ansible.builtin.env', 'SGLANG_API_KEY') }}", "sglang_p2p": "off"}
ENV = {"SGLANG_API_KEY": "verify-key-" + "9d2e"}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    return tmp_path_factory.mktemp("verify-runs")


@pytest.fixture(scope="module")
def converged(lab, lab_inventory, runs):
    set_host_vars(lab_inventory, "sglang-01", KEY)
    first = apply(lab_inventory, runs, env=ENV)
    yield {"first": first, "inventory": lab_inventory}
    set_host_vars(lab_inventory, "sglang-01", None)


def verify(inv, runs, *extra, env=None, timeout=1800):
    proc = run_provision(
        "verify",
        "--inventory",
        str(inv),
        "--json",
        "--runs-dir",
        str(runs),
        *extra,
        env={**ENV, **(env or {})},
        timeout=timeout,
    )
    return proc.returncode, json.loads(proc.stdout)["result"] if proc.stdout.strip() else {}


def test_site_converges_and_a_second_run_changes_nothing(lab, converged, runs):
    """Also the kernel phase's "second apply reports changed=0 and does not reboot"."""
    rc, _, err = converged["first"]
    assert rc == 0, err[-3000:]
    boot_ids = {n: lab.vm(n).boot_id() for n in ("pve-grub", "pve-sdboot")}
    rc, second, err = apply(converged["inventory"], runs, env=ENV)
    assert rc == 0, err[-2000:]
    assert {h: s["changed"] for h, s in second["hosts"].items()} == {"pve-grub": 0, "pve-sdboot": 0, "sglang-01": 0}
    assert {n: lab.vm(n).boot_id() for n in boot_ids} == boot_ids, "a converged node must not reboot"


def _skipped(report, host: str) -> set[str]:
    lines = [m for m in report["reports"].get(host, []) if m.startswith("up to date, skipped: ")]
    return set(lines[0].removeprefix("up to date, skipped: ").split(" (")[0].split(", ")) if lines else set()


def test_a_converged_phase_is_skipped_until_its_state_or_its_inputs_change(lab, converged, runs):
    """The no-op skips every phase; a watched path that drifted, or a changed input, runs that phase again."""
    inv, ct = converged["inventory"], lab.container()
    rc, report, err = apply(inv, runs, env=ENV)
    assert rc == 0, err[-2000:]
    assert _skipped(report, "sglang-01") == {"gpu", "sglang", "verify"}
    assert _skipped(report, "pve-grub") == _skipped(report, "pve-sdboot") == {"kernel", "driver", "verify"}
    assert sum(h["changed"] for h in report["hosts"].values()) == 0

    ct.ssh("systemctl disable --now sglang")  # drift: neither enabled nor running
    rc, report, err = apply(inv, runs, env=ENV)
    assert rc == 0, err[-2000:]
    assert _skipped(report, "sglang-01") == {"gpu", "verify"}, "a stopped, disabled unit must re-run the sglang phase"
    assert ct.ssh("systemctl is-enabled sglang && systemctl is-active sglang").returncode == 0

    set_host_vars(inv, "sglang-01", {**KEY, "sglang_timeout_stop_sec": 299})  # an input of the sglang phase
    try:
        rc, report, err = apply(inv, runs, env=ENV)
        assert rc == 0, err[-2000:]
        assert "sglang" not in _skipped(report, "sglang-01"), "a changed input must re-run its phase"
        # what systemd loaded, not the unit's text: the new value took effect (daemon-reload, restart)
        assert ct.ssh("systemctl show -p TimeoutStopUSec sglang").stdout.strip() == "TimeoutStopUSec=4min 59s"
    finally:
        set_host_vars(inv, "sglang-01", KEY)
    rc, report, err = apply(inv, runs, env=ENV)
    assert rc == 0 and "sglang" not in _skipped(report, "sglang-01"), "the input went back: the phase runs again"
    rc, report, err = apply(inv, runs, env=ENV)
    assert rc == 0 and _skipped(report, "sglang-01") == {"gpu", "sglang", "verify"}
    assert sum(h["changed"] for h in report["hosts"].values()) == 0


def test_every_check_passes_and_junit_lists_them(lab, converged, runs, tmp_path):
    junit = tmp_path / "verify.xml"
    rc, report = verify(converged["inventory"], runs, "--junit", str(junit))
    assert rc == 0, failed_checks(report)
    names = {c["name"] for c in report["checks"]}
    for check in (
        "test_kernel_arguments_in_running_kernel",
        "test_iommu_and_snp_findings",
        "test_sev_snp_proven",
        "test_gpu_device_nodes",
        "test_userspace_matches_host_driver",
        "test_service_enabled",
        "test_service_active",
        "test_service_listening",
        "test_health_answers",
        "test_server_info_answers",
        "test_process_matches_p2p_policy",
        "test_smoke_answer",
        "test_capacity_report",
    ):
        assert check in names
    # the lab's inventory says SNP is not required (TCG cannot do it): the check passes and says so, with reasons
    for node in ("pve-grub", "pve-sdboot"):
        snp = next(c for c in report["checks"] if (c["host"], c["name"]) == (node, "test_sev_snp_proven"))
        assert snp["passed"] and snp["reason"].startswith("SNP not proven (not required"), snp
        # the reasons are the node's own: a lab VM runs Debian's 6.1, too old for SNP, which is then named instead of
        # kvm_amd; an nspawn node runs the kernel of the machine it is on, and shows that machine's modules
        release, *loaded = lab.vm(node).ssh("uname -r; test -d /sys/module/kvm_amd && echo loaded").stdout.split()
        if tuple(map(int, release.split(".")[:2])) < (6, 11):
            assert f"kernel {release} is older than 6.11" in snp["reason"] and "kvm_amd" not in snp["reason"], snp
        else:
            assert ("kvm_amd is not loaded" in snp["reason"]) != bool(loaded), snp
    cases = ET.parse(junit).getroot().iter("testcase")
    assert sorted((c.get("classname").split(".")[0], c.get("name")) for c in cases) == sorted(
        (c["host"], c["name"]) for c in report["checks"]
    )
    assert report["capacity"]["sglang-01"]["summary"] == (
        "780,820 tokens ≈ 2.98 × 262,144-token sessions ≈ 23.8 × 32K sessions"
    )


def test_capacity_command(converged, runs):
    proc = run_provision(
        "capacity",
        "--inventory",
        str(converged["inventory"]),
        "--session-tokens",
        "32768,8192",
        "--runs-dir",
        str(runs),
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "780,820 tokens ≈ 2.98 × 262,144-token sessions ≈ 23.8 × 32K sessions ≈ 95.3 × 8K sessions" in proc.stdout


def test_stopped_service_fails_its_check(lab, converged, runs):
    ct = lab.container()
    ct.ssh("systemctl stop sglang")
    try:
        rc, report = verify(converged["inventory"], runs, "--limit", "sglang-01")
    finally:
        ct.ssh("systemctl start sglang")
    assert rc == 1
    assert "the sglang unit is not running" in failed_checks(report)[("sglang-01", "test_service_active")]


def test_removed_kernel_argument_fails_its_check(lab, converged, runs):
    vm = lab.vm("pve-sdboot")
    path = "/var/lib/provision/kernel-cmdline/wanted.json"
    wanted = json.loads(vm.ssh(f"cat {path}").stdout)
    vm.ssh(f"cp {path} {path}.keep && echo '{json.dumps({**wanted, 'add': [*wanted['add'], 'lab_gone=1']})}' > {path}")
    try:
        rc, report = verify(converged["inventory"], runs, "--limit", "pve-sdboot")
    finally:
        vm.ssh(f"mv {path}.keep {path}")
    assert rc == 1
    reasons = failed_checks(report)
    assert "/proc/cmdline lacks lab_gone=1" in reasons[("pve-sdboot", "test_kernel_arguments_in_running_kernel")]


def test_missing_env_var_fails_the_p2p_check(lab, converged, runs):
    ct = lab.container()
    ct.ssh(
        "sed -i '/NCCL_P2P_DISABLE/d' /etc/systemd/system/sglang.service && systemctl daemon-reload"
        " && systemctl restart sglang"
    )
    try:
        rc, report = verify(converged["inventory"], runs, "--limit", "sglang-01", "--checks", "p2p_policy")
    finally:
        rc_fix, _, err = apply(converged["inventory"], runs, "--tags", "sglang", env=ENV)
        assert rc_fix == 0, err[-2000:]
    assert rc == 1
    assert (
        "NCCL_P2P_DISABLE=1 is not in its environment"
        in failed_checks(report)[("sglang-01", "test_process_matches_p2p_policy")]
    )


def test_missing_gpu_node_fails_its_check(lab, converged, runs):
    ct = lab.container()
    # a node made at start is a bind mount, a hot-plugged one is not
    ct.ssh("umount /dev/nvidia-uvm 2>/dev/null || rm -f /dev/nvidia-uvm")
    try:
        rc, report = verify(converged["inventory"], runs, "--limit", "sglang-01", "--checks", "gpu_nodes")
    finally:
        old = ct.boot_id()
        ct.ssh("systemctl reboot", timeout=20)
        ct.wait_for_ssh(120, not_boot_id=old)
    assert rc == 1
    reasons = failed_checks(report)
    assert "/dev/nvidia-uvm is missing in the container" in reasons[("sglang-01", "test_gpu_nodes_visible")]


def test_wrong_answer_fails_the_smoke_check(lab, converged, runs):
    set_host_vars(converged["inventory"], "sglang-01", {**KEY, "verify_smoke_expect": "92"})
    try:
        wait_ready(lab.container())  # the container just rebooted: let the service come back
        rc, report = verify(converged["inventory"], runs, "--limit", "sglang-01", "--checks", "smoke")
    finally:
        set_host_vars(converged["inventory"], "sglang-01", KEY)
    assert rc == 1
    reason = failed_checks(report)[("sglang-01", "test_smoke_answer")]
    assert "expected '92' in the answer" in reason and "91" in reason


IO_PAGE_FAULT = (
    "nvidia 0000:41:00.0: AMD-Vi: Event logged [IO_PAGE_FAULT domain=0x0019 address=0x3fffe000 flags=0x0020]"
)
# the node's other devices, in the kernel's formats: a NIC's DMA refused under the translating IOMMU
# (drivers/iommu/amd/iommu.c, dev_err with the driver and BDF), and a GPU passed to another container
FOREIGN_FAULTS = (
    "mlx5_core 0000:c1:00.0: AMD-Vi: Event logged [IO_PAGE_FAULT domain=0x0021 address=0x7f3c0000 flags=0x0000]",
    "NVRM: Xid (PCI:0000:81:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus.",
)


def test_a_gpu_dma_fault_after_the_service_started_fails_verify_naming_the_line(lab, converged, runs):
    node = lab.state()["vms"][0]["name"]  # the container's node
    ct = lab.container()
    for line in FOREIGN_FAULTS:
        lab.inject_kernel_line(node, line)
    try:
        # another device's faults are a note on a passing check: they are not this container's GPUs'
        rc, report = verify(converged["inventory"], runs, "--limit", "sglang-01", "--checks", "dma_faults")
        assert rc == 0, failed_checks(report)
        check = next(c for c in report["checks"] if c["name"] == "test_no_gpu_dma_faults_since_the_service_started")
        assert check["reason"].startswith("2 fault line(s) of other devices since sglang started: "), check
        assert "mlx5_core 0000:c1:00.0" in check["reason"] and "NVRM: Xid (PCI:0000:81:00)" in check["reason"]
        lab.inject_kernel_line(node, IO_PAGE_FAULT)
        rc, report = verify(converged["inventory"], runs, "--limit", "sglang-01", "--checks", "dma_faults")
    finally:  # a new start of the service opens a new window
        restart_and_wait_ready(ct)
    assert rc == 1
    reason = failed_checks(report)[("sglang-01", "test_no_gpu_dma_faults_since_the_service_started")]
    assert f"node {node} logged 1 GPU DMA fault line(s) since sglang started" in reason
    assert "AMD-Vi: Event logged [IO_PAGE_FAULT domain=0x0019 address=0x3fffe000 flags=0x0020]" in reason
    rc, report = verify(converged["inventory"], runs, "--limit", "sglang-01", "--checks", "dma_faults")
    assert rc == 0, failed_checks(report)


def test_after_reboot_reboots_each_host_and_everything_passes(lab, converged, runs):
    before = {n: lab.vm(n).boot_id() for n in ("pve-grub", "pve-sdboot")}
    ct_before = lab.container().boot_id()
    rc, report = verify(converged["inventory"], runs, "--after-reboot", "--yes")
    assert rc == 0, (failed_checks(report), report.get("reboot_failures"))
    for name, old in before.items():
        new = lab.vm(name).boot_id()
        assert new != old
        assert any(old in m and new in m for m in report["reboots"][name]), report["reboots"][name]
    # CT 101 served before pve-grub's reboot: the rollout waited until it served again before the next node went
    assert any(
        m.startswith("SGLang serving again after the reboot: sglang-01 after ") for m in report["reboots"]["pve-grub"]
    )
    assert not any("SGLang serving again" in m for m in report["reboots"]["pve-sdboot"]), "no container there"
    assert lab.container().boot_id() != ct_before
    assert any(m.startswith("rebooted: PID 1 start") for m in report["reboots"]["sglang-01"])
    # CT 101 (onboot) came back with its node by itself: pve-guests' startall, with every devN path on the node
    starts = [p for m, p in lab.pve_control("GET", "/requests") if m == "POST" and p.endswith("/pve-grub/startall")]
    assert starts, "the node's pve-guests.service never asked for its onboot guests"


def test_a_container_that_does_not_serve_again_stops_the_rolling_reboot(lab, converged, runs):
    """A container that served before its node's reboot and does not after it stops the rolling reboot there.
    CT 101's unit disabled inside (the container starts with its node, SGLang does not), `verify --after-reboot` fails
    on pve-grub naming sglang-01 once kernel_cmdline_serving_timeout has passed, and pve-sdboot, the next node, does
    not reboot (playbooks/reboot.yml: serial 1, any_errors_fatal)."""
    inv, ct = converged["inventory"], lab.container()
    grub, sdboot = lab.vm("pve-grub"), lab.vm("pve-sdboot")
    before = {"pve-grub": grub.boot_id(), "pve-sdboot": sdboot.boot_id()}
    set_host_vars(inv, "pve-grub", {"kernel_cmdline_serving_timeout": 10})
    assert ct.ssh("systemctl disable --quiet sglang").returncode == 0
    try:
        # bounded: a serving wait that never fails would otherwise leave this run waiting on SGLang (seen: a hang
        # until the session's own timeout); the whole rolling reboot on nspawn nodes takes about 30 s
        rc, report = verify(inv, runs, "--after-reboot", "--yes", timeout=300)
    finally:
        set_host_vars(inv, "pve-grub", None)
        ct.wait_for_ssh(180)
        ct.ssh("systemctl enable --quiet --now sglang")
        wait_ready(ct)
    assert rc == 1
    said = [f["message"] for f in report["reboot_failures"] if "did not serve again" in f["message"]]
    assert len(said) == 1 and "sglang-01: sglang did not serve again within 10s (" in said[0], report["reboot_failures"]
    assert "the rollout stops here, before the next node reboots" in said[0], said
    assert grub.boot_id() != before["pve-grub"], "pve-grub did not reboot"
    assert sdboot.boot_id() == before["pve-sdboot"], "the rollout went on to the next node"


PT_SNIPPET = "/etc/default/grub.d/95-lab-iommu-pt.cfg"  # the node's line with iommu=pt last: the IOMMU passes through


def reboot_by_itself(lab, node) -> None:
    """The node reboots without provision (a kernel update, a crash, its SNP tenant's maintenance window): its onboot
    CT comes back through pve-guests, and its sglang unit starts as systemd starts it."""
    ct, old = lab.container(), ct_boot(lab)
    node.ssh("systemctl reboot")
    deadline = time.monotonic() + 240
    while ct_boot(lab) in (None, old):  # the CT is stopped with its node, then started by the node's pve-guests
        assert time.monotonic() < deadline, "the node's onboot CT did not come back within 240 s"
        time.sleep(1)
    wait_ready(ct, 180)


def ct_boot(lab) -> str | None:
    ct = lab.container()
    return ct.boot_id() if ct.is_running() else None


def served_with(ct) -> dict[str, str]:
    """The running server's P2P environment and the flags on its command line, read from its process."""
    pid = ct.ssh("systemctl show -p MainPID --value sglang").stdout.strip()
    environ = ct.ssh(f"tr '\\0' '\\n' < /proc/{pid}/environ").stdout.splitlines()
    argv = ct.ssh(f"tr '\\0' ' ' < /proc/{pid}/cmdline").stdout
    env = dict(line.split("=", 1) for line in environ if "=" in line)
    return {
        "NCCL_P2P_DISABLE": env.get("NCCL_P2P_DISABLE", ""),
        "custom_all_reduce_off": str("--disable-custom-all-reduce" in argv.split()),
    }


def decided(result) -> str:
    return next(m for m in result["reports"]["sglang-01"] if m.startswith("sglang_p2p auto -> "))


def test_p2p_is_decided_for_the_next_boot_and_guarded_at_start(lab, converged, runs):
    """sglang_p2p: auto with PCIe GPUs on a node booted with iommu=pt: P2P on, and the unit's start guard installed.
    - The node reboots by itself into a line without iommu=pt (an admin's edit, no apply): the guard starts the server
      with P2P off, says why in the journal, and verify names the guard.
    - Booted with iommu=pt again, then a pending line without it (as `apply --reboot never`, or a refused reboot,
      leaves it): apply decides for the next boot, P2P off now; the node reboots by itself and serves with P2P off."""
    inv, ct, node = converged["inventory"], lab.container(), lab.vm("pve-grub")
    pt = 'GRUB_CMDLINE_LINUX_DEFAULT="$GRUB_CMDLINE_LINUX_DEFAULT iommu=pt"\n'
    set_host_vars(inv, "sglang-01", {**KEY, "sglang_p2p": "auto"})
    try:
        assert node.ssh(f"printf '%s' '{pt}' > {PT_SNIPPET}").returncode == 0
        reboot_by_itself(lab, node)
        assert "iommu: Default domain type: Passthrough" in node.ssh("dmesg").stdout
        rc, result, err = apply(inv, runs, "--tags", "sglang", env=ENV)
        assert rc == 0, err[-2000:]
        assert decided(result).startswith("sglang_p2p auto -> on: PCIe peers"), decided(result)
        assert served_with(ct) == {"NCCL_P2P_DISABLE": "", "custom_all_reduce_off": "False"}

        # an unforeseen line: the guard, not the decision, keeps P2P off
        node.ssh(f"rm {PT_SNIPPET}")
        reboot_by_itself(lab, node)
        assert served_with(ct) == {"NCCL_P2P_DISABLE": "1", "custom_all_reduce_off": "True"}
        journal = ct.ssh("journalctl -b -u sglang -o cat").stdout
        assert (
            "provision: starting with GPU P2P off: P2P on was decided for another boot (IOMMU arguments 'iommu=nopt "
            "iommu=pt' then, 'iommu=nopt' now): run provision apply to decide for this boot" in journal
        ), journal[-2000:]
        rc, report = verify(inv, runs, "--limit", "sglang-01", "--checks", "p2p_policy")
        assert (
            rc == 1
            and "the unit's start guard started the server with P2P off"
            in failed_checks(report)[("sglang-01", "test_process_matches_p2p_policy")]
        )

        # a pending line: the decision is made for the next boot
        assert node.ssh(f"printf '%s' '{pt}' > {PT_SNIPPET}").returncode == 0
        reboot_by_itself(lab, node)
        rc, result, err = apply(inv, runs, "--tags", "sglang", env=ENV)
        assert rc == 0 and decided(result).startswith("sglang_p2p auto -> on"), (decided(result), err[-2000:])
        node.ssh(f"rm {PT_SNIPPET}")
        rc, result, err = apply(inv, runs, "--tags", "sglang", env=ENV)
        assert rc == 0, err[-2000:]
        assert decided(result).startswith(
            "sglang_p2p auto -> off: PCIe peers (GPU0-GPU1 PHB) behind a translating "
            "IOMMU (at the next boot: /etc/default/grub"
        ), decided(result)
        assert served_with(ct) == {"NCCL_P2P_DISABLE": "1", "custom_all_reduce_off": "True"}
        rc, report = verify(inv, runs, "--limit", "sglang-01", "--checks", "p2p_policy or next_boot")
        assert rc == 0, failed_checks(report)
        # verify names the pending line, what it does to the IOMMU, and what the unit starts with in that boot
        boot = report["next_boot"]["pve-grub"]
        pending = {b["source"]: b["iommu"] for b in boot["lines"] if b["pending"]}
        assert pending == {
            "/etc/default/grub (the line update-grub writes next)": {
                "translates": True,
                "source": "iommu=nopt: translated",
            }
        }, boot["lines"]
        assert {s["p2p"] for s in boot["containers"]["sglang-01"]} == {"off"}, boot["containers"]
        reboot_by_itself(lab, node)
        assert served_with(ct) == {"NCCL_P2P_DISABLE": "1", "custom_all_reduce_off": "True"}
        rc, report = verify(inv, runs, "--limit", "sglang-01", "--checks", "p2p_policy")
        assert rc == 0, failed_checks(report)
    finally:
        node.ssh(f"rm -f {PT_SNIPPET}")
        set_host_vars(inv, "sglang-01", KEY)
        if "Passthrough" in node.ssh("dmesg").stdout:
            reboot_by_itself(lab, node)
        rc, _, err = apply(inv, runs, "--tags", "sglang", env=ENV)
        assert rc == 0, err[-2000:]
