#!/usr/bin/python
"""Ansible module: read a node's NVIDIA driver state and decide what the pinned version needs (read-only)."""

from __future__ import annotations

DOCUMENTATION = r"""
module: nvidia_driver_info
short_description: Read a Proxmox node's NVIDIA driver state and decide what a pinned version needs
description:
  - Reads the loaded module's version (C(/proc/driver/nvidia/version)), the installed module's version for the
    running kernel (C(modinfo -F version nvidia)), the DKMS status of C(nvidia), whether nouveau is loaded
    (C(/proc/modules)), and whether the node has NVSwitches (C(lspci -n), an NVIDIA device of class 0680).
  - Checks the pinned version, the installer's sha256 and its source before anything is read, each failure one line
    naming the inventory variable.
  - Decides whether the installer must run, whether it is an upgrade, whether the module needs loading and whether
    nouveau forces a reboot first (plugins/module_utils/nvidia_driver.py C(decide)).
options:
  version:
    description: The pinned driver version (the inventory's C(nvidia_driver_version)).
    type: str
    required: true
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
    installer: https://us.download.nvidia.com/XFree86/Linux-x86_64/580.95.05/NVIDIA-Linux-x86_64-580.95.05.run
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
    loaded: {description: the loaded module's version, or null, type: str}
    installed: {description: the installed module's version for the running kernel, or null, type: str}
    dkms: {description: "the DKMS entries of nvidia, [{version, kernel, arch, state}]", type: list}
    nouveau_loaded: {description: nouveau is loaded, type: bool}
    nvswitch: {description: the node has NVSwitches (fabric manager needed), type: bool}
    module_users: {description: the loaded nvidia module's use count, type: int}
decision:
  description: What the pinned version needs (install, upgrade, load, reboot_for_nouveau, current, reason).
  type: dict
  returned: always
installer_args:
  description: The installer's arguments for the module as loaded now.
  type: list
  returned: always
"""

import os

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.provision.pve_sglang.plugins.module_utils import nvidia_driver as rules


def _read(path: str) -> str | None:
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return f.read()
    except OSError:
        return None


def _run(module, argv: list[str]) -> str | None:
    """A command's stdout, or None where the tool is missing or fails."""
    tool = module.get_bin_path(argv[0])
    if not tool:
        return None
    rc, out, _ = module.run_command([tool, *argv[1:]])
    return out if rc == 0 else None


def _module_users(proc_modules: str, name: str) -> int:
    for line in proc_modules.splitlines():
        fields = line.split()
        if len(fields) > 2 and fields[0] == name:
            return int(fields[2])
    return 0


def read_report(module) -> dict:
    kernel = os.uname().release
    proc_modules = _read("/proc/modules") or ""
    modinfo = (_run(module, ["modinfo", "-k", kernel, "-F", "version", "nvidia"]) or "").strip() or None
    dkms = rules.parse_dkms_status(_run(module, ["dkms", "status", "-m", "nvidia"]) or "")
    return {
        "kernel": kernel,
        "loaded": rules.module_version(_read("/proc/driver/nvidia/version")),
        "installed": rules.installed_version(modinfo, dkms, kernel),
        "dkms": dkms,
        "nouveau_loaded": any(line.split()[:1] == ["nouveau"] for line in proc_modules.splitlines()),
        "nvswitch": rules.nvswitch_present(_run(module, ["lspci", "-n", "-d", "10de:"]) or ""),
        "module_users": _module_users(proc_modules, "nvidia"),
    }


def input_problems(params: dict) -> list[str]:
    """One line per inventory variable that cannot be used, each naming it."""
    checks = [("nvidia_driver_version", rules.version_problem(params["version"]))]
    if params.get("installer") is not None:
        checks.append(("nvidia_driver_installer", rules.source_problem(params["installer"])))
    if params.get("installer_sha256") is not None:
        checks.append(("nvidia_driver_installer_sha256", rules.sha256_problem(params["installer_sha256"])))
    prefix = f"{params['host']}: " if params.get("host") else ""
    return [f"{prefix}{name}: {problem}" for name, problem in checks if problem]


def main():
    module = AnsibleModule(
        argument_spec={
            "version": {"type": "str", "required": True},
            "installer": {"type": "str"},
            "installer_sha256": {"type": "str"},
            "installer_args": {"type": "list", "elements": "str", "default": []},
            "host": {"type": "str", "default": ""},
        },
        supports_check_mode=True,
    )
    problems = input_problems(module.params)
    if problems:
        module.fail_json(msg="; ".join(problems))
    report = read_report(module)
    args = rules.installer_args(module.params["installer_args"], running_driver_stays=report["loaded"] is not None)
    decision = rules.decide(module.params["version"], report)
    module.exit_json(changed=False, report=report, decision=decision, installer_args=args)


if __name__ == "__main__":
    main()
