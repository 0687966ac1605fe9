"""A bare host to a verified endpoint, and the driver phase on a node that has no NVIDIA driver
(`provision lab up --bare --hosts 1`: no driver on the node, no CT 101, no weights; the inventory names sglang-01 as
CT 101 to create from its proxmox_ct_spec, its weights from the lab's hub).

One bare node, the GRUB one: the acceptance is one bare host to an endpoint, and a second node (systemd-boot) cost
this module about 3 minutes of CI, in its trial boot and its serial driver install, for nothing the driver phase does
differently there (the role has no bootloader step; update-initramfs's own hooks sync an ESP). The kernel phase's
systemd-boot path is the normal lab's (tests/lab/test_kernel.py); `provision lab up --bare` keeps two nodes
(docs/lab.md).

One apply with no --limit and no --tags takes the bare lab to a verified endpoint (the driver on the node, CT 101
created and running, the weights checked against the hub, SGLang answering), verify passes, and a second apply changes
nothing; it runs on the lab as `lab up --bare` left it (the plan and the refused sha256 before it change nothing), and
prints the timings of each step (docs/lab.md). The driver tests then run on the nodes only (`--limit`: the create in
playbooks/facts.yml runs whatever the tags): plan says what the phase would do, each step a pending change, and changes
nothing (before the apply); the phase run again in full changes nothing; a node without a pin is not managed; a new pin
with reboots off stops before anything changes; a new pin upgrades, and the node reboots (through the kernel phase's
safe reboot) into the new module, which the old one's holder kept out. Before the apply, on a node with no driver yet, a
wrong sha256 stops the phase before anything is installed, naming the file, and leaves nothing the apply would find.

The module brings up a bare lab of its own (the session's lab goes down first) and leaves the lab down: the next lab
module, if any, brings a normal one up (tests/lab/conftest.py, LAB_CHANGES "down"). The nodes' apt mirror
holds no headers for the kernel they boot and no dkms package (the phase's headers and dkms lists are empty in the lab's
inventory), and they cannot build a module: the stand-in installer and dkms stand-in are what they run (docs/lab.md).
A kernel update without headers (`provision lab kernel`) fails verify until the driver phase builds for it, and the
node then boots it with the module, before the upgrade tests, which then run on that kernel."""

from __future__ import annotations

import hashlib
import json
import time

import pytest

from provision.lab import hfhub, wheelhouse
from provision.lab.lab import CONTAINER_NAME, CONTAINER_VMID, DRIVER_VERSION, NODE_DRIVER_MIRROR, _pipe_to_node
from provision.lab.specs import HUB_MODEL_PATH
from tests.conftest import run_provision
from tests.lab.common import apply, as_root, boots, failed_checks, set_host_vars, wait_ready

# tests/lab/conftest.py: it changes only its own bare lab, and leaves the lab down
LAB_CHANGES = {"down"}
LAB_NODES = None  # its own bare lab (VMs)
UPGRADE = "580.105.08"
NODES = ("pve-grub",)  # the bare lab's one node (the module's docstring says why one)
ONLY_NODES = ("--limit", ",".join(NODES))  # facts.yml creates a missing CT on every run, whatever the tags
BLACKLIST = "/etc/modprobe.d/provision-blacklist-nouveau.conf"


@pytest.fixture(scope="module")
def bare(lab):
    lab.down(progress=lambda msg: None)
    lab.up(hosts=len(NODES), bare=True, progress=lambda msg: print(msg, flush=True))
    yield lab
    lab.down(progress=lambda msg: None)


@pytest.fixture(scope="module")
def inventory(bare):
    from provision.lab.lab import inventory_dir

    return inventory_dir()


def verify(inventory, runs, *extra) -> tuple[int, dict]:
    proc = run_provision(
        "verify", "--inventory", str(inventory), "--json", "--runs-dir", str(runs), *extra, timeout=1800
    )
    return proc.returncode, json.loads(proc.stdout)["result"] if proc.stdout.strip() else {}


def node_state(vm) -> dict:
    out = vm.ssh(
        'echo "version=$(cat /proc/driver/nvidia/version 2>/dev/null | head -1)"; '
        "echo dkms=$(dkms status -m nvidia | tr '\\n' ';'); "
        f"echo blacklist=$(test -e {BLACKLIST} && echo yes); "
        "echo download=$(ls /var/lib/provision/downloads 2>/dev/null); "
        "echo persistenced=$(systemctl is-active nvidia-persistenced 2>/dev/null)"
    ).stdout
    return dict(line.split("=", 1) for line in out.splitlines() if "=" in line)


def test_bare_nodes_have_no_driver_and_no_container(bare):
    for name in NODES:
        state = node_state(bare.vm(name))
        assert state["version"] == "" and state["dkms"] == "" and state["blacklist"] == "", (name, state)
    assert bare.state()["containers"] == [] and bare.created_containers() == {}


def test_plan_lists_the_driver_as_pending_and_changes_nothing(bare, inventory, tmp_path):
    proc = run_provision(
        "plan",
        "--inventory",
        str(inventory),
        "--tags",
        "driver",
        *ONLY_NODES,
        "--json",
        "--runs-dir",
        str(tmp_path),
        timeout=900,
    )
    assert proc.returncode == 4, proc.stderr[-2000:]
    envelope = json.loads(proc.stdout)
    assert envelope["hosts"] == dict.fromkeys(NODES, "changes pending")
    for name in NODES:
        assert node_state(bare.vm(name))["blacklist"] == ""
        # each step check mode cannot run is listed as a change: the initramfs rebuild, the installer
        pending = envelope["result"]["would_change"][name]
        assert "Report the initramfs to be rebuilt without nouveau (check mode)" in pending, pending
        assert "Report the NVIDIA installer to be run (check mode)" in pending, pending


def test_a_wrong_sha256_stops_before_anything_is_installed_naming_the_file(bare, inventory, tmp_path):
    """On a node with no driver (before the apply below installs one): nothing of the phase is left, so the apply
    after it starts from a node as bare as `lab up --bare` left it."""
    wrong = "0" * 64
    set_host_vars(inventory, "pve-grub", {"nvidia_driver_installer_sha256": wrong})
    try:
        code, result, err = apply(inventory, tmp_path, "--tags", "driver", "--limit", "pve-grub")
    finally:
        set_host_vars(inventory, "pve-grub", None)
    source = f"{NODE_DRIVER_MIRROR}/NVIDIA-Linux-x86_64-{DRIVER_VERSION}.run"
    assert code == 1, err[-2000:]
    said = " ".join(f["message"] for f in result["failures"])
    assert f"{source} has sha256" in said and f"not nvidia_driver_installer_sha256 ({wrong})" in said, said
    state = node_state(bare.vm("pve-grub"))
    assert (state["version"], state["dkms"], state["blacklist"], state["download"]) == ("", "", "", ""), state


def test_one_apply_takes_the_bare_host_to_a_verified_endpoint(bare, inventory, tmp_path, capsys):
    """The bare-host acceptance, on the lab as `lab up --bare` left it (the plan and the refused sha256 before changed
    nothing): `provision apply --inventory lab --yes` with no --limit and no --tags, then `provision verify`, then a
    second apply that changes nothing on any host. Prints each step's time (docs/lab.md)."""
    token = bare.hf_token_file.read_text().strip()
    took: dict[str, float] = {}
    start = time.monotonic()
    code, _, err = apply(inventory, tmp_path / "first")
    took["apply"] = time.monotonic() - start
    assert code == 0, err[-3000:]
    for name in NODES:  # the driver installed with DKMS and loaded
        state = node_state(bare.vm(name))
        assert f"x86_64  {DRIVER_VERSION}" in state["version"], (name, state)
        assert state["dkms"].startswith(f"nvidia/{DRIVER_VERSION}, ") and state["dkms"].endswith(": installed;")
        assert state["blacklist"] == "yes" and state["persistenced"] == "active", (name, state)
    ct = bare.pve_control("GET", f"/ct/{CONTAINER_VMID}")  # created through the API, and running
    assert ct["status"] == "running" and ct["config"]["hostname"] == CONTAINER_NAME, ct
    body = as_root(bare, bare.created_containers()[CONTAINER_VMID])
    # the gpu phase ran in it: its userspace matches the driver the node loaded after the CT started
    assert body.ssh("nvidia-smi --version").stdout.count(f"DRIVER version      : {DRIVER_VERSION}") == 1
    for f in hfhub.tiny_repo().files:  # the weights, as the hub serves them
        assert body.ssh(f"sha256sum {HUB_MODEL_PATH}/{f.path}").stdout.split()[:1] == [f.sha256], f.path
    assert body.ssh("curl -sf localhost:30000/health").returncode == 0
    assert not [p for p in (tmp_path / "first").rglob("*") if p.is_file() and token in p.read_text(errors="replace")]

    start = time.monotonic()
    proc = run_provision(
        "verify", "--inventory", str(inventory), "--json", "--runs-dir", str(tmp_path / "verify"), timeout=1200
    )
    took["verify"] = time.monotonic() - start
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]

    start = time.monotonic()
    code, second, err = apply(inventory, tmp_path / "second")
    took["second apply"] = time.monotonic() - start
    assert code == 0, err[-3000:]
    assert {h: s["changed"] for h, s in second["hosts"].items()} == dict.fromkeys([*NODES, CONTAINER_NAME], 0)
    with capsys.disabled():  # shown without -s: the figures go into docs/lab.md
        steps = ", ".join(f"{step} {seconds:.0f} s" for step, seconds in took.items())
        print(f"\nbare host to endpoint: {steps}; lab up --bare: {bare.state().get('timings')}", flush=True)


def test_the_driver_phase_run_again_in_full_changes_nothing(bare, inventory, tmp_path):
    """After the apply above: every task of the phase runs (--full) and changes nothing; the driver stays loaded."""
    code, again, err = apply(inventory, tmp_path, "--tags", "driver", *ONLY_NODES, "--full")
    assert code == 0, err[-3000:]
    assert {h: s["changed"] for h, s in again["hosts"].items()} == dict.fromkeys(NODES, 0)
    for name in NODES:
        state = node_state(bare.vm(name))
        assert f"x86_64  {DRIVER_VERSION}" in state["version"] and state["persistenced"] == "active", (name, state)


def test_a_node_without_a_pin_is_not_managed_and_the_phase_says_so(bare, inventory, tmp_path):
    """No nvidia_driver_version for the node, after the apply installed one: the phase reads it, reports
    one line and changes nothing; inventory check accepts it."""
    set_host_vars(inventory, "pve-grub", {"nvidia_driver_version": ""})
    try:
        code, result, err = apply(inventory, tmp_path, "--tags", "driver", "--limit", "pve-grub", "--full")
    finally:
        set_host_vars(inventory, "pve-grub", None)
    assert code == 0, err[-3000:]
    assert result["hosts"]["pve-grub"]["changed"] == 0
    said = result["reports"]["pve-grub"]
    assert f"driver not managed (nvidia_driver_version is not set), skipped: NVIDIA module {DRIVER_VERSION} loaded" in (
        said
    ), said
    assert node_state(bare.vm("pve-grub"))["persistenced"] == "active"


def test_a_kernel_update_without_headers_fails_verify_until_apply_builds_for_it_and_the_node_boots_it(
    bare, inventory, tmp_path
):
    """A newer kernel installed without its headers (a kernel update on a node without proxmox-default-headers):
    DKMS builds nothing for it, and dkms's hook says so. Before any reboot, verify exits 1 naming that kernel; the
    driver phase installs its headers and DKMS builds the pinned module for it, with no reboot; verify passes; the
    node then reboots by itself into that kernel, with the module loaded and /dev/nvidiactl made by the boot unit,
    and its onboot container serves. verify then asks for the kernel phase's findings of that boot, and passes once
    apply has recorded them."""
    vm = bare.vm("pve-grub")
    running = vm.ssh("uname -r").stdout.strip()
    release = bare.install_kernel("pve-grub")
    assert release != running and vm.ssh(f"test ! -e /lib/modules/{release}/build").returncode == 0
    assert f"nvidia/{DRIVER_VERSION}, {release}" not in node_state(vm)["dkms"]
    code, report = verify(inventory, tmp_path / "runs", "--limit", "pve-grub", "--checks", "kernel_booted_next")
    said = failed_checks(report).get(("pve-grub", "test_the_kernel_booted_next_has_the_nvidia_module"), "")
    assert code == 1 and f"the kernel the node boots next, {release}, has no NVIDIA module" in said, report

    # the lab's apt repository names headers as Debian does (linux-headers-<release>)
    set_host_vars(inventory, "pve-grub", {"nvidia_driver_headers_packages": ["linux-headers-{kernel}"]})
    try:
        before = boots(vm)
        code, _, err = apply(inventory, tmp_path / "runs", "--tags", "driver", *ONLY_NODES)
        assert code == 0, err[-3000:]
        assert boots(vm) == before, "a build for the next kernel needs no reboot"
        assert f"nvidia/{DRIVER_VERSION}, {release}, x86_64: installed" in node_state(vm)["dkms"]
        code, report = verify(inventory, tmp_path / "runs", "--limit", "pve-grub", "--checks", "kernel_booted_next")
        assert code == 0, failed_checks(report)

        ct = as_root(bare, bare.created_containers()[CONTAINER_VMID])
        old, old_ct = vm.boot_id(), ct.boot_id()
        vm.ssh("systemctl reboot")
        deadline = time.monotonic() + 420
        while vm.boot_id() in (None, old) or ct.boot_id() in (None, old_ct):  # the onboot CT, from pve-guests
            assert time.monotonic() < deadline, "pve-grub and its onboot CT did not come back within 420 s"
            time.sleep(2)
        assert vm.ssh("uname -r").stdout.strip() == release
        assert f"x86_64  {DRIVER_VERSION}" in node_state(vm)["version"]
        wait_ready(ct, 300)
        assert ct.ssh("curl -sf localhost:30000/health").returncode == 0, "the CT does not serve after the reboot"
        # made by the boot unit before pve-guests (the lab's nvidia-modprobe makes /dev/nvidiactl for -c 255 only)
        unit = vm.ssh(
            "systemctl is-active provision-nvidia-nodes; systemctl show -p Result --value "
            "provision-nvidia-nodes; stat -c %F /dev/nvidiactl"
        )
        assert unit.stdout.split("\n") == ["active", "success", "character special file", ""], unit.stdout
        # a reboot outside provision: the kernel findings (the IOMMU's mode, SEV-SNP) are recorded per boot by the
        # kernel phase, and verify names them, and only them, until it has run in this boot
        code, report = verify(inventory, tmp_path / "runs")
        findings = {("pve-grub", "test_iommu_and_snp_findings"), ("pve-grub", "test_sev_snp_proven")}
        assert code == 1 and set(failed_checks(report)) == findings, failed_checks(report)
        assert {failed_checks(report)[f] for f in findings} == {
            "the findings are from an earlier boot: run provision apply --tags kernel"
        }
        code, _, err = apply(inventory, tmp_path / "runs", "--tags", "kernel", *ONLY_NODES)
        assert code == 0, err[-3000:]
        code, report = verify(inventory, tmp_path / "runs")
        assert code == 0, failed_checks(report)
    finally:
        set_host_vars(inventory, "pve-grub", None)


def test_an_upgrade_that_may_not_reboot_stops_before_anything_changes(bare, inventory, tmp_path):
    """--reboot never, a new pin beside the loaded module: one line, and the node as it was: the old
    module loaded and in DKMS, nvidia-persistenced still running, nothing downloaded, no reboot."""
    vm = bare.vm("pve-grub")
    new = wheelhouse.build_fake_nvidia_installer(tmp_path, UPGRADE)
    _pipe_to_node(vm, f"cat > {NODE_DRIVER_MIRROR}/{new.name}", new.read_text(), f"write {new.name}")
    before, sha = boots(vm), hashlib.sha256(new.read_bytes()).hexdigest()
    set_host_vars(inventory, "pve-grub", {"nvidia_driver_version": UPGRADE, "nvidia_driver_installer_sha256": sha})
    try:
        code, result, err = apply(
            inventory, tmp_path / "runs", "--tags", "driver", "--limit", "pve-grub", "--reboot", "never"
        )
    finally:
        set_host_vars(inventory, "pve-grub", None)
    assert code == 1, err[-3000:]
    said = " ".join(f["message"] for f in result["failures"])
    assert f"driver {DRIVER_VERSION} is loaded, and upgrading it to {UPGRADE} needs a reboot" in said, said
    state = node_state(vm)
    assert f"x86_64  {DRIVER_VERSION}" in state["version"] and state["dkms"].startswith(f"nvidia/{DRIVER_VERSION}, ")
    assert state["persistenced"] == "active" and UPGRADE not in state["download"], state
    assert boots(vm) == before


def test_a_new_pin_upgrades_and_reboots_into_the_new_module(bare, inventory, tmp_path):
    vm = bare.vm("pve-grub")
    new = wheelhouse.build_fake_nvidia_installer(tmp_path, UPGRADE)
    target = f"{NODE_DRIVER_MIRROR}/{new.name}"
    _pipe_to_node(vm, f"cat > {target}", new.read_text(), f"write {target}")
    before = boots(vm)
    sha = hashlib.sha256(new.read_bytes()).hexdigest()
    set_host_vars(inventory, "pve-grub", {"nvidia_driver_version": UPGRADE, "nvidia_driver_installer_sha256": sha})
    try:
        code, _, err = apply(inventory, tmp_path / "runs", "--tags", "driver", "--limit", "pve-grub")
        assert code == 0, err[-3000:]
        state = node_state(vm)
        # the lab's old module cannot be unloaded (as one a CUDA process holds): the node rebooted into the new one
        assert boots(vm) == before + 1
        assert f"x86_64  {UPGRADE}" in state["version"] and state["dkms"].count("nvidia/") == 1, state
        assert vm.ssh("nvidia-smi --version").stdout.count(f"DRIVER version      : {UPGRADE}") == 1
    finally:
        set_host_vars(inventory, "pve-grub", None)
