"""The lab itself: fake GPUs, the Proxmox API, a container reboot, teardown.

Tests run in file order against the one session lab. The real GRUB and systemd-boot reboots are
tests/lab/test_kernel.py's: the product edits each bootloader's line and the node boots it.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from provision.lab import wheelhouse
from tests.lab.common import inside, pve_api, wait_task

LAB_CHANGES = {"ct"}  # tests/lab/conftest.py
LAB_NEEDS_UNCHANGED = {"kernel", "gpu", "sglang", "ct"}


def test_lab_status_reports_everything_running(lab):
    status = lab.status()
    assert status["up"] is True
    assert {v["name"]: v["running"] for v in status["vms"]} == {"pve-grub": True, "pve-sdboot": True}
    assert status["containers"][0]["running"] and status["pve"]["running"]
    assert status["accel"] in ("tcg", "kvm")


def test_vms_resume_from_their_booted_snapshot_with_the_clock_of_now(lab):
    # a first lab up on a machine boots each VM, saves it, and resumes it: every lab up ends resumed
    assert lab.state()["vms_resumed"] == len(lab.vms())
    for vm in lab.vms():
        assert vm.cached_snapshot(lab.state()["accel"]) is not None
        # the guest has been up longer than its qemu process has run: it did not boot in this process
        uptime = float(vm.ssh("cut -d' ' -f1 /proc/uptime").stdout)
        ticks = int(Path(f"/proc/{vm.pid()}/stat").read_text().rsplit(")", 1)[1].split()[19])
        qemu_age = float(Path("/proc/uptime").read_text().split()[0]) - ticks / os.sysconf("SC_CLK_TCK")
        assert uptime > qemu_age + 5, f"{vm.spec.name}: up {uptime:.0f}s, its qemu {qemu_age:.0f}s: it booted"
        off = float(vm.ssh("date +%s.%N").stdout) - time.time()
        assert abs(off) < 10, f"{vm.spec.name}: the resumed guest's clock is {off:.0f}s off"


def test_lab_leaves_the_callers_stdin_blocking(lab):
    # qemu and ssh make an inherited stdin non-blocking, and ansible then refuses to start
    # ("Ansible requires blocking IO"): the lab hands its children no stdin of ours
    lab.vm("pve-grub").ssh("true")
    assert os.get_blocking(0)


def test_hosts_look_like_pve_gpu_hosts(lab):
    for name in ("pve-grub", "pve-sdboot"):
        vm = lab.vm(name)
        assert "Kernel Module for x86_64  580.95.05" in vm.ssh("cat /proc/driver/nvidia/version").stdout
        assert vm.ssh("ls /proc/driver/nvidia/gpus").stdout.split() == ["0000:41:00.0", "0000:42:00.0"]
    grub_status = lab.vm("pve-grub").ssh("proxmox-boot-tool status")
    assert grub_status.returncode == 2 and "proxmox-boot-uuids does not exist" in grub_status.stderr
    sd_status = lab.vm("pve-sdboot").ssh("proxmox-boot-tool status")
    assert sd_status.returncode == 0 and "is configured with: uefi" in sd_status.stdout
    assert "System currently booted with uefi" in sd_status.stdout


def test_node_driver_makes_no_device_node_until_nvidia_modprobe_does(lab):
    # the real kernel module creates no /dev/nvidia* (docs/nvidia-node-h200.md); nvidia-modprobe does
    vm = lab.vm("pve-sdboot")  # no CT lives there: what this test makes cannot help a later test
    assert vm.ssh("ls /dev/nvidia* 2>/dev/null").stdout == "", "a fresh node has no NVIDIA device node"
    nodes = "/dev/nvidia1 /dev/nvidiactl /dev/nvidia-uvm /dev/nvidia-uvm-tools"
    assert vm.ssh("nvidia-modprobe -c 1 && test ! -e /dev/nvidiactl").returncode == 0, "-c N makes /dev/nvidiaN only"
    made = vm.ssh(f"nvidia-modprobe -c 255 && nvidia-modprobe -u -c 0 && stat -c '%n %a %U %t %T' {nodes}")
    nodes = {line.split()[0]: line.split()[1:] for line in made.stdout.splitlines()}
    assert nodes["/dev/nvidia1"] == ["666", "root", "c3", "1"]
    assert nodes["/dev/nvidiactl"] == ["666", "root", "c3", "ff"]
    assert nodes["/dev/nvidia-uvm"][2] != "c3", "nvidia-uvm has its own (dynamic) major"
    assert vm.ssh("test -e /dev/nvidia0").returncode != 0, "-c 1 makes only GPU 1"
    assert vm.ssh("nvidia-modprobe --bogus").returncode == 1
    # as root, nvidia-smi makes the GPUs' nodes itself, as the real one does through nvidia-modprobe
    smi = vm.ssh("nvidia-smi --query-gpu=index,driver_version --format=csv,noheader").stdout.split("\n")
    assert [line for line in smi if line] == ["0, 580.95.05", "1, 580.95.05"]


def test_nvidia_smi_reports_the_module_and_fails_on_a_mismatch(lab):
    vm = lab.vm("pve-sdboot")
    assert "DRIVER version      : 580.95.05" in vm.ssh("nvidia-smi --version").stdout
    vm.ssh("echo 580.65.06 > /etc/lab/driver_version")  # a userspace that does not match the module
    try:
        mismatch = vm.ssh("nvidia-smi --version")
    finally:
        vm.ssh("echo 580.95.05 > /etc/lab/driver_version")
    assert mismatch.returncode == 18 and "Driver/library version mismatch" in mismatch.stdout


def test_container_is_the_apis_and_has_systemd_but_no_gpu_yet(lab):
    ct = lab.container()
    out = ct.ssh("ls /dev/nvidia* 2>/dev/null; ps -p 1 -o comm=; ls /srv/provision-wheelhouse").stdout
    assert "/dev/nvidia" not in out, "no devN entry yet, so no node"
    assert "systemd" in out
    pin = wheelhouse.SGLANG_VERSION
    assert f"sglang_labserver-{pin}-py3-none-any.whl" in out and f"sglang-{pin}-" in out
    # the node's kernel module, as in an LXC, which shares its node's kernel
    assert "580.95.05" in ct.ssh("cat /proc/driver/nvidia/version").stdout


def test_api_refuses_a_devn_whose_path_is_missing_on_the_node(lab):
    from proxmoxer.core import ResourceException

    api = pve_api(lab)
    with pytest.raises(ResourceException) as refused:
        api.nodes("pve-grub").lxc(101).config.put(dev9="/dev/nvidia7,mode=0666")
    assert refused.value.status_code == 500 and "Device /dev/nvidia7 does not exist" in str(refused.value)
    assert "dev9" not in lab.pve_control("GET", "/ct/101")["config"]


def test_api_lifecycle_drives_the_container_and_prestart_refuses_a_missing_path(lab):
    api, ct = pve_api(lab), lab.container()
    lxc = api.nodes("pve-grub").lxc(101)
    # PVE 9 hot-plugs a new devN into the running CT: the node's major and minor, the entry's mode
    lxc.config.put(dev8="/dev/ttyS1,mode=0600")
    assert inside(ct, "/dev/ttyS1") == {"/dev/ttyS1": "600 0 0 4 41"}
    # a reboot from inside keeps it (LXC runs the hooks again with the config) and the node's driver view
    hot_boot = ct.boot_id()
    ct.ssh("systemctl reboot", timeout=20)
    ct.wait_for_ssh(120, not_boot_id=hot_boot)
    assert inside(ct, "/dev/ttyS1") == {"/dev/ttyS1": "600 0 0 4 41"}
    assert "580.95.05" in ct.ssh("cat /proc/driver/nvidia/version").stdout
    first_boot = ct.boot_id()
    assert wait_task(api, "pve-grub", lxc.status.stop.post())["exitstatus"] == "OK"
    assert not ct.is_running() and lxc.status.current.get()["status"] == "stopped"
    # a devN whose path the node lacks (written underneath, as an admin's edit of the file would be)
    lab.pve_control("POST", "/ct-config", {"vmid": 101, "set": {"dev9": "/dev/nvidia7"}})
    refused = wait_task(api, "pve-grub", lxc.status.start.post())
    assert "Could not get mode or device ID of /dev/nvidia7" in refused["exitstatus"], refused
    assert not ct.is_running() and lxc.status.current.get()["status"] == "stopped"
    lab.pve_control("POST", "/ct-config", {"vmid": 101, "delete": ["dev9"]})
    assert wait_task(api, "pve-grub", lxc.status.start.post())["exitstatus"] == "OK"
    assert ct.wait_for_ssh(120, not_boot_id=first_boot) != first_boot
    assert inside(ct, "/dev/ttyS1") == {"/dev/ttyS1": "600 0 0 4 41"}, "made again at start from the entry"
    # a delete on a running CT waits for its restart
    lxc.config.put(delete="dev8")
    assert inside(ct, "/dev/ttyS1") and "dev8" in lab.pve_control("GET", "/ct/101")["pending"]
    second_boot = ct.boot_id()
    assert wait_task(api, "pve-grub", lxc.status.reboot.post())["exitstatus"] == "OK"
    ct.wait_for_ssh(120, not_boot_id=second_boot)
    assert inside(ct, "/dev/ttyS1") == {} and lab.pve_control("GET", "/ct/101")["pending"] == {}


def test_api_create_makes_a_container_and_delete_removes_it(lab, tmp_path):
    """CT 150 through the API as `provision apply` creates a missing one: created stopped with root's key from
    `ssh-public-keys` and host keys made at create; started, reached over ssh with that key and a host key read
    from its rootfs on this side (never learnt on first use); a delete refused while it runs; stopped and deleted,
    nothing of it is left."""
    from proxmoxer.core import ResourceException

    from provision.lab.container import LabContainer
    from provision.lab.ctbody import TEMPLATE_VOLID

    api, grub = pve_api(lab), lab.vm("pve-grub")
    node = api.nodes("pve-grub")
    key = tmp_path / "id_ed25519"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "apply", "-f", str(key)], check=True)
    spec = {
        "vmid": 150,
        "ostemplate": TEMPLATE_VOLID,
        "hostname": "ct150",
        "rootfs": "local-lvm:8",
        "cores": 2,
        "memory": 2048,
        "swap": 512,
        "unprivileged": 1,
        "features": "nesting=1",
        "onboot": 0,
        "startup": "order=2",
        "net0": "name=eth0,bridge=vmbr0,ip=dhcp",
        "ssh-public-keys": Path(f"{key}.pub").read_text(),
    }
    try:
        assert wait_task(api, "pve-grub", node.lxc.post(**spec))["exitstatus"] == "OK"
        assert node.lxc(150).status.current.get()["status"] == "stopped", "a create without start=1 leaves it stopped"
        body = lab.created_containers()[150]
        assert not body.is_running()
        assert {
            "name": "ct150",
            "vmid": 150,
            "ssh": f"{body.spec.address}:22",
            "running": False,
            "created_through_api": True,
        } in lab.status()["containers"]
        # the host key made at create, read from the body's rootfs on this side: the only one ssh will accept
        host_key = (body.dir / "upper" / "etc" / "ssh" / "ssh_host_ed25519_key.pub").read_text().split()
        (tmp_path / "known_hosts").write_text(f"{body.spec.address} {host_key[0]} {host_key[1]}\n")
        ct = LabContainer(body.spec, body.dir, body.rootfs, key, tmp_path / "known_hosts", body.read_only_binds)
        assert wait_task(api, "pve-grub", node.lxc(150).status.start.post())["exitstatus"] == "OK"
        ct.wait_for_ssh(120)
        assert ct.ssh("hostname").stdout.strip() == "ct150"
        assert ct.ssh("cat /etc/ssh/ssh_host_ed25519_key.pub").stdout.split()[:2] == host_key[:2]
        assert host_key[2] == "root@ct150" and host_key[:2] != lab.container().known_hosts_line().split()[1:]
        # root's keys are the request's only: the lab's own client key is not let in
        denied = LabContainer(body.spec, body.dir, body.rootfs, lab.client_key, tmp_path / "known_hosts")
        assert "Permission denied" in denied.ssh("true", timeout=20).stderr
        # a controller learns a DHCP CT's address from the API, as from PVE (read inside the running CT)
        eth0 = next(i for i in node.lxc(150).interfaces.get() if i["name"] == "eth0")
        assert eth0["inet"] == f"{body.spec.address}/30"
        assert "hostname: ct150" in grub.ssh("cat /etc/pve/lxc/150.conf").stdout, "pmxcfs holds its config"
        with pytest.raises(ResourceException) as running:
            node.lxc(150).delete()
        assert running.value.status_code == 500
        assert "unable to destroy CT 150 - container is running" in str(running.value)
        assert ct.ssh("true").returncode == 0, "still there"
        assert wait_task(api, "pve-grub", node.lxc(150).status.stop.post())["exitstatus"] == "OK"
        assert not ct.is_running()
        assert wait_task(api, "pve-grub", node.lxc(150).delete())["exitstatus"] == "OK"
    finally:
        if 150 in lab.created_containers():  # a failure above leaves no CT behind for the modules after this one
            with contextlib.suppress(ResourceException):
                wait_task(api, "pve-grub", node.lxc(150).delete(force=1))
    assert not body.dir.exists() and 150 not in lab.created_containers()
    assert str(body.dir) not in subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True).stdout
    assert body.spec.netns not in subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert not Path(f"/sys/class/net/{body.spec.host_if}").exists()
    assert all(c["vmid"] != 150 for c in lab.status()["containers"])
    with pytest.raises(ResourceException) as gone:
        node.lxc(150).status.current.get()
    assert gone.value.status_code == 500 and "lxc/150.conf' does not exist" in str(gone.value)
    time.sleep(2)  # the node's copy follows within about a second (NodeConfigs)
    assert grub.ssh("test -e /etc/pve/lxc/150.conf").returncode == 1


def _reboot(machine, timeout=420) -> str:
    old = machine.boot_id()
    assert old
    machine.ssh("systemctl reboot", timeout=20)
    return machine.wait_for_ssh(timeout, not_boot_id=old)


def test_container_restart_keeps_state(lab):
    ct = lab.container()
    ct.ssh("echo kept > /root/marker")
    new = _reboot(ct, timeout=60)
    assert new
    assert ct.ssh("cat /root/marker").stdout.strip() == "kept"


def _proxmox(lab, **auth):
    from proxmoxer import ProxmoxAPI

    state = lab.state()
    return ProxmoxAPI("127.0.0.1", port=state["pve_port"], verify_ssl=str(lab.dir / "pve.crt"), service="PVE", **auth)


def test_fakepve_with_ticket_and_token(lab):
    secrets = lab.secrets()
    by_ticket = _proxmox(lab, user="root@pam", password=secrets["pve_password"])
    by_token = _proxmox(lab, user="root@pam", token_name="provision", token_value=secrets["pve_token_secret"])
    for api in (by_ticket, by_token):
        config = api.nodes("pve-grub").lxc(101).config.get()
        assert config["hostname"] == "sglang-01" and "digest" in config
        assert {n["node"] for n in api.nodes.get()} == {"pve-grub", "pve-sdboot"}


def test_fakepve_faults_can_be_injected(lab):
    from proxmoxer.core import ResourceException

    api = _proxmox(lab, user="root@pam", password=lab.secrets()["pve_password"])
    lab.pve_control(
        "POST",
        "/fail",
        {
            "method": "GET",
            "suffix": "/nodes/pve-grub/lxc/101/config",
            "status": 596,
            "message": "Broken pipe",
            "times": 1,
        },
    )
    with pytest.raises(ResourceException) as exc:
        api.nodes("pve-grub").lxc(101).config.get()
    assert exc.value.status_code == 596
    assert api.nodes("pve-grub").lxc(101).config.get()["hostname"] == "sglang-01"
    before = lab.pve_control("GET", "/ct/101")["digest"]
    after = lab.pve_control("POST", "/ct-config", {"vmid": 101, "set": {"description": "changed underneath"}})
    assert after["digest"] != before


def test_failed_lab_up_leaves_nothing_behind(lab_env, tmp_path, monkeypatch):
    from provision.errors import ProvisionError
    from provision.lab.lab import Lab
    from provision.lab.vm import LabVm

    def no_boot(self, timeout, not_boot_id=None):
        raise ProvisionError("injected: the guest never answers")

    monkeypatch.setattr(LabVm, "wait_for_ssh", no_boot)
    monkeypatch.setenv("PROVISION_LAB_INVENTORY", str(tmp_path / "inventory" / "lab"))
    # a short directory: qemu's monitor socket path must stay under 108 bytes, which an xdist worker's tmp_path of
    # this test's name passes
    short = Path(tempfile.mkdtemp(prefix="plab-"))
    broken = Lab(dir=short / "broken-lab", net_index=7)
    try:
        with pytest.raises(ProvisionError, match="never answers"):
            broken.up(hosts=1, progress=lambda msg: None)
        time.sleep(1)
        procs = subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True).stdout
        assert str(broken.dir) not in procs, "a process of the failed lab is still running"
        assert str(broken.dir) not in Path("/proc/mounts").read_text()
        assert "provision-lab-7" not in subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
        assert not broken.dir.exists()
    finally:
        shutil.rmtree(short, ignore_errors=True)


def test_standin_refuses_unknown_flags_and_serves_the_api(lab, tmp_path):
    """The stand-in from the lab's wheelhouse, run here: argparse refusal, readiness, drain."""
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    subprocess.run(
        [
            str(venv / "bin/pip"),
            "install",
            "-q",
            "--no-index",
            "--find-links",
            str(lab.dir / "wheelhouse"),
            "sglang_labserver",
        ],
        check=True,
    )
    py = str(venv / "bin/python")
    bad = subprocess.run(
        [py, "-m", "sglang_labserver.launch_server", "--model-path", "m", "--no-such-flag"],
        capture_output=True,
        text=True,
    )
    assert bad.returncode == 2 and "unrecognized arguments: --no-such-flag" in bad.stderr
    port = 32000 + os.getpid() % 1000
    proc = subprocess.Popen(
        [
            py,
            "-m",
            "sglang_labserver.launch_server",
            "--model-path",
            "/m",
            "--port",
            str(port),
            "--tp",
            "2",
            "--disable-custom-all-reduce",
        ],
        env={**os.environ, "SGLANG_LABSERVER_STARTUP_S": "3", "NCCL_P2P_DISABLE": "1"},
        stderr=subprocess.PIPE,
        text=True,
    )
    import urllib.error
    import urllib.request

    def get(path):
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as r:
                return r.status, r.read()
        except urllib.error.HTTPError as e:
            return e.code, b""
        except OSError:
            return None, b""

    try:
        time.sleep(1)
        # real SGLang binds its port only once the model is loaded (http_server.py): nothing answers yet
        assert get("/health")[0] is None, "must not listen while loading"
        deadline = time.monotonic() + 20
        while get("/health")[0] != 200 and time.monotonic() < deadline:
            time.sleep(0.3)
        assert get("/ready")[0] == 200
        info = json.loads(get("/server_info")[1])
        assert info["tp_size"] == 2 and info["disable_custom_all_reduce"] is True
        assert info["max_total_num_tokens"] == 780820
        assert json.loads(get("/lab/env")[1])["env"]["NCCL_P2P_DISABLE"] == "1"
    finally:
        proc.terminate()
        _, err = proc.communicate(timeout=20)
    assert "SIGTERM received" in err and "Draining" in err
