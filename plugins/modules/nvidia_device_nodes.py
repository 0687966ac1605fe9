#!/usr/bin/python
"""Ansible module: list a host's NVIDIA device nodes and its driver version (read-only)."""

from __future__ import annotations

DOCUMENTATION = r"""
module: nvidia_device_nodes
short_description: Discover NVIDIA device nodes (nvidiaN, nvidiactl, nvidia-uvm*, nvidia-modeset, nvidia-caps/*)
author: provision maintainers (!UNKNOWN)
description:
  - Lists each node with its type, mode, major and minor, never a directory (PVE rejects directories, so
    /dev/nvidia-caps is listed node by node). Reads the driver version from nvidia-smi or /proc/driver/nvidia/version.
options: {}
"""

EXAMPLES = r"""
- name: List the node's NVIDIA device nodes and driver version
  provision.pve_sglang.nvidia_device_nodes:
  delegate_to: "{{ proxmox_host }}"
  register: host_nodes
"""

RETURN = r"""
nodes: {description: "[{path, type, mode, major, minor}]", type: list, returned: always}
driver_version: {description: "the host driver version, or null when unknown", type: str, returned: always}
uvm_major: {description: the (dynamic) major of /dev/nvidia-uvm, type: int, returned: when present}
"""

import glob
import os
import stat

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.provision.pve_sglang.plugins.module_utils.nvidia_driver import module_version


def kind(mode):
    if stat.S_ISCHR(mode):
        return "char"
    if stat.S_ISBLK(mode):
        return "block"
    if stat.S_ISDIR(mode):
        return "dir"
    if stat.S_ISLNK(mode):
        return "link"
    return "other"


def driver_version(module):
    smi = module.get_bin_path("nvidia-smi")
    if smi:
        rc, out, _err = module.run_command([smi, "--query-gpu=driver_version", "--format=csv,noheader"])
        versions = sorted({line.strip() for line in out.splitlines() if line.strip()})
        if rc == 0 and versions:
            return versions[0], "nvidia-smi"
    try:
        with open("/proc/driver/nvidia/version") as f:
            version = module_version(f.read())
        if version:
            return version, "/proc/driver/nvidia/version"
    except OSError:
        pass
    return None, "neither nvidia-smi nor /proc/driver/nvidia/version answered"


def main():
    module = AnsibleModule(argument_spec={}, supports_check_mode=True)
    paths = sorted(set(glob.glob("/dev/nvidia*")) | set(glob.glob("/dev/nvidia-caps/*")))
    nodes, skipped = [], []
    for path in paths:
        st = os.lstat(path)
        k = kind(st.st_mode)
        if k == "dir":
            skipped.append(path)
            continue
        entry = dict(path=path, type=k, mode=f"{stat.S_IMODE(st.st_mode):04o}")
        if k in ("char", "block"):
            entry.update(major=os.major(st.st_rdev), minor=os.minor(st.st_rdev))
        nodes.append(entry)
    version, source = driver_version(module)
    result = dict(
        changed=False, nodes=nodes, directories_skipped=skipped, driver_version=version, driver_version_source=source
    )
    uvm = [n for n in nodes if n["path"] == "/dev/nvidia-uvm" and "major" in n]
    if uvm:
        result["uvm_major"] = uvm[0]["major"]
    module.exit_json(**result)


if __name__ == "__main__":
    main()
