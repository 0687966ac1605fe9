"""Helpers for lab tests: inventory overrides and host facts."""

from __future__ import annotations

import json
import signal
import time
from pathlib import Path

import yaml

from provision.paths import module_util
from tests.conftest import run_provision
from tests.processes import interrupt, start_apply, wait_for_task

# the arguments the lab inventory's profile puts on every node's line (SEV-SNP host, IOMMU translating)
PROFILE_ARGS = ["kvm_amd.sev=1", "kvm_amd.sev_es=1", "kvm_amd.sev_snp=1", "iommu=nopt"]


def set_host_vars(inventory: Path, host: str, values: dict | None) -> None:
    """Write (or with None remove) host_vars/<host>.yml in the lab inventory."""
    path = inventory / "host_vars" / f"{host}.yml"
    if values is None:
        path.unlink(missing_ok=True)
        return
    path.parent.mkdir(exist_ok=True)
    path.write_text(yaml.safe_dump(values))


def apply(inventory: Path, runs: Path, *extra: str, env: dict | None = None) -> tuple[int, dict, str]:
    proc = run_provision(
        "apply",
        "--inventory",
        str(inventory),
        "--yes",
        "--json",
        "--runs-dir",
        str(runs),
        *extra,
        env=env,
        timeout=1800,
    )
    try:
        data = json.loads(proc.stdout)["result"]  # the command's payload, inside the envelope (docs/json.md)
    except (ValueError, KeyError):
        data = {}
    return proc.returncode, data, proc.stderr


def interrupt_at(
    inventory: Path, runs: Path, tmp_path: Path, host: str, task: str, *args: str, env: dict | None = None
) -> dict:
    """Start `provision apply` with `args`, send it SIGINT once `task` has started on `host`, check that it exits
    130 naming its record and that none of its processes is left (tests/processes.py), and return the record's
    summary, which must be `interrupted` with no host lock left."""
    runs.mkdir(exist_ok=True)
    runs_before = set(runs.iterdir())
    out = tmp_path / "interrupted.json"
    proc = start_apply(inventory, runs, out, *args, env=env)
    try:
        wait_for_task(proc, host, task)
    except BaseException:
        proc.kill()
        raise
    interrupt(proc, signal.SIGINT)
    (record,) = set(runs.iterdir()) - runs_before
    assert f"error: interrupted by SIGINT: run record {record}" in out.with_suffix(".err").read_text()
    summary = json.loads((record / "summary.json").read_text())
    assert summary["status"] == "interrupted" and summary["host_locks_left"] == [], summary
    return summary


NODES = ("pve-grub", "pve-sdboot")
_kernel_cmdline = module_util("kernel_cmdline")
split_cmdline = _kernel_cmdline.split
canonical = _kernel_cmdline.canonical


def failed_checks(report: dict) -> dict[tuple[str, str], str]:
    """verify's failed checks in a --json result: (host, check) -> the reason."""
    return {(c["host"], c["name"]): c["reason"] for c in report.get("checks", []) if not c["passed"]}


def as_root(lab, body):
    """A CT created through the lab's API, reached as root (its spec gives root the lab's client key), its host key
    checked against the lab's known_hosts, where the apply put the key it read on the CT's node."""
    from provision.lab.container import LabContainer

    return LabContainer(body.spec, body.dir, body.rootfs, lab.client_key, lab.known_hosts, body.read_only_binds)


def boots(machine) -> int:
    """How many boots the host's wtmp records."""
    out = machine.ssh("last -x reboot 2>/dev/null | grep -c '^reboot' || true").stdout.strip()
    return int(out or 0)


def pve_api(lab):
    """The lab's Proxmox API as root@pam (a ticket login: only root@pam may change devN entries)."""
    from proxmoxer import ProxmoxAPI

    password = lab.secrets()["pve_password"]
    return ProxmoxAPI(
        "127.0.0.1",
        port=lab.state()["pve_port"],
        user="root@pam",
        password=password,
        verify_ssl=str(lab.dir / "pve.crt"),
        service="PVE",
        timeout=120,
    )


def wait_task(api, node: str, upid: str, timeout: float = 180) -> dict:
    """A PVE task's final status (exitstatus "OK" or PVE's error text)."""
    import time

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        status = api.nodes(node).tasks(upid).status.get()
        if status.get("status") == "stopped":
            return status
        time.sleep(0.5)
    raise AssertionError(f"task {upid} still running after {timeout}s")


def inside(ct, paths: str) -> dict[str, str]:
    """`stat` of device nodes inside the container: path -> 'mode uid gid major minor', missing ones left out."""
    out = ct.ssh(f"stat -c '%n %a %u %g %t %T' {paths} 2>/dev/null").stdout
    return {line.split()[0]: " ".join(line.split()[1:]) for line in out.splitlines() if line.strip()}


def restart_and_wait_ready(ct, timeout: float = 90) -> None:
    """Restart the container's sglang unit (a new start opens a new fault window for verify) and wait until
    it answers /health again."""
    ct.ssh("systemctl restart sglang")
    wait_ready(ct, timeout)


def wait_ready(ct, timeout: float = 90) -> None:
    """Wait until the container's SGLang answers /health (or the timeout passes)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and ct.ssh("curl -sf localhost:30000/health").returncode:
        time.sleep(2)


def _phase_converged(lab, phase: str) -> bool:
    """Whether the lab shows the effect of `phase` converged: read on the hosts, not taken from any record."""
    if phase == "kernel":  # the arguments running, and the phase's findings recorded (verify reads them): an nspawn
        # node starts on the profile's line, but only the phase writes its findings
        return all(_kernel_converged(lab.vm(n)) for n in NODES)
    ct = lab.container()
    if phase == "gpu":
        return _gpu_converged(lab, ct)
    if phase == "sglang":
        return ct.ssh("curl -sf localhost:30000/health").returncode == 0
    raise ValueError(phase)


def _kernel_converged(node) -> bool:
    """One ssh command: the running line, printed only where the phase's findings are recorded."""
    cmdline = node.ssh("test -s /var/lib/provision/kernel-findings.json && cat /proc/cmdline").stdout.split()
    return set(PROFILE_ARGS) <= set(cmdline)


def _gpu_converged(lab, ct) -> bool:
    """The container's NVIDIA nodes work (nvidia-smi -L) and the API's config has a devN entry for each: a CT whose
    entries were deleted underneath keeps its nodes only until its next start (the prestart hook makes the nodes from
    the entries), so nodes alone do not show the phase converged."""
    from provision.lab.lab import CONTAINER_VMID

    config = lab.pve_control("GET", f"/ct/{CONTAINER_VMID}")["config"]
    entries = {v.split(",")[0].removeprefix("path=") for k, v in config.items() if k.startswith("dev")}
    inside = set(ct.ssh("find /dev -maxdepth 2 -path '/dev/nvidia*' ! -type d").stdout.split())
    return bool(inside) and inside <= entries and ct.ssh("nvidia-smi -L").returncode == 0


def ensure_converged(lab, inventory: Path, runs: Path, *phases: str) -> None:
    """Converge the phases a module starts from, where the lab does not show them converged, so that no module
    needs another to have run first (tests/lab/conftest.py)."""
    missing = [phase for phase in phases if not _phase_converged(lab, phase)]
    if missing:
        print(f"lab: converging {', '.join(missing)} first", flush=True)
        rc, _, err = apply(inventory, runs, "--tags", ",".join(missing))
        assert rc == 0, err[-3000:]
