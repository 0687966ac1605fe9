"""verify's next boot (provision/checks/next_boot.py): what a node boots next and what its containers' units start
with there, reported and checked before anyone reboots. The probes are what probe.py returns from a node in each
state: booted with iommu=pt while the profile's iommu=nopt waits in the default entry (apply --reboot never, or a
refused reboot), a line edited since apply, an armed systemd-boot one-shot."""

from __future__ import annotations

import base64
import io
import json
from pathlib import Path

from rich.console import Console

from provision import verify
from provision.checks import next_boot, probe, support
from provision.present import print_verify

RUNNING = "BOOT_IMAGE=/boot/vmlinuz-6.8.12-4-pve root=/dev/mapper/pve-root ro quiet iommu=pt"
PROFILE = "quiet kvm_amd.sev=1 iommu=nopt"
GRUB_CFG = (
    "menuentry 'Proxmox VE GNU/Linux' --class proxmox {\n"
    f"\tlinux\t/boot/vmlinuz-6.8.12-4-pve root=/dev/mapper/pve-root ro {PROFILE}\n}}\n"
)
DKMS = "nvidia/580.95.05, 6.8.12-4-pve, x86_64: installed\n"
PCIE = [{"a": "GPU0", "b": "GPU1", "link": "PIX"}]


def _node(configured=PROFILE, bootloader="grub", oneshot=None, trial_line=None):
    commands = {
        " ".join(support.BOOT_KERNELS): {"rc": 0, "stdout": "vmlinuz-6.8.12-4-pve\n", "stderr": ""},
        " ".join(support.RUNNING_KERNEL): {"rc": 0, "stdout": "6.8.12-4-pve\n", "stderr": ""},
        " ".join(support.DKMS_STATUS): {"rc": 0, "stdout": DKMS, "stderr": ""},
        " ".join(support.GRUB_CONFIGURED): {"rc": 0, "stdout": f"{configured} ", "stderr": ""},
    }
    wanted = {"bootloader": bootloader, "add": ["kvm_amd.sev=1", "iommu=nopt"], "remove": ["iommu=pt"]}
    files = {
        support.WANTED: json.dumps(wanted),
        support.FINDINGS: json.dumps({"iommu_default_domain": "Passthrough", "proc_cmdline": RUNNING}),
        support.GRUB_CFG: GRUB_CFG if bootloader == "grub" else None,
        next_boot.next_boot.KERNEL_CMDLINE: PROFILE + "\n" if bootloader == "systemd-boot" else None,
        next_boot.next_boot.TRIAL_RECORD: json.dumps({"line": trial_line}) if trial_line else None,
    }
    raw = {}
    if oneshot:  # efivarfs: 4 bytes of attributes, then the UTF-16LE string and its NUL
        raw[next_boot.next_boot.ONESHOT] = base64.b64encode(b"\x07\0\0\0" + f"{oneshot}\0".encode("utf-16-le")).decode()
    found = {
        "boot_id": "b",
        "state_dir": "/var/lib/provision",
        "proc_cmdline": RUNNING,
        "files": files,
        "binary_files": raw,
        "commands": commands,
        "nvidia_nodes": {},
        "pve_devices": {},
    }
    return {"vars": {"nvidia_driver_version": "580.95.05"}, "probe": found, "error": ""}


def _container(**record):
    guard = {"iommu_args": "iommu=pt", "iommu_keys": ["iommu"], "container_boot_id": None}
    state = {
        "service": "sglang",
        "tp_size": 2,
        "p2p_policy": "on",
        "p2p_mode": "auto",
        "p2p_links": PCIE,
        "p2p_guard": guard,
        **record,
    }
    found = {
        "boot_id": "c",
        "state_dir": "/var/lib/provision",
        "files": {support.SERVICE_STATE: json.dumps(state)},
        "sglang": {"service": {}},
    }
    return {"vars": {}, "probe": found, "error": ""}


def _spec(tmp_path: Path, node: dict, ct: dict) -> tuple[dict, Path]:
    spec = {
        "hosts": {"pve1": ["test_common.py", "test_host.py"], "ct1": ["test_common.py", "test_container.py"]},
        "nodes": {"ct1": "pve1"},
        "readings": {"pve1": node, "ct1": ct},
    }
    path = tmp_path / "hosts.json"
    path.write_text(json.dumps(spec))
    return spec, path


def _checks(tmp_path: Path, node: dict, ct: dict) -> dict:
    _, path = _spec(tmp_path, node, ct)
    select = "next_boot_keeps_the_profile or next_boot_starts_p2p"
    return {(c.host, c.name): c for c in verify._run_checks(["pve1", "ct1"], path, tmp_path, select=select)}


def test_a_pending_translating_line_is_reported_and_the_guard_starts_p2p_off_there(tmp_path):
    """Booted with iommu=pt, P2P on between PCIe peers; the default entry and /etc/default/grub hold iommu=nopt, not
    booted yet. verify names both lines as pending and translating, and the unit's start guard turns P2P off in
    that boot: the checks pass, and the report says so on the console and in the JSON."""
    spec, _ = _spec(tmp_path, _node(), _container())
    found = next_boot.report(spec)["pve1"]
    assert (found["kernel"], found["nvidia_module"]) == ("6.8.12-4-pve", "installed")
    assert [(b["source"], b["pending"], b["iommu"]["translates"], b["lacks"]) for b in found["lines"]] == [
        ("/boot/grub/grub.cfg default entry", True, True, []),
        ("/etc/default/grub (the line update-grub writes next)", True, True, []),
    ]
    assert [(s["p2p"], s["safe"]) for s in found["containers"]["ct1"]] == [("off", True), ("off", True)]
    assert found["containers"]["ct1"][0]["why"] == (
        "the start guard: IOMMU arguments 'iommu=nopt', decided for 'iommu=pt'"
    )
    checks = _checks(tmp_path, _node(), _container())
    assert all(c.passed for c in checks.values()), [c.reason for c in checks.values()]
    assert checks[("pve1", "test_the_next_boot_keeps_the_profile")].reason == (
        "pending: /boot/grub/grub.cfg default entry: iommu=nopt: translated; "
        "/etc/default/grub (the line update-grub writes next): iommu=nopt: translated"
    )
    report = verify.VerifyReport("inv", checks=list(checks.values()), next_boot=next_boot.report(spec))
    assert report.to_dict()["next_boot"]["pve1"]["lines"][0]["pending"] is True
    out = io.StringIO()
    print_verify(Console(file=out, width=200), report)
    text = out.getvalue()
    assert "next boot pve1: kernel 6.8.12-4-pve, NVIDIA module installed" in text
    assert "/boot/grub/grub.cfg default entry: iommu=nopt: translated (pending: not this boot's)" in text
    assert "ct1: P2P off (the start guard: IOMMU arguments 'iommu=nopt', decided for 'iommu=pt')" in text


def test_a_gateway_is_no_node_and_has_no_next_boot(tmp_path):
    """verify reads a gateway (suites test_common and test_gateway) with the nodes and containers: only the node gets
    a next boot."""
    spec, _ = _spec(tmp_path, _node(), _container())
    spec["hosts"]["gw1"] = ["test_common.py", "test_gateway.py"]
    spec["readings"]["gw1"] = {"vars": {}, "probe": {"files": {}, "commands": {}}, "error": ""}
    assert list(next_boot.report(spec)) == ["pve1"]


def test_p2p_on_without_a_guard_in_a_translating_next_boot_fails_naming_the_line(tmp_path):
    """A unit whose P2P on has no start guard (a record from before the guard) would start P2P through the
    translating IOMMU of the pending line: the check fails before anyone reboots, naming that line."""
    checks = _checks(tmp_path, _node(), _container(p2p_guard=None))
    check = checks[("ct1", "test_the_next_boot_starts_p2p_safely")]
    assert not check.passed
    assert check.reason.startswith(
        "the next boot would start GPU P2P unsafely: /boot/grub/grub.cfg default entry: P2P on (PCIe peers, and the "
        "IOMMU translates (iommu=nopt: translated))"
    ), check.reason
    nvlink = _checks(
        tmp_path, _node(), _container(p2p_guard=None, p2p_links=[{"a": "GPU0", "b": "GPU1", "link": "NV18"}])
    )
    assert nvlink[("ct1", "test_the_next_boot_starts_p2p_safely")].passed


def test_a_line_edited_since_apply_fails_naming_what_it_lacks(tmp_path):
    """/etc/default/grub edited after apply (iommu=nopt gone, iommu=pt back): the next update-grub writes a line
    off the profile, and verify fails naming the file and the arguments."""
    checks = _checks(tmp_path, _node(configured="quiet kvm_amd.sev=1 iommu=pt"), _container())
    check = checks[("pve1", "test_the_next_boot_keeps_the_profile")]
    assert not check.passed
    assert check.reason == (
        "the node's next boot leaves the profile: /etc/default/grub (the line update-grub writes next) lacks "
        "iommu=nopt no iommu=pt: run provision apply --tags kernel"
    )


def test_an_armed_systemd_boot_one_shot_is_read_from_its_efi_variable_and_the_trial_record(tmp_path):
    """A systemd-boot node with the kernel phase's one-shot armed: its line comes from the trial record (the entry is
    on an unmounted ESP); a one-shot of another entry is listed with its line unknown, and may translate. The node
    keeps /etc/default/grub too (PVE installs GRUB's packages beside systemd-boot): its line is listed as GRUB's."""
    trial = _node(bootloader="systemd-boot", oneshot="provision-trial+1.conf", trial_line=PROFILE + " lab_new=1")
    spec, _ = _spec(tmp_path, trial, _container())
    found = next_boot.report(spec)["pve1"]["lines"]
    assert [(b["source"], b["cmdline"]) for b in found] == [
        ("/etc/default/grub (the line update-grub writes next)", PROFILE),
        ("/etc/kernel/cmdline (every loader entry at the next proxmox-boot-tool refresh)", PROFILE),
        ("one-shot loader entry provision-trial+1.conf (LoaderEntryOneShot)", PROFILE + " lab_new=1"),
    ]
    other = _node(bootloader="systemd-boot", oneshot="proxmox-6.14.8-2-pve.conf")
    spec, _ = _spec(tmp_path, other, _container())
    (_, _, armed) = next_boot.report(spec)["pve1"]["lines"]
    assert (armed["cmdline"], armed["iommu"]["translates"]) == (None, None)
    assert next_boot.report(spec)["pve1"]["containers"]["ct1"][2]["p2p"] == "off"


def test_the_probe_reads_the_efi_variable_as_bytes(tmp_path, monkeypatch):
    """efivarfs gives 4 bytes of attributes and a UTF-16 string, which text reading would mangle: the probe sends
    the bytes in base64, and an absent variable as null."""
    var = tmp_path / "LoaderEntryOneShot"
    raw = b"\x07\0\0\0" + "provision-trial.conf\0".encode("utf-16-le")
    var.write_bytes(raw)
    monkeypatch.chdir(tmp_path)
    request = {"state_dir": str(tmp_path), "files": [], "commands": [], "binary_files": [str(var), str(var) + "-x"]}
    found = probe.main(request)["binary_files"]
    assert base64.b64decode(found[str(var)]) == raw and found[str(var) + "-x"] is None
