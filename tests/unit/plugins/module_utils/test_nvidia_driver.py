"""The node driver's pure rules (plugins/module_utils/nvidia_driver.py): the CUDA 13 floor, what `dkms status` and
`lspci -n` say, the installer's arguments, and the install/upgrade/load/reboot decision from what a node reports;
the module's and `inventory check`'s one-line refusals naming the variable."""

from __future__ import annotations

import textwrap

import pytest
from ansible_collections.provision.pve_sglang.plugins.modules import nvidia_driver_info

from provision import inventory
from provision.paths import module_util
from tests.unit.provision.test_inventory import GOOD_HOSTS, make, problems

rules = module_util("nvidia_driver")
KERNEL = "6.8.12-4-pve"
WANTED = "580.95.05"


@pytest.mark.parametrize(
    ("version", "ok"),
    [
        ("580.65.06", True),
        ("580.95.05", True),
        ("590.48.01", True),
        ("580.65.05", False),
        ("575.57.08", False),
        ("570.1", False),
        ("580", False),
        ("580.95.05\n", False),
        ("", False),
        (580.95, False),
    ],
)
def test_the_floor_is_cuda_13_0s_driver(version, ok):
    assert (rules.version_problem(version) is None) is ok


def test_a_version_below_the_floor_says_why():
    assert rules.version_problem("575.57.08") == (
        "575.57.08 is older than 580.65.06, the CUDA 13 floor SGLang 0.5.23 needs (CUDA 13.0 release notes: Linux "
        "x86_64 driver >= 580.65.06)"
    )


@pytest.mark.parametrize(
    ("source", "ok"),
    [
        ("https://us.download.nvidia.com/tesla/580.95.05/NVIDIA-Linux-x86_64-580.95.05.run", True),
        ("/srv/mirror/NVIDIA-Linux-x86_64-580.95.05.run", True),
        ("mirror/NVIDIA.run", False),
        ("ftp://x/y.run", False),
        ("/srv/a\nb", False),
        (None, False),
    ],
)
def test_the_installer_comes_from_a_url_or_an_absolute_path(source, ok):
    assert (rules.source_problem(source) is None) is ok


def test_dkms_status_of_both_formats():
    text = textwrap.dedent(f"""\
        nvidia/590.48.01: added
        nvidia/{WANTED}, {KERNEL}, x86_64: installed
        nvidia, 580.65.06, 6.8.8-2-pve, x86_64: built
        zfs/2.2.6, {KERNEL}, x86_64: installed
        nvidia/{WANTED}, 6.5.13-1-pve, x86_64: installed (original_module exists)
        """)
    assert rules.parse_dkms_status(text) == [
        {"version": "590.48.01", "kernel": None, "arch": None, "state": "added"},
        {"version": WANTED, "kernel": KERNEL, "arch": "x86_64", "state": "installed"},
        {"version": "580.65.06", "kernel": "6.8.8-2-pve", "arch": "x86_64", "state": "built"},
        {"version": WANTED, "kernel": "6.5.13-1-pve", "arch": "x86_64", "state": "installed"},
    ]


def test_nvswitches_are_nvidia_bridges_in_lspci():
    gpus = "0000:18:00.0 0302: 10de:2335 (rev a1)\n0000:2a:00.0 0302: 10de:2335 (rev a1)\n"
    assert not rules.nvswitch_present(gpus)
    assert rules.nvswitch_present(gpus + "0000:05:00.0 0680: 10de:22a3 (rev a1)\n")
    assert not rules.nvswitch_present("0000:05:00.0 0680: 8086:1234\n")  # another vendor's bridge


def dkms(version=WANTED, kernel=KERNEL, state="installed"):
    return [{"version": version, "kernel": kernel, "arch": "x86_64", "state": state}]


def report(installed=None, loaded=None, entries=(), nouveau=False):
    return {
        "kernel": KERNEL,
        "installed": installed,
        "loaded": loaded,
        "dkms": list(entries),
        "nouveau_loaded": nouveau,
    }


def test_a_bare_node_gets_the_installer():
    d = rules.decide(WANTED, report())
    assert (d["install"], d["upgrade"], d["load"], d["current"]) == (True, False, False, False)
    assert d["reason"] == f"no NVIDIA kernel module installed for kernel {KERNEL}: install {WANTED}"


def test_nouveau_loaded_means_a_reboot_before_the_installer():
    assert rules.decide(WANTED, report(nouveau=True))["reboot_for_nouveau"]
    assert not rules.decide(WANTED, report())["reboot_for_nouveau"]


def test_the_pinned_driver_installed_with_dkms_and_loaded_is_current():
    d = rules.decide(WANTED, report(WANTED, WANTED, dkms()))
    assert d["current"] and not d["install"] and not d["load"] and not d["upgrade"]


def test_the_kernel_the_node_boots_next_needs_its_own_module():
    """Current for the running kernel, but a kernel update left the next boot's kernel without the module."""
    following = "6.14.8-2-pve"
    d = rules.decide(WANTED, {**report(WANTED, WANTED, dkms()), "next_kernel": following})
    assert d["current"] and d["build_next"]
    assert d["reason"].endswith(f"; the kernel the node boots next, {following}, has no module: build it with DKMS")
    built = dkms() + dkms(kernel=following)
    assert not rules.decide(WANTED, {**report(WANTED, WANTED, built), "next_kernel": following})["build_next"]
    assert not rules.decide(WANTED, {**report(WANTED, WANTED, dkms()), "next_kernel": KERNEL})["build_next"]
    assert not rules.decide("", {**report(), "next_kernel": following})["build_next"], "an unmanaged driver"


def test_another_version_is_an_upgrade():
    d = rules.decide(WANTED, report("580.65.06", "580.65.06", dkms("580.65.06")))
    assert (d["install"], d["upgrade"], d["current"]) == (True, True, False)
    assert d["reason"] == f"driver 580.65.06 installed: upgrade to {WANTED}"


def test_installed_without_dkms_for_this_kernel_installs_again():
    for entries in ([], dkms(kernel="6.5.13-1-pve"), dkms(state="built")):
        assert rules.decide(WANTED, report(WANTED, WANTED, entries))["install"]


def test_installed_but_not_the_loaded_one_loads_it():
    assert rules.decide(WANTED, report(WANTED, None, dkms()))["load"]
    d = rules.decide(WANTED, report(WANTED, "580.65.06", dkms()))
    assert d["load"] and d["upgrade"] and not d["install"]


def test_the_installer_may_run_beside_a_module_only_while_one_stays_loaded():
    base = ["--silent", "--dkms", "--no-questions", "--ui=none"]
    assert rules.installer_args(base, running_driver_stays=False) == base
    assert rules.installer_args(base, running_driver_stays=True) == [*base, "--allow-installation-with-running-driver"]


def test_after_the_install_an_old_module_still_loaded_needs_a_reboot():
    assert rules.after_install(WANTED, WANTED) == {"reboot": False, "reason": f"driver {WANTED} loaded"}
    assert rules.after_install(WANTED, "580.65.06")["reboot"]
    assert not rules.after_install(WANTED, None)["reboot"]


def test_installed_version_is_modinfos_else_what_dkms_installed_for_the_kernel():
    entries = dkms("580.65.06") + dkms() + dkms("590.48.01", kernel="6.5.13-1-pve")
    assert rules.installed_version("580.65.06", entries, KERNEL) == "580.65.06"
    assert rules.installed_version(None, entries, KERNEL) == WANTED
    assert rules.installed_version(None, dkms(state="built"), KERNEL) is None


def test_the_module_refuses_each_bad_input_naming_its_variable():
    params = {"version": "575.57.08", "installer": "mirror/x.run", "installer_sha256": "abc", "host": "pve1"}
    assert nvidia_driver_info.input_problems(params) == [
        "pve1: nvidia_driver_version: 575.57.08 is older than 580.65.06, " + rules.FLOOR_REASON,
        "pve1: nvidia_driver_installer: expected an http(s) URL or an absolute path on the node, got 'mirror/x.run'",
        "pve1: nvidia_driver_installer_sha256: expected the installer's sha256, 64 hex digits (`sha256sum` of the file "
        "NVIDIA publishes)",
    ]
    good = {"version": WANTED, "installer": "/srv/x.run", "installer_sha256": "a" * 64, "host": "pve1"}
    assert nvidia_driver_info.input_problems(good) == []


def test_inventory_check_validates_the_driver_pin(tmp_path):
    node_vars = (
        'nvidia_driver_version: "575.57.08"\nnvidia_driver_installer_sha256: "xyz"\nnvidia_driver_installer: x.run\n'
    )
    found = problems(make(tmp_path, GOOD_HOSTS, {"proxmox_hosts": node_vars}))
    assert len(found) == 3, found
    assert any(
        "nvidia_driver_version: expected an NVIDIA driver version such as 580.95.05, 580.65.06 or newer" in p
        and "got '575.57.08' (str)" in p
        and "group_vars/proxmox_hosts.yml" in p
        for p in found
    )
    assert any("nvidia_driver_installer_sha256: expected the installer's sha256" in p for p in found)
    assert any("nvidia_driver_installer: expected an http(s) URL or an absolute path" in p for p in found)


def test_inventory_check_accepts_a_good_pin(tmp_path):
    node_vars = f'nvidia_driver_version: "{WANTED}"\nnvidia_driver_installer_sha256: "{"a" * 64}"\n'
    inventory.load(make(tmp_path, GOOD_HOSTS, {"proxmox_hosts": node_vars}))


@pytest.mark.parametrize(("version", "managed"), [(None, False), ("", False), (WANTED, True), ("575.57.08", True)])
def test_only_a_version_that_is_set_pins_the_driver(version, managed):
    assert rules.pinned(version) is managed
    assert (rules.pin_problem(version) is None) is (not managed or version == WANTED)


def test_no_pin_decides_nothing_to_do_and_says_what_the_node_runs():
    d = rules.decide("", report(WANTED, "580.65.06", dkms()))
    assert not d["managed"] and d["current"]
    assert not any(d[k] for k in ("install", "upgrade", "load", "unload", "may_reboot", "reboot_for_nouveau"))
    said = "driver not managed (nvidia_driver_version is not set), skipped: NVIDIA module 580.65.06 loaded"
    assert d["reason"] == said
    assert rules.decide(None, report())["reason"].endswith("skipped: no NVIDIA module loaded")
    assert rules.decide(WANTED, report())["managed"]


def test_a_reboot_may_follow_only_where_another_version_is_loaded():
    """may_reboot: the old module could be held, so only a reboot would load the pin; unload: something is loaded
    and the node is not current (its holders are stopped, the module unloaded first)."""
    cases = {
        "bare": (report(), False, False),
        "installed, not loaded": (report(WANTED, None, dkms()), False, False),
        "current": (report(WANTED, WANTED, dkms()), False, False),
        "loaded, not in DKMS": (report(WANTED, WANTED, []), False, True),
        "another loaded": (report("580.65.06", "580.65.06", dkms("580.65.06")), True, True),
        "pin installed, another loaded": (report(WANTED, "580.65.06", dkms()), True, True),
    }
    for name, (found, may_reboot, unload) in cases.items():
        d = rules.decide(WANTED, found)
        assert (d["may_reboot"], d["unload"]) == (may_reboot, unload), name


def test_nvidias_url_is_the_default_source_for_a_version():
    assert rules.download_url(WANTED) == (
        f"https://us.download.nvidia.com/tesla/{WANTED}/NVIDIA-Linux-x86_64-{WANTED}.run"
    )


# The installer's log as NVIDIA/nvidia-installer 590.48.01 writes it (log.c log_init's header, user-interface.c
# level_str's `ERROR: ` prefix, install-from-cwd.c's closing error)
INSTALLER_LOG = textwrap.dedent("""\
    nvidia-installer log file '/var/log/nvidia-installer.log'
    creation time: Tue Jan  6 10:00:00 2026
    installer version: 580.95.05

    -> Installing NVIDIA driver version 580.95.05.
    WARNING: The nvidia-drm module will not be installed.
    ERROR: Unable to load the kernel module 'nvidia.ko'.  This happens most frequently when this kernel module was built against the wrong or improperly configured kernel sources
    -> Kernel module load error: No such device
    ERROR: Installation has failed.  Please see the file '/var/log/nvidia-installer.log' for details.  You may find suggestions on fixing installation problems in the README available on the Linux driver download page at www.nvidia.com.
    """)  # noqa: E501  (the log's own lines)


def test_an_installer_failure_is_one_line_with_its_last_error():
    cause = (
        "Unable to load the kernel module 'nvidia.ko'.  This happens most frequently when this kernel module "
        "was built against the wrong or improperly configured kernel sources"
    )
    assert rules.last_installer_error(INSTALLER_LOG) == cause
    assert rules.installer_failure("pve1", WANTED, 1, rules.INSTALLER_LOG, INSTALLER_LOG) == (
        f"pve1: the NVIDIA installer for driver {WANTED} failed (exit 1): {cause}; its log: "
        "pve1:/var/log/nvidia-installer.log"
    )
    only_closing = INSTALLER_LOG.replace("ERROR: Unable", "-> Unable")
    assert rules.installer_failure("pve1", WANTED, 1, "/var/log/x.log", only_closing) == (
        f"pve1: the NVIDIA installer for driver {WANTED} failed (exit 1); its log: pve1:/var/log/x.log"
    )
    assert rules.last_installer_error(None) is None


def test_a_wrapped_error_is_read_whole_and_a_run_that_wrote_no_log_is_quoted_from_its_output():
    """A message wrapped over indented lines (as older nvidia-installer releases write their log) is one error; where
    the log holds none of this run (the .run's self-extractor failed first), the last line the .run printed says why."""
    wrapped = INSTALLER_LOG.replace(
        "ERROR: Unable to load the kernel module 'nvidia.ko'.  This happens most frequently when this kernel module "
        "was built against the wrong or improperly configured kernel sources",
        "ERROR: Unable to load the kernel module 'nvidia.ko'.  This happens most\n"
        "       frequently when this kernel module was built against the wrong or\n"
        "       improperly configured kernel sources",
    )
    assert rules.last_installer_error(wrapped) == (
        "Unable to load the kernel module 'nvidia.ko'.  This happens most frequently when this kernel module was "
        "built against the wrong or improperly configured kernel sources"
    )
    output = "Verifying archive integrity... Error in MD5 checksums: 0badc0de is different from 5eed1e55\n"
    assert rules.installer_failure("pve1", WANTED, 1, rules.INSTALLER_LOG, None, output) == (
        f"pve1: the NVIDIA installer for driver {WANTED} failed (exit 1): Verifying archive integrity... Error in MD5 "
        "checksums: 0badc0de is different from 5eed1e55; its log: pve1:/var/log/nvidia-installer.log"
    )


def test_the_installers_log_is_where_its_arguments_put_it():
    assert rules.installer_log(["--silent", "--dkms"]) == "/var/log/nvidia-installer.log"
    assert rules.installer_log(["--silent", "--log-file-name=/root/i.log"]) == "/root/i.log"
    assert rules.installer_log(["--log-file-name", "/root/i.log", "--silent"]) == "/root/i.log"


def test_the_module_quotes_only_a_log_this_runs_installer_wrote(tmp_path):
    import os
    import time
    from datetime import datetime

    log = tmp_path / "nvidia-installer.log"
    log.write_text(INSTALLER_LOG)
    written = log.stat().st_mtime
    params = {"installer_rc": 1, "installer_args": [f"--log-file-name={log}"], "host": "pve1", "version": WANTED}

    def started(at: float) -> str:
        return datetime.fromtimestamp(at).strftime("%Y-%m-%d %H:%M:%S.%f")  # ansible.builtin.command's `start`

    assert "Unable to load the kernel module" in nvidia_driver_info.installer_failure(
        {**params, "installer_started": started(written - 5)}
    )
    stale = nvidia_driver_info.installer_failure({**params, "installer_started": started(written + 60)})
    assert stale == f"pve1: the NVIDIA installer for driver {WANTED} failed (exit 1); its log: pve1:{log}"
    os.utime(log, (time.time(), time.time()))
    assert nvidia_driver_info.installer_failure({**params, "installer_rc": 0}) is None


def test_the_module_checks_nothing_where_no_version_is_pinned():
    params = {
        "version": "",
        "installer": "https://us.download.nvidia.com/tesla//NVIDIA-Linux-x86_64-.run",
        "installer_sha256": "",
        "host": "pve1",
    }
    assert nvidia_driver_info.input_problems(params) == []


@pytest.mark.parametrize("pin", ["", None], ids=["empty", "unset"])
def test_inventory_check_accepts_no_pin(tmp_path, pin):
    node_vars = "" if pin is None else 'nvidia_driver_version: ""\n'
    inventory.load(make(tmp_path, GOOD_HOSTS, {"proxmox_hosts": node_vars}))


def test_inventory_check_refuses_a_pin_that_is_set_but_below_the_floor_in_one_line(tmp_path):
    node_vars = f'nvidia_driver_version: "575.57.08"\nnvidia_driver_installer_sha256: "{"a" * 64}"\n'
    found = problems(make(tmp_path, GOOD_HOSTS, {"proxmox_hosts": node_vars}))
    assert len(found) == 1 and "\n" not in found[0], found
    assert "host pve1: nvidia_driver_version: expected an NVIDIA driver version such as 580.95.05" in found[0]


def test_inventory_check_refuses_a_pin_without_the_installers_sha256(tmp_path):
    """The driver phase refuses it too, but only after the kernel phase, which may reboot the node."""
    found = problems(make(tmp_path, GOOD_HOSTS, {"proxmox_hosts": 'nvidia_driver_version: "580.95.05"\n'}))
    assert found == [
        f"{tmp_path}/inv/group_vars/proxmox_hosts.yml:1: host pve1: nvidia_driver_version is pinned (580.95.05) but "
        "nvidia_driver_installer_sha256 is not set: the driver phase runs only an installer whose sha256 it knows; "
        "set it, or unset the pin to keep the node's driver"
    ]


def test_the_gpu_phase_checks_the_node_against_the_same_floor():
    """gpu_passthrough's own check of the node's driver (host.yml) and the driver phase's refusal hold one floor."""
    from provision.paths import role_default

    assert role_default("gpu_passthrough", "gpu_passthrough_min_driver_version") == rules.CUDA13_DRIVER_FLOOR


# efivarfs's SecureBoot variable: 4 bytes of attributes (NV, BS, RT), then the value byte
SECURE_BOOT_ON, SECURE_BOOT_OFF = b"\x06\x00\x00\x00\x01", b"\x06\x00\x00\x00\x00"


def test_secure_boot_is_the_firmware_variables_value_byte():
    assert rules.secure_boot_on(SECURE_BOOT_ON)
    assert not rules.secure_boot_on(SECURE_BOOT_OFF) and not rules.secure_boot_on(None)


def test_the_signing_certificate_is_the_installers_else_dkms_configured_one_else_its_default():
    conf = 'sign_tool="/etc/dkms/sign_helper.sh"\nmok_certificate="/root/mok/MOK.der"\n'
    assert rules.signing_certificate(None, ["--dkms"]) == "/var/lib/dkms/mok.pub"
    assert rules.signing_certificate(conf, ["--dkms"]) == "/root/mok/MOK.der"
    assert rules.signing_certificate("# mok_certificate=/x\n", []) == "/var/lib/dkms/mok.pub"
    given = ["--dkms", "--module-signing-secret-key=/k.key", "--module-signing-public-key=/k.der"]
    assert rules.signing_certificate(conf, given) == "/k.der"


def test_under_secure_boot_only_an_enrolled_certificate_passes():
    """mokutil --test-key's own words: "<file> is already enrolled" or "<file> is not enrolled"."""
    cert = "/var/lib/dkms/mok.pub"
    assert rules.secure_boot_problem(False, cert, False, None) is None
    assert rules.secure_boot_problem(True, cert, True, f"{cert} is already enrolled\n") is None
    assert rules.secure_boot_problem(True, cert, True, f"{cert} is not enrolled\n") == (
        "Secure Boot is on, and /var/lib/dkms/mok.pub is not an enrolled MOK"
    )
    assert rules.secure_boot_problem(True, cert, False, None) == (
        "Secure Boot is on, and /var/lib/dkms/mok.pub does not exist yet (DKMS makes it, and its key, at its first "
        "build)"
    )
    assert "mokutil is not installed" in rules.secure_boot_problem(True, cert, True, None)
