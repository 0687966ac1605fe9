"""Jinja filter: NVIDIA's URL of the .run installer for a driver version (plugins/module_utils/nvidia_driver.py)."""

from __future__ import annotations

from ansible_collections.provision.pve_sglang.plugins.module_utils.nvidia_driver import download_url


class FilterModule:
    def filters(self):
        # "580.95.05" | provision.pve_sglang.nvidia_installer_url
        #   -> https://us.download.nvidia.com/tesla/580.95.05/NVIDIA-Linux-x86_64-580.95.05.run
        return {"nvidia_installer_url": download_url}
