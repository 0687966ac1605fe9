#!/usr/bin/python
"""Ansible module: read a node's NVIDIA driver state and decide what the pinned version needs (read-only)."""

from __future__ import annotations

DOCUMENTATION = r"""
module: nvidia_driver_info
short_description: Read a Proxmox node's NVIDIA driver state and decide what a pinned version needs
author: provision maintainers (!UNKNOWN)
description:
  - Reads the loaded module's version (C(/proc/driver/nvidia/version)), the installed module's version for the
    running kernel (C(modinfo -F version nvidia)), the DKMS status of C(nvidia), whether nouveau is loaded
    (C(/proc/modules)), and whether the node has NVSwitches (C(lspci -n), an NVIDIA device of class 0680).
  - Checks the pinned version, the installer's sha256 and its source before anything is read, each failure one line
    naming the inventory variable (none of them where no version is pinned).
  - Decides whether the installer must run, whether it is an upgrade, whether the module needs loading or unloading,
    whether a reboot may follow and whether nouveau forces a reboot first, and once the installer ran whether the node
    must reboot to load the new module (plugins/module_utils/nvidia_driver.py C(decide) and C(after_install)).
options:
  version:
    description:
      - The pinned driver version (the inventory's C(nvidia_driver_version)). Empty - the driver is not managed - the
        module reads the node and decides nothing to do (C(decision.managed) false).
    type: str
    default: ""
  installer:
    description: The installer's source, an http(s) URL or an absolute path on the node (C(nvidia_driver_installer)).
    type: str
  installer_sha256:
    description: The installer's sha256 (C(nvidia_driver_installer_sha256)).
    type: str
  installer_args:
    description:
      - The installer's arguments (C(nvidia_driver_installer_args)); returned as C(installer_args) with
        C(--allow-installation-with-running-driver) added while an NVIDIA module is loaded (one that could not be
        unloaded), without which a silent install aborts.
    type: list
    elements: str
    default: []
  host:
    description: The inventory name the failure messages start with.
    type: str
    default: ""
  installer_rc:
    description:
      - The exit status of the installer this run ran. Where it is not 0, C(installer_failure) is the one line that
        says so - the host, the version, the installer's last error from its log (C(/var/log/nvidia-installer.log),
        or the C(--log-file-name) among I(installer_args)) and where that log is.
    type: int
  installer_output:
    description:
      - What that installer printed (its stderr, else its stdout). Where its log holds no error of this run (the .run
        failed before nvidia-installer started), C(installer_failure) quotes the last line of it.
    type: str
    default: ""
  installer_started:
    description:
      - When that installer started, as ansible.builtin.command returns it (C(start), the host's local time). A log
        older than that is an earlier run's, and its errors are not quoted.
    type: str
extends_documentation_fragment:
  - provision.pve_sglang.attributes
attributes:
  check_mode:
    support: full
  diff_mode:
    support: none
"""

EXAMPLES = r"""
- name: Read the node's NVIDIA driver
  provision.pve_sglang.nvidia_driver_info:
    version: "580.95.05"
    installer: https://us.download.nvidia.com/tesla/580.95.05/NVIDIA-Linux-x86_64-580.95.05.run
    installer_sha256: "{{ nvidia_driver_installer_sha256 }}"
  register: driver
"""

RETURN = r"""
report:
  description: What the node reports.
  type: dict
  returned: always
  contains:
    kernel: {description: the running kernel (uname -r), type: str}
    next_kernel:
      description:
        - The kernel the node boots next (GRUB's default entry, or proxmox-boot-tool's pinned or newest kernel;
          plugins/module_utils/boot_kernel.py), which DKMS must have built the module for before the node reboots.
      type: str
    loaded: {description: "the loaded module's version, or null", type: str}
    installed: {description: "the installed module's version for the running kernel, or null", type: str}
    dkms: {description: "the DKMS entries of nvidia, [{version, kernel, arch, state}]", type: list}
    nouveau_loaded: {description: nouveau is loaded, type: bool}
    nvswitch: {description: the node has NVSwitches (fabric manager needed), type: bool}
    module_users: {description: the loaded nvidia module's use count, type: int}
decision:
  description:
    - What the pinned version needs - managed, install, upgrade, load, unload, may_reboot, reboot_for_nouveau, current,
      build_next (the module is to be built for the kernel the node boots next) and reason
      (plugins/module_utils/nvidia_driver.py C(decide)).
  type: dict
  returned: always
after_install:
  description: Once the installer ran or the module was loaded - whether only a reboot loads the pinned one, and why.
  type: dict
  returned: always
  contains:
    reboot: {description: the loaded module is another version that could not be unloaded, type: bool}
    reason: {description: what the node runs now, type: str}
modules_to_unload:
  description: NVIDIA's modules that hold the driver loaded, in the order C(modprobe -r) takes them out.
  type: list
  elements: str
  returned: always
installer_args:
  description: The installer's arguments for the module as loaded now.
  type: list
  returned: always
installer_failure:
  description: The one line for an installer that failed (I(installer_rc) not 0), else null.
  type: str
  returned: always
secure_boot:
  description:
    - Whether the firmware booted with Secure Boot on (the C(SecureBoot) EFI variable), the certificate the module is
      signed with (the installer's C(--module-signing-public-key), else DKMS's C(mok_certificate), else
      C(/var/lib/dkms/mok.pub)), and why a module signed with it would be refused at load (not enrolled as a MOK, as
      C(mokutil --test-key) says), else null.
  type: dict
  returned: always
  contains:
    "on": {description: Secure Boot is on, type: bool}
    certificate: {description: the signing certificate's path, type: str}
    problem: {description: "why the module would not load, or null", type: str}
    remedy: {description: "what makes it load (the certificate made and enrolled), or null", type: str}
"""

import glob
import os
from datetime import datetime

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.provision.pve_sglang.plugins.module_utils import boot_kernel
from ansible_collections.provision.pve_sglang.plugins.module_utils import nvidia_driver as rules


def _run(module, argv: list[str]) -> str | None:
    """A command's stdout, or None where the tool is missing or fails."""
    tool = module.get_bin_path(argv[0])
    if not tool:
        return None
    rc, out, _err = module.run_command([tool, *argv[1:]])
    return out if rc == 0 else None


def _module_users(proc_modules: str, name: str) -> int:
    for line in proc_modules.splitlines():
        fields = line.split()
        if len(fields) > 2 and fields[0] == name:
            return int(fields[2])
    return 0


def read_report(module) -> dict:
    kernel = os.uname().release
    proc_modules = boot_kernel.read_text("/proc/modules") or ""
    modinfo = (_run(module, ["modinfo", "-k", kernel, "-F", "version", "nvidia"]) or "").strip() or None
    dkms = rules.parse_dkms_status(_run(module, ["dkms", "status", "-m", "nvidia"]) or "")
    return {
        "kernel": kernel,
        "next_kernel": boot_kernel.on_this_node(boot_kernel.detect_bootloader(module)[0]),
        "loaded": rules.module_version(boot_kernel.read_text("/proc/driver/nvidia/version")),
        "installed": rules.installed_version(modinfo, dkms, kernel),
        "dkms": dkms,
        "nouveau_loaded": any(line.split()[:1] == ["nouveau"] for line in proc_modules.splitlines()),
        "nvswitch": rules.nvswitch_present(_run(module, ["lspci", "-n", "-d", "10de:"]) or ""),
        "module_users": _module_users(proc_modules, "nvidia"),
    }


def secure_boot(module, args: list[str]) -> dict:
    """{on, certificate, problem}: whether the module this role builds would be refused at load (module_utils)."""
    try:
        with open(rules.SECURE_BOOT_VAR, "rb") as handle:
            raw = handle.read()
    except OSError:
        raw = None
    on = rules.secure_boot_on(raw)
    # dkms reads framework.conf, then framework.conf.d/*.conf in order: the last mok_certificate wins
    confs = [rules.DKMS_FRAMEWORK, *sorted(glob.glob(rules.DKMS_FRAMEWORK + ".d/*.conf"))]
    certificate = rules.signing_certificate("\n".join(boot_kernel.read_text(c) or "" for c in confs), args)
    exists, said = os.path.exists(certificate), None
    tool = module.get_bin_path("mokutil") if on and exists else None
    if tool:
        _rc, out, err = module.run_command([tool, "--test-key", certificate])
        said = out + err
    problem = rules.secure_boot_problem(on, certificate, exists, said)
    return {
        "on": on,
        "certificate": certificate,
        "problem": problem,
        "remedy": rules.secure_boot_remedy(certificate, exists) if problem else None,
    }


def input_problems(params: dict) -> list[str]:
    """One line per inventory variable that cannot be used, each naming it (no pin at all: nothing to check)."""
    if not rules.pinned(params["version"]):
        return []
    checks = [("nvidia_driver_version", rules.pin_problem(params["version"]))]
    if params.get("installer") is not None:
        checks.append(("nvidia_driver_installer", rules.source_problem(params["installer"])))
    if params.get("installer_sha256") is not None:
        checks.append(("nvidia_driver_installer_sha256", rules.sha256_problem(params["installer_sha256"])))
    prefix = f"{params['host']}: " if params.get("host") else ""
    return [f"{prefix}{name}: {problem}" for name, problem in checks if problem]


def main():
    module = AnsibleModule(
        argument_spec={
            "version": {"type": "str", "default": ""},
            "installer": {"type": "str"},
            "installer_sha256": {"type": "str"},
            "installer_args": {"type": "list", "elements": "str", "default": []},
            "host": {"type": "str", "default": ""},
            "installer_rc": {"type": "int"},
            "installer_started": {"type": "str"},
            "installer_output": {"type": "str", "default": ""},
        },
        supports_check_mode=True,
    )
    problems = input_problems(module.params)
    if problems:
        module.fail_json(msg="; ".join(problems))
    p = module.params
    report = read_report(module)
    module.exit_json(
        changed=False,
        report=report,
        decision=rules.decide(p["version"], report),
        after_install=rules.after_install(p["version"], report["loaded"]),
        modules_to_unload=list(rules.MODULES_TO_UNLOAD),
        installer_args=rules.installer_args(p["installer_args"], running_driver_stays=report["loaded"] is not None),
        installer_failure=installer_failure(p),
        secure_boot=secure_boot(module, p["installer_args"]),
    )


def installer_failure(params: dict) -> str | None:
    """The one line for the installer this run ran, where it failed: its last error read from its log."""
    if params.get("installer_rc") in (None, 0):
        return None
    log = rules.installer_log(params["installer_args"])
    host = params["host"] or os.uname().nodename
    return rules.installer_failure(
        host,
        params["version"],
        params["installer_rc"],
        log,
        _log_since(log, params),
        params.get("installer_output") or "",
    )


def _log_since(path: str, params: dict) -> str | None:
    """The installer's log, where this run's installer wrote it (not older than its start)."""
    try:
        started = datetime.strptime(params.get("installer_started") or "", "%Y-%m-%d %H:%M:%S.%f").timestamp()
    except ValueError:
        started = 0.0
    try:
        written = os.stat(path).st_mtime
    except OSError:
        return None
    return boot_kernel.read_text(path) if written >= started - 1 else None


if __name__ == "__main__":
    main()
