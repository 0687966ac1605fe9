"""The nspawn node's kernel log stand-ins (provision/lab/nspawn-node/usr/local/bin): `dmesg` and `journalctl -k` print
the node's own ring, /run/lab/kmsg, as the product calls them (plugins/module_utils/kernel_findings.py,
kernel_faults.py, plugins/modules/gpu_p2p_node.py). Each runs for real, as root, with a tmpfs on /run/lab in a private
mount namespace."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from provision.lab import nspawn_node

BIN = Path(nspawn_node.__file__).resolve().parent / "nspawn-node" / "usr" / "local" / "bin"
BOOT = 1764800000
FAULT = "AMD-Vi: Event logged [IO_PAGE_FAULT device=41:00.0 domain=0x000b address=0x1000]"
DOMAIN = "iommu: Default domain type: Translated (set via kernel command line)"
RING = f"{BOOT}.930691 {DOMAIN}\n{BOOT + 120}.500000 {FAULT}\n"

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0 or not shutil.which("unshare"), reason="needs root and unshare (a private mount namespace)"
)


def node(tool: str, *args: str, as_user: tuple[str, ...] = ()) -> subprocess.CompletedProcess:
    """`tool args` on a node whose ring is RING, booted at BOOT, run through `as_user` (e.g. setpriv) if given."""
    setup = f"mount -t tmpfs tmpfs /run/lab && printf '%s' '{RING}' > /run/lab/kmsg && echo {BOOT} > /run/lab/kmsg-boot"
    body = f'mkdir -p /run/lab && {setup} && exec {" ".join(as_user)} "$0" "$@"'
    return subprocess.run(
        ["unshare", "--mount", "--propagation", "private", "sh", "-c", body, str(BIN / tool), *args],
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_dmesg_prints_each_line_at_its_seconds_since_boot():
    out = node("dmesg").stdout.splitlines()
    assert out[0] == "[    0.930691] iommu: Default domain type: Translated (set via kernel command line)"
    assert out[1].startswith("[  120.500000] AMD-Vi: Event logged [IO_PAGE_FAULT")


def test_this_boots_kernel_log_as_kernel_findings_reads_it():
    proc = node("journalctl", "-k", "-b", "0", "-q", "--no-pager", "-o", "cat")
    assert proc.returncode == 0 and proc.stdout.splitlines()[0].startswith("iommu: Default domain type: Translated")


def test_grep_is_a_regex_case_blind_only_without_capitals_and_exits_1_when_nothing_matches():
    faults = node("journalctl", "-k", "-b", "--no-pager", "-o", "short-unix", "--grep", "IO_PAGE_FAULT|NVRM: Xid")
    host = subprocess.run(["hostname"], capture_output=True, text=True).stdout.strip()
    assert faults.returncode == 0
    assert faults.stdout == f"{BOOT + 120}.500000 {host} kernel: {FAULT}\n"
    assert node("journalctl", "-k", "-b", "-o", "cat", "-g", "default domain").returncode == 0
    none = node("journalctl", "-k", "-b", "-o", "cat", "-g", "Default Domain")
    assert none.returncode == 1 and none.stdout == "-- No entries --\n" and not none.stderr


def test_another_boot_has_no_kernel_lines_and_anything_else_is_the_real_journalctl():
    assert node("journalctl", "-k", "-b", "-1", "-q", "-o", "cat").stdout == ""
    real = node("journalctl", "--version")
    assert real.returncode == 0 and real.stdout.startswith("systemd ")


def test_an_unprivileged_user_may_not_read_the_kernel_log():
    nobody = ("setpriv", "--reuid=65534", "--regid=65534", "--clear-groups")
    refused = node("dmesg", as_user=nobody)
    assert refused.returncode == 1 and refused.stderr == "dmesg: read kernel buffer failed: Operation not permitted\n"
    journal = node("journalctl", "-k", "-b", "-o", "cat", "-g", "IO_PAGE_FAULT", as_user=nobody)
    assert journal.returncode == 1 and "IO_PAGE_FAULT" not in journal.stdout
