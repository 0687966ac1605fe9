"""Constants and helpers shared by the verify suites and their conftest."""

from __future__ import annotations

import json
import os

from provision.paths import module_util, role_default

# where the roles keep their records on a host unless the inventory sets provision_state_dir; the probe reads the
# files below there (playbooks/verify_probe.yml gives it each host's value)
DEFAULT_STATE_DIR = role_default("provision_common", "provision_state_dir")
SMOKE_QUESTION = "What is 7 * 13?"
SMOKE_EXPECT = "91"
# room for a reasoning model to think before it answers the smoke question (a short budget ends inside its
# reasoning, and the answer comes back empty)
SMOKE_MAX_TOKENS = 2048
# the host variables the checks read: playbooks/verify_probe.yml renders these, and only these (the
# others may hold secrets), through Ansible, so templates, vault and precedence are Ansible's
HOST_VARS = ("verify_smoke_question", "verify_smoke_expect", "verify_session_tokens", "nvidia_driver_version")

# the inventory the checks' testinfra `host` fixture reaches hosts through (plugin.py), set by provision verify
INVENTORY_ENV = "PROVISION_VERIFY_INVENTORY"

# the records the checks read, by their names in the state directory
VERIFY_RECORD = "verify.json"
WANTED = "kernel-cmdline/wanted.json"
FINDINGS = "kernel-findings.json"
SERVICE_STATE = "sglang-service.json"  # what the sglang role recorded: address, port, P2P policy
GATEWAY_STATE = "sglang-gateway.json"  # what the sglang_gateway role recorded: its URL, workers and key files
# the kernel a node boots next (module_utils/boot_kernel.py next_kernel) and the lines it may boot
# (module_utils/next_boot.py lines): absolute paths, read as they are, and the trial record under the state directory
next_boot = module_util("next_boot")
GRUB_CFG, BOOT_PIN = next_boot.GRUB_CFG, "/etc/kernel/proxmox-boot-pin"
NEXT_BOOT_FILES = [next_boot.GRUBENV, next_boot.GRUB_CUSTOM, next_boot.KERNEL_CMDLINE, next_boot.TRIAL_RECORD]
NODE_FILES = [VERIFY_RECORD, WANTED, FINDINGS, GRUB_CFG, BOOT_PIN, *NEXT_BOOT_FILES]
# read as bytes (base64): the one-shot EFI variable systemd-boot takes its next entry from
NODE_BINARY_FILES = [next_boot.ONESHOT]
CONTAINER_FILES = [VERIFY_RECORD, SERVICE_STATE]
GATEWAY_FILES = [VERIFY_RECORD, GATEWAY_STATE]
DRIVER_QUERY = ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"]
USERSPACE_QUERY = ["nvidia-smi", "--version"]
# the kernels the node may boot, the running one, and the kernels DKMS built the NVIDIA module for
BOOT_KERNELS = ["ls", "/boot"]
RUNNING_KERNEL = ["uname", "-r"]
DKMS_STATUS = ["dkms", "status", "-m", "nvidia"]
# the line update-grub writes next, as the shell that grub-mkconfig is gives it
GRUB_CONFIGURED = ["sh", "-c", next_boot.GRUB_CONFIGURED]


# the GPU DMA fault lines of a node's kernel log (plugins/module_utils/kernel_faults.py)
kernel_faults = module_util("kernel_faults")
# what P2P off sets for a server, as the sglang role sets it (plugins/module_utils/gpu_p2p.py)
gpu_p2p = module_util("gpu_p2p")
# the kernel a node boots next (plugins/module_utils/boot_kernel.py)
boot_kernel = module_util("boot_kernel")
# which device nodes are GPUs' (plugins/module_utils/gpu_devices.py)
gpu_devices = module_util("gpu_devices")


def smoke_question(host_vars: dict) -> str:
    """The question the smoke check asks (verify_smoke_question, else the default)."""
    return host_vars.get("verify_smoke_question") or SMOKE_QUESTION


def probe_request(suites: list[str]) -> dict:
    """What probe.py reads on a host that runs these suites (a container's node runs none, and is
    read for the container's checks). The playbook replaces a container's question with the host's
    verify_smoke_question where it has one."""
    if "test_gateway.py" in suites:
        return {
            "files": GATEWAY_FILES,
            "commands": [],
            "gateway_state": GATEWAY_STATE,
            "question": SMOKE_QUESTION,
            "max_tokens": SMOKE_MAX_TOKENS,
        }
    if "test_container.py" in suites:
        return {
            "files": CONTAINER_FILES,
            "commands": [USERSPACE_QUERY],
            "sglang_state": SERVICE_STATE,
            "question": SMOKE_QUESTION,
            "max_tokens": SMOKE_MAX_TOKENS,
            "env_values": sorted(gpu_p2p.P2P_OFF_ENV),
        }
    return {
        "files": NODE_FILES,
        "binary_files": NODE_BINARY_FILES,
        "commands": [
            DRIVER_QUERY,
            kernel_faults.journal_argv(),
            BOOT_KERNELS,
            RUNNING_KERNEL,
            DKMS_STATUS,
            GRUB_CONFIGURED,
        ],
    }


def smoke_failure(status: int, body: str, question: str, expect: str) -> str | None:
    """Why a chat completion fails the smoke check, in one line; None where the answer holds `expect`. A model that
    spends the whole budget reasoning (content null, finish_reason length) is named as that."""
    if status != 200:
        return f"chat completion answered {status}: {body[:200]}"
    choice = json.loads(body)["choices"][0]
    message = choice.get("message") or {}
    answer = message.get("content")
    if not (answer or "").strip():
        why = f"asked {question!r}, the model returned no answer (content {answer!r}, finish_reason "
        why += f"{choice.get('finish_reason')!r})"
        if message.get("reasoning_content") and choice.get("finish_reason") == "length":
            why += f": it was still reasoning when the {SMOKE_MAX_TOKENS} max_tokens ran out"
        return why
    if expect not in answer:
        return f"asked {question!r}, expected {expect!r} in the answer, got {answer[:200]!r}"
    return None


def cannot_read(name: str, error: str) -> str:
    """Why a host's checks, and its capacity, cannot be decided: the probe has nothing from it."""
    return f"cannot read {name}: {error or 'no reading'}"


def record_path(probe: dict, name: str) -> str:
    """Where a record the probe read is on its host: under the state directory the probe was given."""
    return os.path.join(probe.get("state_dir", ""), name)


def no_sglang(probe: dict) -> str:
    """Why a container has no SGLang to check or size: the sglang role's record is missing."""
    return f"{record_path(probe, SERVICE_STATE)} is missing: the sglang phase has not run here"
