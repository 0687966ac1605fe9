"""Constants and helpers shared by the verify suites and their conftest."""

from __future__ import annotations

from provision.paths import module_util

STATE_DIR = "/var/lib/provision"
SMOKE_QUESTION = "What is 7 * 13?"
SMOKE_EXPECT = "91"
# the host variables the checks read: playbooks/verify_probe.yml renders these, and only these (the
# others may hold secrets), through Ansible, so templates, vault and precedence are Ansible's
HOST_VARS = ("verify_smoke_question", "verify_smoke_expect", "verify_session_tokens")

NODE_FILES = [
    f"{STATE_DIR}/verify.json",
    f"{STATE_DIR}/kernel-cmdline/wanted.json",
    f"{STATE_DIR}/kernel-findings.json",
]
CONTAINER_FILES = [f"{STATE_DIR}/verify.json", f"{STATE_DIR}/sglang-service.json"]
SERVICE_STATE = CONTAINER_FILES[1]  # what the sglang role recorded: address, port, P2P policy
NO_SGLANG = f"{SERVICE_STATE} is missing: the sglang phase has not run here"
DRIVER_QUERY = ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"]
USERSPACE_QUERY = ["nvidia-smi", "--version"]


# the GPU DMA fault lines of a node's kernel log (plugins/module_utils/kernel_faults.py)
kernel_faults = module_util("kernel_faults")
# what P2P off sets for a server, as the sglang role sets it (plugins/module_utils/gpu_p2p.py)
gpu_p2p = module_util("gpu_p2p")
# which device nodes are GPUs' (plugins/module_utils/gpu_devices.py)
gpu_devices = module_util("gpu_devices")


def smoke_question(host_vars: dict) -> str:
    """The question the smoke check asks (verify_smoke_question, else the default)."""
    return host_vars.get("verify_smoke_question") or SMOKE_QUESTION


def probe_request(suites: list[str]) -> dict:
    """What probe.py reads on a host that runs these suites (a container's node runs none, and is
    read for the container's checks). The playbook replaces a container's question with the host's
    verify_smoke_question where it has one."""
    if "test_container.py" in suites:
        return {"files": CONTAINER_FILES, "commands": [USERSPACE_QUERY], "sglang_state": CONTAINER_FILES[1],
                "question": SMOKE_QUESTION, "env_values": sorted(gpu_p2p.P2P_OFF_ENV)}  # fmt: skip
    return {"files": NODE_FILES, "commands": [DRIVER_QUERY, kernel_faults.journal_argv()]}


def cannot_read(name: str, error: str) -> str:
    """Why a host's checks, and its capacity, cannot be decided: the probe has nothing from it."""
    return f"cannot read {name}: {error or 'no reading'}"
