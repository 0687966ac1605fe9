"""The GPU passthrough phase against the lab's Proxmox API (fakepve, PVE 9 schema) and container.

The lab's PVE runs the container: a new devN on a running container hot-plugs (PVE 9; none on PVE 8); an
edited one stays pending until the container reboots, which the role then does once. Every start makes
the nodes inside from the devN entries and refuses a path missing on the node.

A wrong password, an API that keeps failing (500, 596: retried, then one clear line) and a task that ends in
an error are rows of the fault matrix, run against fakepve in process with the same module
(tests/unit/plugins/modules/test_proxmox_lxc_gpu_faults.py, docs/reliability.md). The lab keeps the errors that
need its own TLS endpoint, a closed port and a real token.
"""

from __future__ import annotations

import base64
import json
import os
import subprocess
from pathlib import Path

import pytest

from tests.conftest import run_provision
from tests.lab.common import apply, inside, interrupt_at, pve_api, set_host_vars, wait_task

LAB_CHANGES = {"gpu", "ct"}  # tests/lab/conftest.py
LAB_NEEDS_UNCHANGED = {"gpu"}
LAB_NODES = "nspawn"  # no bootloader, no kernel line changed: nodes as nspawn containers (docs/lab.md)

VMID = 101
CONFIG_PATH = f"/nodes/pve-grub/lxc/{VMID}/config"
OUR_PATHS = {
    "/dev/nvidia0",
    "/dev/nvidia1",
    "/dev/nvidiactl",
    "/dev/nvidia-uvm",
    "/dev/nvidia-uvm-tools",
    "/dev/nvidia-modeset",
    "/dev/nvidia-caps/nvidia-cap1",
    "/dev/nvidia-caps/nvidia-cap2",
}


def ct_config(lab) -> dict:
    return lab.pve_control("GET", f"/ct/{VMID}")


def dev_entries(config: dict) -> dict[str, str]:
    return {k: v for k, v in config.items() if k.startswith("dev") and k[3:].isdigit()}


def puts(lab) -> int:
    return sum(
        1 for method, path in lab.pve_control("GET", "/requests") if method == "PUT" and path.endswith("/config")
    )


def reboots(lab) -> int:
    return sum(1 for m, p in lab.pve_control("GET", "/requests") if m == "POST" and p.endswith("/status/reboot"))


def drop_our_entries(lab, restart: bool = False) -> None:
    """Delete our devN entries underneath (the running CT keeps its nodes), or with `restart` through the API
    and a reboot, so the container loses them too."""
    config = ct_config(lab)["config"]
    ours = [k for k, v in dev_entries(config).items() if v.split(",")[0].replace("path=", "") in OUR_PATHS]
    if not restart:
        lab.pve_control("POST", "/ct-config", {"vmid": VMID, "delete": ours})
        return
    api, ct = pve_api(lab), lab.container()
    lxc = api.nodes("pve-grub").lxc(VMID)
    if ours:  # PVE refuses a PUT with nothing in it ("no options specified")
        lxc.config.put(delete=",".join(ours))
    old = ct.boot_id()
    assert wait_task(api, "pve-grub", lxc.status.reboot.post())["exitstatus"] == "OK"
    ct.wait_for_ssh(120, not_boot_id=old)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    return tmp_path_factory.mktemp("gpu-runs")


@pytest.fixture
def inv(lab_inventory):
    yield lab_inventory
    set_host_vars(lab_inventory, "sglang-01", None)


def test_plan_on_a_node_whose_boot_unit_never_ran_says_the_entries_wait_for_it(lab, inv, runs):
    """Check mode writes no unit, so it cannot ask systemd to start one, and the node has no device node for the
    entries yet: plan lists the gpu phase as pending, says why the entries are not listed, and writes nothing."""
    node = lab.vm("pve-grub")
    assert node.ssh("test -e /etc/systemd/system/provision-nvidia-nodes.service").returncode != 0
    proc = run_provision(
        "plan", "--inventory", str(inv), "--tags", "gpu", "--json", "--runs-dir", str(runs), timeout=600
    )
    envelope = json.loads(proc.stdout)
    assert proc.returncode == 4 and envelope["hosts"]["sglang-01"] == "changes pending", proc.stderr[-3000:]
    said = " ".join(envelope["result"]["reports"]["sglang-01"])
    assert "its NVIDIA device nodes are not all made yet (apply makes them with the boot unit)" in said, said
    assert node.ssh("test -e /etc/systemd/system/provision-nvidia-nodes.service").returncode != 0
    assert dev_entries(ct_config(lab)["config"]) == {}, "plan wrote devN entries"


def test_fresh_container_gets_its_entries_and_the_userspace(lab, inv, runs):
    rc, result, err = apply(inv, runs, "--tags", "gpu")
    assert rc == 0, err[-3000:]
    entries = dev_entries(ct_config(lab)["config"])
    assert {v.split(",")[0] for v in entries.values()} == OUR_PATHS
    assert entries["dev0"] == "/dev/nvidia0,mode=0666"
    assert any("written" in m for m in result["reports"]["sglang-01"])
    ct = lab.container()
    assert ct.ssh("nvidia-smi --version").stdout.count("DRIVER version      : 580.95.05") == 1
    node = lab.vm("pve-grub")
    assert node.ssh("systemctl is-enabled provision-nvidia-nodes.service").stdout.strip() == "enabled"
    # hot-plugged (PVE 9) from the entries: the node's majors, the entries' modes
    nodes = inside(ct, "/dev/nvidia0 /dev/nvidia1 /dev/nvidiactl /dev/nvidia-uvm /dev/nvidia-caps/nvidia-cap1")
    assert nodes["/dev/nvidia0"] == "666 0 0 c3 0" and nodes["/dev/nvidiactl"] == "666 0 0 c3 ff"
    assert nodes["/dev/nvidia-caps/nvidia-cap1"].startswith("400 "), "a cap keeps the node's mode"


def test_second_run_changes_nothing_and_writes_nothing(lab, inv, runs):
    before = puts(lab)
    rc, result, err = apply(inv, runs, "--tags", "gpu")
    assert rc == 0, err[-2000:]
    assert result["hosts"]["sglang-01"]["changed"] == 0
    assert puts(lab) == before, "a converged container must get no API write"


def test_unrelated_dev_and_mp_entries_are_kept(lab, inv, runs):
    drop_our_entries(lab)
    # a node path that exists on the node: the lab's PVE, like PVE, refuses to start a CT otherwise
    lab.pve_control(
        "POST",
        "/ct-config",
        {"vmid": VMID, "set": {"dev0": "/dev/net/tun", "mp0": "local-lvm:vm-101-disk-1,mp=/srv/models,size=8G"}},
    )
    rc, _, err = apply(inv, runs, "--tags", "gpu")
    assert rc == 0, err[-2000:]
    config = ct_config(lab)["config"]
    assert config["dev0"] == "/dev/net/tun" and config["mp0"].startswith("local-lvm:vm-101-disk-1")
    assert {v.split(",")[0] for k, v in dev_entries(config).items() if k != "dev0"} == OUR_PATHS


def test_edited_entry_is_pending_and_the_container_restarts_once(lab, inv, runs):
    set_host_vars(inv, "sglang-01", {"gpu_passthrough_mode": "0660"})
    before = reboots(lab)  # the lab tests before this one rebooted the CT through the API too
    rc, result, err = apply(inv, runs, "--tags", "gpu")
    assert rc == 0, err[-2000:]
    assert reboots(lab) == before + 1
    assert any("container rebooted" in m for m in result["reports"]["sglang-01"])
    show = ct_config(lab)
    assert show["pending"] == {} and "mode=0660" in show["config"]["dev1"] + show["config"]["dev2"]


def test_modified_configuration_is_retried_and_ends_correct(lab, inv, runs):
    drop_our_entries(lab)
    modified = "detected modified configuration - file changed by other user? Try again."
    lab.pve_control(
        "POST", "/fail", {"method": "PUT", "suffix": CONFIG_PATH, "status": 500, "message": modified, "times": 1}
    )
    rc, _, err = apply(inv, runs, "--tags", "gpu")
    assert rc == 0, err[-2000:]
    assert {v.split(",")[0] for v in dev_entries(ct_config(lab)["config"]).values()} >= OUR_PATHS


def test_token_auth_explains_the_root_pam_rule_and_changes_nothing(lab, inv, runs):
    drop_our_entries(lab)
    digest = ct_config(lab)["digest"]
    set_host_vars(
        inv,
        "sglang-01",
        {
            "proxmox_api_token_id": "provision",
            "proxmox_api_token_secret": "{{ lookup('ansible.builtin.env', 'PROXMOX_TOKEN_SECRET') }}",
        },
    )
    rc, result, _ = apply(inv, runs, "--tags", "gpu", env={"PROXMOX_TOKEN_SECRET": lab.secrets()["pve_token_secret"]})
    assert rc == 1
    message = " ".join(f["message"] for f in result["failures"])
    assert "only root@pam" in message and "ticket login" in message, message
    assert "Traceback" not in message
    assert ct_config(lab)["digest"] == digest, "the config must be untouched"


def test_wrong_ca_is_a_clear_tls_error(lab, inv, runs, tmp_path):
    from fakepve.certs import make_cert

    other_ca, _, _ = make_cert(str(tmp_path), name="other")
    set_host_vars(inv, "sglang-01", {"proxmox_api_ca_file": other_ca})
    rc, result, _ = apply(inv, runs, "--tags", "gpu")
    assert rc == 1
    message = " ".join(f["message"] for f in result["failures"])
    assert "TLS verification of https://127.0.0.1" in message and "proxmox_api_ca_file" in message


def test_api_that_is_down_gets_a_clear_error(lab, inv, runs):
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        dead = s.getsockname()[1]
    set_host_vars(inv, "sglang-01", {"proxmox_api_port": dead})
    rc, result, _ = apply(inv, runs, "--tags", "gpu")
    assert rc == 1
    assert "keeps failing" in " ".join(f["message"] for f in result["failures"])


def test_root_pam_with_a_totp_second_factor_stops_at_the_login_then_converges_with_its_secret(lab, inv, runs):
    """The lab's API asks root@pam for a TOTP code, as PVE does for a user with a TOTP entry: without
    proxmox_api_totp_secret the gpu phase stops at the login with one line, the config untouched; with it (vaulted or
    from the environment) the phase logs in and writes the entries, and the secret is in no run record."""
    drop_our_entries(lab)
    digest = ct_config(lab)["digest"]
    secret = base64.b32encode(os.urandom(20)).decode()
    lab.pve_control("POST", "/settings", {"totp_secrets": {"root@pam": secret}})
    try:
        rc, result, _ = apply(inv, runs, "--tags", "gpu")
        message = " ".join(f["message"] for f in result["failures"])
        assert rc == 1 and "root@pam at https://127.0.0.1:" in message, message
        assert "asks for a second factor (TFA): set proxmox_api_totp_secret" in message, message
        assert ct_config(lab)["digest"] == digest, "the config must be untouched"
        set_host_vars(inv, "sglang-01", {"proxmox_api_totp_secret": "{{ lookup('ansible.builtin.env', 'PVE_TOTP') }}"})
        rc, _, err = apply(inv, runs, "--tags", "gpu", env={"PVE_TOTP": secret})
        assert rc == 0, err[-2000:]
    finally:
        lab.pve_control("POST", "/settings", {"totp_secrets": {}})
    written = {v.split(",")[0].replace("path=", "") for v in dev_entries(ct_config(lab)["config"]).values()}
    assert OUR_PATHS.issubset(written), written
    leaked = [p for p in runs.rglob("*") if p.is_file() and secret.encode() in p.read_bytes()]
    assert not leaked, leaked


def test_device_nodes_inside_follow_the_entries_and_apply_puts_them_back(lab, inv, runs):
    rc, _, err = apply(inv, runs, "--tags", "gpu")  # from whatever the error tests above left
    assert rc == 0, err[-2000:]
    api, ct = pve_api(lab), lab.container()
    lxc = api.nodes("pve-grub").lxc(VMID)
    entries = dev_entries(ct_config(lab)["config"])
    key = {v.split(",")[0]: k for k, v in entries.items()}
    lxc.config.put(**{key["/dev/nvidia1"]: "/dev/nvidia1,mode=0600"}, delete=key["/dev/nvidia-uvm-tools"])
    old = ct.boot_id()
    assert wait_task(api, "pve-grub", lxc.status.reboot.post())["exitstatus"] == "OK"
    ct.wait_for_ssh(120, not_boot_id=old)
    nodes = inside(ct, "/dev/nvidia1 /dev/nvidia-uvm-tools /dev/nvidia0")
    assert nodes["/dev/nvidia1"].startswith("600 ") and "/dev/nvidia-uvm-tools" not in nodes
    rc, _, err = apply(inv, runs, "--tags", "gpu")
    assert rc == 0, err[-2000:]
    nodes = inside(ct, "/dev/nvidia1 /dev/nvidia-uvm-tools")
    assert nodes["/dev/nvidia1"].startswith("666 ") and nodes["/dev/nvidia-uvm-tools"].startswith("666 ")


def test_a_change_left_pending_by_an_earlier_run_is_applied(lab, inv, runs):
    set_host_vars(inv, "sglang-01", {"gpu_passthrough_mode": "0660", "gpu_passthrough_restart": "never"})
    rc, _, err = apply(inv, runs, "--tags", "gpu")
    assert rc == 0, err[-2000:]
    assert ct_config(lab)["pending"], "restart: never leaves the edit pending"
    assert inside(lab.container(), "/dev/nvidia0")["/dev/nvidia0"].startswith("666 ")
    set_host_vars(inv, "sglang-01", {"gpu_passthrough_mode": "0660"})
    rc, _, err = apply(inv, runs, "--tags", "gpu")
    assert rc == 0, err[-2000:]
    assert ct_config(lab)["pending"] == {}, "the next run must apply what the last one left pending"
    assert inside(lab.container(), "/dev/nvidia0")["/dev/nvidia0"].startswith("660 ")
    set_host_vars(inv, "sglang-01", None)
    rc, _, err = apply(inv, runs, "--tags", "gpu")
    assert rc == 0, err[-2000:]


def test_nesting_is_set_so_systemd_can_sandbox_the_units(lab, inv, runs):
    api, ct = pve_api(lab), lab.container()
    lab.pve_control("POST", "/ct-config", {"vmid": VMID, "delete": ["features"]})
    old = ct.boot_id()
    assert wait_task(api, "pve-grub", api.nodes("pve-grub").lxc(VMID).status.reboot.post())["exitstatus"] == "OK"
    ct.wait_for_ssh(120, not_boot_id=old)
    sandboxed = "systemd-run --wait -p PrivateTmp=yes -p ProtectSystem=full true"
    assert ct.ssh(sandboxed).returncode != 0, "an unprivileged CT without nesting cannot sandbox a unit"
    set_host_vars(inv, "sglang-01", {"gpu_passthrough_restart": "never"})
    rc, result, _ = apply(inv, runs, "--tags", "gpu")
    message = " ".join(f["message"] for f in result.get("failures", []))
    assert rc == 1 and "features: nesting=1" in message and "pct reboot 101" in message, message
    set_host_vars(inv, "sglang-01", None)
    rc, result, err = apply(inv, runs, "--tags", "gpu")
    assert rc == 0, err[-2000:]
    assert "nesting=1" in ct_config(lab)["config"]["features"]
    assert ct.ssh(sandboxed).returncode == 0


def test_pve8_leaves_new_entries_pending_and_one_restart_applies_them(lab, inv, runs):
    lab.pve_control("POST", "/settings", {"version": "8.4.1"})
    try:
        drop_our_entries(lab, restart=True)
        assert "/dev/nvidia0" not in inside(lab.container(), "/dev/nvidia0")
        before = reboots(lab)
        rc, _, err = apply(inv, runs, "--tags", "gpu")
        assert rc == 0, err[-2000:]
        assert reboots(lab) == before + 1, "PVE 8 hot-plugs nothing: one restart applies the new entries"
        assert "/dev/nvidia0" in inside(lab.container(), "/dev/nvidia0")
        assert ct_config(lab)["pending"] == {}
    finally:
        lab.pve_control("POST", "/settings", {"version": "9.0.11"})


def test_a_devn_path_missing_on_the_node_is_named(lab, inv, runs):
    drop_our_entries(lab)
    lab.pve_control(
        "POST",
        "/fail",
        {
            "method": "PUT",
            "suffix": CONFIG_PATH,
            "status": 500,
            "message": "Device /dev/nvidia1 does not exist",
            "times": 5,
        },
    )
    try:
        before = puts(lab)
        rc, result, _ = apply(inv, runs, "--tags", "gpu")
    finally:
        lab.pve_control("POST", "/reset")
    message = " ".join(f["message"] for f in result["failures"])
    assert rc == 1 and "/dev/nvidia1" in message and "does not exist on node pve-grub" in message, message
    assert "keeps failing" not in message and puts(lab) == before + 1, "no retry of what no retry can fix"


PASS_NODES = "Pass the GPU device nodes into the container through the Proxmox API"


def test_sigint_while_the_api_writes_the_entries_then_a_rerun_converges(lab, inv, runs, tmp_path):
    """SIGINT in the gpu phase: while the API module writes the devN entries that were dropped underneath.
    Exit 130, no process of the run left (the module runs on the controller), the record `interrupted` naming the
    task and what it leaves, no host lock; the re-run writes every entry and the nodes are inside."""
    rc, _, err = apply(inv, runs, "--tags", "gpu")  # from whatever the tests above left (entries dropped)
    assert rc == 0, err[-2000:]
    drop_our_entries(lab, restart=True)
    assert "/dev/nvidia0" not in inside(lab.container(), "/dev/nvidia0")
    summary = interrupt_at(inv, runs, tmp_path, "sglang-01", PASS_NODES, "--tags", "gpu")
    stopped = summary["stopped_at"]["sglang-01"]
    assert stopped["task"] == PASS_NODES and "devN entries" in stopped["leaves"], stopped
    assert "lock.json" not in lab.container().ssh("ls /var/lib/provision").stdout, "host lock left"
    rc, _, err = apply(inv, runs, "--tags", "gpu")
    assert rc == 0, err[-2000:]
    paths = {v.split(",")[0] for v in dev_entries(ct_config(lab)["config"]).values()}
    assert {"/dev/nvidia0", "/dev/nvidiactl", "/dev/nvidia-uvm"} <= paths, paths
    assert inside(lab.container(), "/dev/nvidia0")["/dev/nvidia0"].startswith("666 ")


def test_no_password_or_token_in_run_records(lab, runs):
    secrets = lab.secrets()
    for value in (secrets["pve_password"], secrets["pve_token_secret"]):
        hits = subprocess.run(["grep", "-rl", value, str(runs)], capture_output=True, text=True).stdout
        assert hits == "", f"a secret leaked into {hits}"
    assert any(Path(runs).rglob("summary.json"))
    assert os.environ.get("PROXMOX_PASSWORD") is None
