"""Jinja tests: is a path a GPU's device node, or one a CUDA process opens (plugins/module_utils/gpu_devices.py)."""

from __future__ import annotations

from ansible_collections.provision.pve_sglang.plugins.module_utils.gpu_devices import is_cuda_node, is_gpu_node


class TestModule:
    def tests(self):
        # paths | select('provision.pve_sglang.gpu_device_node'); files | selectattr('path', '...cuda_device_node')
        return {"gpu_device_node": is_gpu_node, "cuda_device_node": is_cuda_node}
