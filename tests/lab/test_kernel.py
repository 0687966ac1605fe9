"""The kernel phase on both bootloader paths of the lab (issue: kernel arguments).

Tests run in file order on the shared lab. Starting states: pve-grub has quoted arguments,
iommu=pt, kvm_amd.sev=0 and the mem_encrypt=on of an earlier profile in /etc/default/grub plus an
argument appended only by a grub.d snippet; pve-sdboot has quotes, iommu.passthrough=1 and
kvm_amd.sev=0 in /etc/kernel/cmdline without a trailing newline. The lab's inventory says SEV-SNP
is not required (its VMs cannot do it): the profile applies and the reports say "SNP not proven".
A run that changes a node's line and reboots it boots the line once, as a trial, before it becomes the default
(roles/kernel_cmdline/README.md, "Trial boot, then commit"); a run that only reboots into a line already written
(after --reboot never) does not. A trial whose one-shot the firmware dropped at the reset never ran, and is told
apart from one that hung by its entry's boot counter (the last test).
"""

from __future__ import annotations

import base64
import json
import re
import time

import pytest

from tests.conftest import run_provision
from tests.lab.common import (
    PROFILE_ARGS,
    apply,
    boots,
    canonical,
    interrupt_at,
    pve_api,
    set_host_vars,
    split_cmdline,
    wait_task,
)

LAB_CHANGES = {"kernel", "ct"}  # tests/lab/conftest.py
LAB_NEEDS_UNCHANGED = {"kernel"}

# mem_encrypt=on: host SME is opt-in (kernel_cmdline_snp_mem_encrypt), and removed where an earlier profile put it
SNP_GONE = ["iommu=pt", "iommu.passthrough=1", "kvm_amd.sev=0", "mem_encrypt=on"]
MARKER = "/var/lib/provision/cmdline-changed"
GRUB_KEEP = ["quiet", "dyndbg=module iommu +p", "site_arg=1", "console=ttyS0,115200n8"]
SDBOOT_KEEP = ["quiet", "acpi_osi=Windows 2020", "console=ttyS0,115200n8"]
FILES = "/etc/default/grub /etc/default/grub.d/* /etc/kernel/cmdline /boot/grub/grub.cfg /boot/grub/custom.cfg"
TENANT = 105  # a VM the inventory does not own, created on pve-grub through the lab's PVE API


def on_each_esp(command: str) -> str:
    """A shell loop running `command` (its output prefixed with the ESP's UUID) in each ESP proxmox-boot-tool keeps,
    mounted read-only for the moment."""
    return (
        "for u in $(cat /etc/kernel/proxmox-boot-uuids 2>/dev/null); do m=$(mktemp -d); "
        f'mount -o ro /dev/disk/by-uuid/$u $m && (cd $m && {command} | sed "s#^#$u: #"); umount $m; rmdir $m; done'
    )


# the kernel prints its command line on the serial console (x86 setup_arch "Command line:", KERN_INFO; init/main.c
# "Kernel command line:", KERN_NOTICE): seen there, the kernel of the new line is booting
NEW_LINE_BOOTING = re.compile(r"[Cc]ommand line: [^\n]*\blab_new=2\b")


def write(machine, path: str, content: str) -> None:
    data = base64.b64encode(content.encode()).decode()
    assert machine.ssh(f"mkdir -p $(dirname {path}) && echo {data} | base64 -d > {path}").returncode == 0


def marker(machine) -> dict | None:
    out = machine.ssh(f"cat {MARKER} 2>/dev/null").stdout
    return json.loads(out) if out.strip() else None


def checksums(machine) -> str:
    return machine.ssh(f"sha256sum {FILES} 2>/dev/null").stdout


def boot_config(machine) -> str:
    """What the node boots by default (after a power cycle): the GRUB files and grub.cfg, or /etc/kernel/cmdline and
    the ESPs' loader entries; a trial entry (custom.cfg, provision-trial.conf) shows here too."""
    return checksums(machine) + machine.ssh(on_each_esp("sha256sum loader/loader.conf loader/entries/*.conf")).stdout


def trial_left(machine) -> list[str]:
    """What of a trial boot entry is on the node: ours in custom.cfg, on an ESP, a one-shot, our record of it."""
    out = machine.ssh(
        "grep -l provision-trial /boot/grub/custom.cfg 2>/dev/null; "
        # GRUB's save_env leaves `next_entry=` (empty) once it has taken the one-shot
        "grub-editenv /boot/grub/grubenv list 2>/dev/null | grep '^next_entry=.'; "
        "ls /sys/firmware/efi/efivars/LoaderEntryOneShot-* /var/lib/provision/kernel-cmdline/trial.json 2>/dev/null; "
        + on_each_esp("ls loader/entries/provision-trial*.conf 2>/dev/null")
    ).stdout
    return out.split()


def serial_since(machine, offset: int) -> str:
    """What the VM wrote to its serial console since `offset` (provision/lab/vm.py: qemu's -serial file)."""
    with open(machine.serial, "rb") as f:
        f.seek(offset)
        return f.read().decode(errors="replace")


def args_of(machine) -> list[str]:
    """/proc/cmdline as the kernel reads it (GRUB shows dyndbg="a b" as "dyndbg=a b")."""
    return [canonical(a) for a in split_cmdline(machine.ssh("cat /proc/cmdline").stdout)]


@pytest.fixture(scope="module")
def hosts(lab, lab_inventory):
    grub, sdboot = lab.vm("pve-grub"), lab.vm("pve-sdboot")
    current = grub.ssh("cat /etc/default/grub").stdout
    current = re.sub(
        r"^GRUB_CMDLINE_LINUX_DEFAULT=.*$",
        "GRUB_CMDLINE_LINUX_DEFAULT='quiet dyndbg=\"module iommu +p\" iommu=pt kvm_amd.sev=0 mem_encrypt=on'",
        current,
        flags=re.M,
    )
    write(grub, "/etc/default/grub", current)
    write(
        grub, "/etc/default/grub.d/50-site.cfg", 'GRUB_CMDLINE_LINUX_DEFAULT="$GRUB_CMDLINE_LINUX_DEFAULT site_arg=1"\n'
    )
    root = sdboot.ssh("head -n1 /etc/kernel/cmdline").stdout.split()[0]
    write(
        sdboot,
        "/etc/kernel/cmdline",
        f'{root} ro console=ttyS0,115200n8 quiet acpi_osi="Windows 2020" iommu.passthrough=1 kvm_amd.sev=0',
    )
    assert not sdboot.ssh("tail -c1 /etc/kernel/cmdline | od -c").stdout.strip().endswith("\\n")
    return {"pve-grub": grub, "pve-sdboot": sdboot, "inventory": lab_inventory}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    return tmp_path_factory.mktemp("kernel-runs")


def test_check_reports_changes_without_making_them(hosts, runs):
    before = {n: (checksums(hosts[n]), hosts[n].boot_id()) for n in ("pve-grub", "pve-sdboot")}
    rc, result, err = apply(hosts["inventory"], runs, "--tags", "kernel", "--check")
    assert rc == 0, err[-2000:]
    for name in ("pve-grub", "pve-sdboot"):
        assert result["hosts"][name]["changed"] >= 1, f"{name}: --check must report the pending change"
        assert (checksums(hosts[name]), hosts[name].boot_id()) == before[name], f"{name} changed under --check"
        assert any("reboot pending" in m for m in result["reports"][name])


# the systemd-boot EFI variables that choose what the next boot runs (systemd-boot's loader interface); the others
# are the loader's and systemd's reports (timings, features, the system token), which say nothing of the next boot
BOOT_CHOOSING = ("LoaderEntryOneShot", "LoaderEntryDefault", "LoaderConfigTimeoutOneShot", "LoaderConfigTimeout")


def armed(machine) -> str:
    """Everything a next boot reads on the node: the boot files and the ESPs' entries, grubenv, and the systemd-boot
    EFI variables that choose the next boot (names and contents)."""
    names = " ".join(f"/sys/firmware/efi/efivars/{v}-4a67b082-0a4c-41cf-b6c7-440b29bb8c4f" for v in BOOT_CHOOSING)
    variables = f'for v in {names}; do [ -e "$v" ] && echo "$v $(sha256sum < "$v")"; done; true'
    return boot_config(machine) + machine.ssh(f"sha256sum /boot/grub/grubenv 2>/dev/null; {variables}").stdout


def test_a_refused_reboot_writes_nothing_on_a_node_that_never_had_the_profile(hosts, runs, lab):
    """A VM the inventory does not own runs on each node (the SNP tenant), and the node has never had the profile: the
    reboot is refused before a trial entry, a one-shot (grubenv's next_entry, LoaderEntryOneShot) or a default line is
    written, so that no later reboot, by anyone, boots an untested line. Every boot file, the ESPs, grubenv and the
    EFI variables are byte-identical afterwards, and the report says nothing was written."""
    api = pve_api(lab)
    for name in ("pve-grub", "pve-sdboot"):
        node = hosts[name]
        assert not all(a in args_of(node) for a in PROFILE_ARGS), f"{name} must not have the profile yet"
        qemu = api.nodes(name).qemu
        assert wait_task(api, name, qemu.post(vmid=TENANT, name="snp-tenant", memory=512))["exitstatus"] == "OK"
        try:
            assert wait_task(api, name, qemu(TENANT).status.start.post())["exitstatus"] == "OK"
            before = (node.boot_id(), armed(node), marker(node))
            rc, result, err = apply(hosts["inventory"], runs, "--tags", "kernel", "--limit", name)
            assert rc == 1, err[-2000:]
            after = (node.boot_id(), armed(node), marker(node))  # before trial_left: its grub-editenv makes a grubenv
            left = trial_left(node)
            assert left == [], f"{name}: refused, yet armed: {left}"
            changed = sorted(set(before[1].splitlines()) ^ set(after[1].splitlines()))
            assert after == before, f"{name}: refused, yet something changed: {changed}"
            message = " ".join(f["message"] for f in result["failures"] if f["host"] == name)
            assert message.startswith(f"{name}: not rebooting: guests running that the inventory does not own"), message
            assert message.endswith(
                "nothing was written: the boot configuration, the trial entry and the one-shot are as they were"
            ), message
        finally:
            if qemu(TENANT).status.current.get()["status"] == "running":
                wait_task(api, name, qemu(TENANT).status.stop.post())
            wait_task(api, name, qemu(TENANT).delete())


def test_reboot_never_configures_and_leaves_the_reboot_pending(hosts, runs):
    ids = {n: hosts[n].boot_id() for n in ("pve-grub", "pve-sdboot")}
    rc, result, err = apply(hosts["inventory"], runs, "--tags", "kernel", "--reboot", "never")
    assert rc == 0, err[-2000:]
    reports = result["reports"]
    assert any(m.startswith("grub (proxmox-boot-tool status: no ESPs managed") for m in reports["pve-grub"])
    assert any(
        m.startswith("systemd-boot (proxmox-boot-tool status: ESP configured with uefi") for m in reports["pve-sdboot"]
    )
    assert any("SEV-SNP needs the IOMMU in translation mode" in m for m in reports["pve-grub"])
    assert any(m.startswith("removed mem_encrypt=on (host SME)") for m in reports["pve-grub"]), reports["pve-grub"]
    for name in ("pve-grub", "pve-sdboot"):
        assert any(m.startswith("reboot pending") for m in reports[name])
        assert hosts[name].boot_id() == ids[name], f"{name} rebooted with --reboot never"
        # the boot configuration changed: the marker holds the new line (the GPU diagnostic refuses older verdicts)
        mark = marker(hosts[name])
        assert mark and mark["changed_at"].endswith("Z") and "kvm_amd.sev_snp=1" in mark["cmdline"].split(), mark
        assert "mem_encrypt=on" not in mark["cmdline"].split()
        hosts.setdefault("markers", {})[name] = mark
    grub_cfg = hosts["pve-grub"].ssh("grep -m1 -E '^\\s+linux\\s' /boot/grub/grub.cfg").stdout
    assert all(a in grub_cfg.split() for a in PROFILE_ARGS) and "iommu=pt" not in grub_cfg.split()
    assert "mem_encrypt=on" not in grub_cfg.split()
    # the append-style grub.d snippet means the merged line goes to a last-applied snippet
    assert "zz-provision.cfg" in hosts["pve-grub"].ssh("ls /etc/default/grub.d").stdout
    entry = hosts["pve-sdboot"].ssh("proxmox-boot-tool status").stdout
    assert "configured with: uefi" in entry


def test_a_running_guest_the_inventory_does_not_own_stops_the_reboot(hosts, runs, lab):
    """A VM on pve-grub that the inventory does not own (the SNP tenant; created and started through the lab's PVE
    API): the reboot left pending by the last test is refused, naming the VM, and nothing changes; CT 101, the
    inventory's own container on pve-grub, runs there too and is no reason to refuse."""
    grub, api = hosts["pve-grub"], pve_api(lab)
    assert not all(a in args_of(grub) for a in PROFILE_ARGS), "this test needs the reboot the last test left pending"
    qemu = api.nodes("pve-grub").qemu
    assert wait_task(api, "pve-grub", qemu.post(vmid=TENANT, name="snp-tenant", memory=512))["exitstatus"] == "OK"
    try:
        assert wait_task(api, "pve-grub", qemu(TENANT).status.start.post())["exitstatus"] == "OK"
        before = (grub.boot_id(), checksums(grub), marker(grub))
        rc, result, err = apply(hosts["inventory"], runs, "--tags", "kernel", "--limit", "pve-grub")
        assert rc == 1, err[-2000:]
        message = " ".join(f["message"] for f in result["failures"] if f["host"] == "pve-grub")
        assert message.startswith(
            f"pve-grub: not rebooting: guests running that the inventory does not own: VM {TENANT} (snp-tenant); "
            "stop or migrate them, or set kernel_cmdline_reboot_running_guests: allow"
        ), message
        assert "CT 101" not in message, "the inventory's own container is no reason to refuse"
        assert (grub.boot_id(), checksums(grub), marker(grub)) == before, "refused, yet the node rebooted or changed"
    finally:
        if qemu(TENANT).status.current.get()["status"] == "running":
            wait_task(api, "pve-grub", qemu(TENANT).status.stop.post())
        wait_task(api, "pve-grub", qemu(TENANT).delete())
    assert TENANT not in [vm["vmid"] for vm in qemu.get()]


MERGE = "Merge the wanted arguments into the bootloader's kernel command line"
PLAN = "Plan the merge, writing nothing"


def test_sigint_in_the_kernel_phase_leaves_no_process_and_an_interrupted_record(hosts, runs, tmp_path):
    """SIGINT while the first node runs the kernel phase (the reboot the earlier test left pending
    is due). The run exits 130, no process of it is left, its record is `interrupted` and names the node's last task
    and what that leaves; no node rebooted or changed, and no host lock is left. The next test's apply is the re-run
    that converges."""
    names = ("pve-grub", "pve-sdboot")
    before = {n: (boot_config(hosts[n]), hosts[n].boot_id()) for n in names}
    # the node's first module call (the merge's plan, in check mode), which starts the connection's interpreter: long
    # enough for the signal to land in it (the merge itself, right after it, is over in a moment)
    summary = interrupt_at(hosts["inventory"], runs, tmp_path, "pve-grub", PLAN, "--tags", "kernel")
    stopped = summary["stopped_at"]["pve-grub"]
    assert (stopped["task"], stopped["finished"]) == (PLAN, False), stopped
    assert stopped["leaves"].startswith("nothing changed: the merge of the kernel arguments was being planned")
    for name in names:
        assert (boot_config(hosts[name]), hosts[name].boot_id()) == before[name], f"{name} changed or rebooted"
        assert "lock.json" not in hosts[name].ssh("sudo ls /var/lib/provision").stdout, f"{name}: host lock left"


def test_reboot_auto_reboots_each_host_once_and_the_arguments_take(hosts, runs):
    before = {n: (hosts[n].boot_id(), boots(hosts[n])) for n in ("pve-grub", "pve-sdboot")}
    rc, result, err = apply(hosts["inventory"], runs, "--tags", "kernel")
    assert rc == 0, err[-3000:]
    for name, keep in (("pve-grub", GRUB_KEEP), ("pve-sdboot", SDBOOT_KEEP)):
        vm = hosts[name]
        assert vm.boot_id() != before[name][0], f"{name} did not reboot"
        assert boots(vm) == before[name][1] + 1, f"{name} rebooted more than once"
        args = args_of(vm)
        assert all(a in args for a in PROFILE_ARGS), (name, args)
        assert not [a for a in SNP_GONE if a in args], (name, args)
        assert all(a in args for a in keep), f"{name} lost arguments it was not asked to change: {args}"
        findings = json.loads(vm.ssh("cat /var/lib/provision/kernel-findings.json").stdout)
        assert findings["sev_snp"] == "not proven" and findings["iommu_default_domain"]
        # true reasons: the lab's Debian 12 kernel is too old, and TCG has no SNP lines
        assert findings["sev_snp_missing"][0].startswith("kernel 6.1."), findings["sev_snp_missing"]
        assert not [r for r in findings["sev_snp_missing"] if "kvm_amd is not loaded" in r]
        assert any(
            m.startswith("IOMMU default domain") and "SNP not proven (not required" in m
            for m in result["reports"][name]
        ), result["reports"][name]
        # this run only rebooted: the boot configuration was already written, so the marker is as it was
        assert marker(vm) == hosts["markers"][name]
    # the lab's own proof that each bootloader booted the line: GRUB's BOOT_IMAGE, systemd-boot's EFI initrd path
    assert hosts["pve-grub"].ssh("cat /proc/cmdline").stdout.startswith("BOOT_IMAGE=/boot/vmlinuz-")
    sdboot_line = hosts["pve-sdboot"].ssh("cat /proc/cmdline").stdout.split()
    assert any(a.startswith("initrd=\\EFI\\proxmox\\") for a in sdboot_line), "not booted through systemd-boot"
    cmdline_file = hosts["pve-sdboot"].ssh("cat /etc/kernel/cmdline").stdout
    assert cmdline_file.count("\n") == 1, "the first line only, newline-terminated"


def test_a_node_that_must_prove_snp_and_cannot_is_not_rebooted_into_it(hosts, runs):
    """With kernel_cmdline_snp_required: true the lab's VMs (no sev_snp CPU flag, kernel 6.1) are refused
    before anything is written; a converged node fails after its findings instead of passing as if proven."""
    grub = hosts["pve-grub"]
    inv = hosts["inventory"]
    before = (checksums(grub), grub.boot_id(), marker(grub))
    set_host_vars(inv, "pve-grub", {"kernel_cmdline_snp_required": True, "kernel_cmdline_extra_args": ["lab_snp=1"]})
    try:
        rc, result, _ = apply(inv, runs, "--tags", "kernel", "--limit", "pve-grub")
        assert rc == 1
        message = " ".join(f["message"] for f in result["failures"] if f["host"] == "pve-grub")
        assert "cannot boot into SEV-SNP: the CPU flag sev_snp is missing from /proc/cpuinfo" in message, message
        assert "kernel 6.1." in message and "(the kernel the node boots next)" in message, message
        assert "nothing was changed" in message and "kernel_cmdline_snp_profile: false" in message, message
        assert (checksums(grub), grub.boot_id(), marker(grub)) == before, "refused, yet something changed"
        set_host_vars(inv, "pve-grub", {"kernel_cmdline_snp_required": True})
        rc, result, _ = apply(inv, runs, "--tags", "kernel", "--limit", "pve-grub")
        assert rc == 1
        message = " ".join(f["message"] for f in result["failures"] if f["host"] == "pve-grub")
        assert message.startswith("SEV-SNP is not active after boot: kernel 6.1."), message
        assert grub.boot_id() == before[1], "a converged node must not reboot"
    finally:
        set_host_vars(inv, "pve-grub", None)


def test_failed_generation_restores_the_old_config_and_does_not_reboot(hosts, runs):
    grub = hosts["pve-grub"]
    # valid shell when sourced alone, but aborts grub-mkconfig (set -e, GRUB_DEVICE set): a broken snippet
    write(grub, "/etc/default/grub.d/60-broken.cfg", '[ -z "${GRUB_DEVICE:-}" ]\n')
    # without a trial boot the default is regenerated before any reboot, where this refusal costs no reboot; with one,
    # the same refusal comes at the commit after the trial boot
    # (tests/unit/plugins/modules/test_kernel_cmdline_trial.py)
    set_host_vars(
        hosts["inventory"], "pve-grub", {"kernel_cmdline_extra_args": ["lab_new=1"], "kernel_cmdline_trial_boot": "off"}
    )
    before = (
        grub.ssh("sha256sum /boot/grub/grub.cfg /etc/default/grub /etc/default/grub.d/zz-provision.cfg").stdout,
        grub.boot_id(),
        marker(grub),
    )
    try:
        rc, result, _ = apply(hosts["inventory"], runs, "--tags", "kernel", "--limit", "pve-grub")
    finally:
        grub.ssh("rm -f /etc/default/grub.d/60-broken.cfg")
        set_host_vars(hosts["inventory"], "pve-grub", None)
    assert rc == 1
    message = " ".join(f["message"] for f in result["failures"])
    assert "restored from" in message and "not rebooted" in message, message
    after = (
        grub.ssh("sha256sum /boot/grub/grub.cfg /etc/default/grub /etc/default/grub.d/zz-provision.cfg").stdout,
        grub.boot_id(),
        marker(grub),
    )
    assert after == before, "the previous boot configuration (and its marker) must stay in place, without a reboot"


def test_a_trial_boot_that_hangs_comes_back_on_the_old_line_and_stops_the_rollout(hosts, runs, lab):
    """apply a new argument to both nodes. Whichever node goes first is frozen (qemu `stop`) once
    the kernel of its trial boot prints the new line on the serial console (its bootloader has taken the one-shot
    by then), then reset (qemu `system_reset`) and let run: it boots its default entry, the old line. apply fails on
    it with one line; its default boot configuration is as before, the other node's untouched and not rebooted.
    A re-run without the freeze, on the frozen node (`--limit`), converges: it boots its trial and makes it the default.
    The other node's trial boot is test_reboot_auto's; here it would cost a reboot and a commit (about 100 s) and show
    nothing new, and without it the other node ends on its old line, as the inventory has it again after this test."""
    import threading

    inv = hosts["inventory"]
    names = ("pve-grub", "pve-sdboot")
    # loglevel=7 after the lines' `quiet` (the later one wins): the kernel's command line reaches the serial console
    new = {"kernel_cmdline_extra_args": ["lab_new=2", "loglevel=7"]}
    for name in names:
        set_host_vars(inv, name, new)
    before = {n: (boot_config(hosts[n]), hosts[n].boot_id(), args_of(hosts[n])) for n in names}
    offsets = {n: hosts[n].serial.stat().st_size for n in names}
    outcome = {}
    runner = threading.Thread(target=lambda: outcome.update(r=apply(inv, runs, "--tags", "kernel")))
    runner.start()
    frozen = None
    try:
        while runner.is_alive() and frozen is None:
            frozen = next((n for n in names if NEW_LINE_BOOTING.search(serial_since(hosts[n], offsets[n]))), None)
            time.sleep(0.5)
        if frozen:
            vm = hosts[frozen]
            vm.pause()
            time.sleep(5)  # hung
            vm.hmp("system_reset")  # the power cycle
            vm.resume()
        runner.join(timeout=1800)
        assert frozen, "no node booted the new line: the bootloader did not take the trial entry"
        other = next(n for n in names if n != frozen)
        rc, result, _ = outcome["r"]
        assert rc == 1
        message = " ".join(f["message"] for f in result["failures"] if f["host"] == frozen)
        assert message.startswith(f"{frozen}: the trial boot did not come up on the new line (running: "), message
        assert message.endswith("trial entry removed; nothing else was changed"), message
        vm = hosts[frozen]
        assert vm.boot_id() != before[frozen][1], f"{frozen} did not reboot"
        assert args_of(vm) == before[frozen][2], f"{frozen} is not back on its old line"
        assert boot_config(vm) == before[frozen][0], f"{frozen}'s default boot configuration changed"
        assert trial_left(vm) == []
        assert hosts[other].boot_id() == before[other][1], f"{other} rebooted although {frozen} failed"
        assert boot_config(hosts[other]) == before[other][0], f"{other}'s boot configuration was touched"

        rc, result, err = apply(inv, runs, "--tags", "kernel", "--limit", frozen)
        assert rc == 0, err[-3000:]
        vm = hosts[frozen]
        assert "lab_new=2" in args_of(vm) and trial_left(vm) == []
        assert any(m.startswith("trial boot of the new line passed; made permanent") for m in result["reports"][frozen])
        assert "lab_new=2" in vm.ssh(f"cat {FILES} 2>/dev/null").stdout, f"{frozen}: not the default"
        assert hosts[other].boot_id() == before[other][1] and boot_config(hosts[other]) == before[other][0]
    finally:
        for name in names:
            set_host_vars(inv, name, None)
        if frozen and hosts[frozen].boot_id() is None:  # the test failed while the node was paused
            hosts[frozen].resume()
            hosts[frozen].wait_for_ssh(600)
    hosts["frozen"] = frozen


def test_rollback_restores_the_previous_line_and_reboots_only_where_needed(hosts, runs):
    """Rolls back the node the last test froze (it now runs lab_new=2, made the default by the re-run): its latest
    backup is the configuration before that commit. `--limit` keeps the other node out: it is not rebooted and its
    boot configuration is not touched."""
    frozen = hosts.get("frozen", "pve-sdboot")
    other = "pve-grub" if frozen == "pve-sdboot" else "pve-sdboot"
    rolled, untouched = hosts[frozen], hosts[other]
    rolled_id, rolled_args = rolled.boot_id(), args_of(rolled)
    assert "lab_new=2" in rolled_args  # the re-run made it the default and booted it
    untouched_state = (untouched.boot_id(), boot_config(untouched))
    proc = run_provision(
        "rollback",
        "--inventory",
        str(hosts["inventory"]),
        "--limit",
        frozen,
        "--yes",
        "--json",
        "--runs-dir",
        str(runs),
        timeout=1800,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    reports = json.loads(proc.stdout)["result"]["reports"]
    # the same rule as apply: reboot when the running kernel lacks an argument of the restored line or still has one
    # it dropped (here lab_new=2 and loglevel=7, which the restored line no longer has)
    restored = next(m for m in reports[frozen] if m.startswith("restored ")).split("configured line now: ", 1)[1]
    restored_args = [canonical(a) for a in split_cmdline(restored)]
    assert "lab_new=2" not in restored_args and "lab_new=2" in rolled_args, (restored, rolled_args)
    assert rolled.boot_id() != rolled_id, f"{frozen} still ran lab_new=2, which the restored line drops: no reboot"
    assert "lab_new=2" not in args_of(rolled), f"{frozen} must reboot into the restored line"
    assert (
        "lab_new=2"
        not in rolled.ssh("cat /etc/kernel/cmdline /etc/default/grub /etc/default/grub.d/* 2>/dev/null").stdout
    )
    assert (untouched.boot_id(), boot_config(untouched)) == untouched_state, f"{other} is not in --limit"


def test_a_one_shot_the_firmware_drops_at_the_reset_is_no_trial_and_the_next_run_boots_none(hosts, runs):
    """Firmware that drops EFI variable writes at the reset (the lab restores pve-sdboot's OVMF variable store when it
    resets): `bootctl set-oneshot` reads back as armed, and the node reboots into its default entry. The trial entry's
    boot counter is untouched, so the run says the trial never ran (not that the new line failed), leaves the default
    boot configuration and the running line as they were, and records the firmware's loss. The next run boots no
    trial there, and says why."""
    node, inv = hosts["pve-sdboot"], hosts["inventory"]
    record = "/var/lib/provision/kernel-cmdline/oneshot-lost.json"
    set_host_vars(inv, "pve-sdboot", {"kernel_cmdline_extra_args": ["lab_new=3"]})
    node.drop_efi_writes()
    try:
        before = (boot_config(node), args_of(node), node.boot_id())
        rc, result, err = apply(inv, runs, "--tags", "kernel", "--limit", "pve-sdboot")
        assert rc == 1, err[-3000:]
        message = " ".join(f["message"] for f in result["failures"] if f["host"] == "pve-sdboot")
        assert message.startswith(
            "pve-sdboot: the trial boot never ran, so the new line was not tried: the firmware did not keep "
            "systemd-boot's one-shot through the reboot: LoaderEntryOneShot read back provision-trial+1.conf after "
            "bootctl set-oneshot, yet the loader booted proxmox-"
        ), message
        assert f"recorded in {record}" in message and message.endswith("trial entry removed; nothing else was changed")
        assert node.boot_id() != before[2], "the node did not reboot"
        assert (boot_config(node), args_of(node)) == before[:2] and trial_left(node) == []
        assert node.ssh(f"test -s {record}").returncode == 0

        # the next run boots no trial there (--check: the monitored reboot that follows is the unit test's,
        # tests/unit/plugins/modules/test_kernel_cmdline_trial.py, and costs a reboot here)
        rc, result, err = apply(inv, runs, "--tags", "kernel", "--limit", "pve-sdboot", "--check")
        assert rc == 0, err[-3000:]
        warned = [m for m in result["reports"]["pve-sdboot"] if m.startswith("WARNING: no trial boot: ")]
        assert warned and "the firmware did not keep systemd-boot's one-shot through the reboot" in warned[0], result
        assert (boot_config(node), args_of(node)) == before[:2] and trial_left(node) == []
    finally:
        node.drop_efi_writes(False)
        set_host_vars(inv, "pve-sdboot", None)


def test_retire_takes_the_profile_off_a_node_and_apply_puts_it_back(hosts, runs):
    """`provision retire` on a node without containers (pve-sdboot), with --reboot never: the profile's arguments come
    off its configured line (its own arguments stay), a reboot is pending where the running line has them, the kernel
    phase's record goes and the retirement is recorded; a second retire changes nothing; `apply` puts the profile
    back, and a reboot is pending only where the running line lacks it."""
    node, inv = hosts["pve-sdboot"], hosts["inventory"]
    limit = ("--limit", "pve-sdboot", "--reboot", "never")
    rc, _, err = apply(inv, runs, "--tags", "kernel", *limit)
    assert rc == 0, err[-3000:]
    assert set(PROFILE_ARGS) <= set(split_cmdline(node.ssh("cat /etc/kernel/cmdline").stdout))
    boot_id, running_profile = node.boot_id(), set(PROFILE_ARGS) <= set(args_of(node))

    def pending(result: dict) -> bool:
        return any(m.startswith("reboot pending") for m in result["reports"]["pve-sdboot"])

    def retire() -> tuple[int, dict, str]:
        args = ("--inventory", str(inv), *limit, "--yes", "--json", "--runs-dir", str(runs))
        proc = run_provision("retire", *args, timeout=1800)
        return proc.returncode, json.loads(proc.stdout or "{}").get("result", {}), proc.stderr

    rc, result, err = retire()
    assert rc == 0, err[-3000:]
    configured = [canonical(a) for a in split_cmdline(node.ssh("cat /etc/kernel/cmdline").stdout)]
    assert not set(PROFILE_ARGS) & set(configured), configured
    assert set(SDBOOT_KEEP) <= set(configured), configured
    assert pending(result) == running_profile, result["reports"]
    assert node.boot_id() == boot_id, "rebooted with --reboot never"
    assert node.ssh("test -e /var/lib/provision/kernel.json").returncode == 1
    assert json.loads(node.ssh("cat /var/lib/provision/retired.json").stdout)["phases"] == ["kernel"]

    rc, result, err = retire()
    assert rc == 0, err[-3000:]
    assert result["hosts"]["pve-sdboot"]["changed"] == 0, result["hosts"]["pve-sdboot"]

    rc, result, err = apply(inv, runs, "--tags", "kernel", *limit)
    assert rc == 0, err[-3000:]
    assert set(PROFILE_ARGS) <= set(split_cmdline(node.ssh("cat /etc/kernel/cmdline").stdout))
    assert pending(result) != running_profile, result["reports"]
