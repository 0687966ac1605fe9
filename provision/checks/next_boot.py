"""What a node boots next, from verify's probe of it: the kernel and its NVIDIA module, the lines the node may boot
and what each does to the IOMMU and to the kernel phase's arguments, and what each of its containers' SGLang units
starts with in that boot. The rules are the roles' own (plugins/module_utils: boot_kernel, next_boot, gpu_p2p,
kernel_cmdline, nvidia_driver); `report` is verify's `next_boot`, and the checks in test_host.py and
test_container.py fail on what it finds."""

from __future__ import annotations

import base64
import json

from provision.checks.support import (
    BOOT_KERNELS,
    BOOT_PIN,
    DKMS_STATUS,
    FINDINGS,
    GRUB_CFG,
    GRUB_CONFIGURED,
    RUNNING_KERNEL,
    SERVICE_STATE,
    WANTED,
    boot_kernel,
    gpu_p2p,
    next_boot,
)
from provision.paths import module_util

kernel_cmdline = module_util("kernel_cmdline")
nvidia_driver = module_util("nvidia_driver")
boot_trial = module_util("boot_trial")


def _json(probe: dict, name: str) -> dict:
    text = probe["files"].get(name)
    try:
        return json.loads(text) if text else {}
    except ValueError:
        return {}


def kernel(probe: dict) -> str:
    """The kernel release the node boots next, by the kernel phase's own rule (module_utils/boot_kernel.py), from the
    boot loader the kernel phase recorded and what the probe read."""
    listing = probe["commands"][" ".join(BOOT_KERNELS)]["stdout"].split()
    vmlinuz = [name[len("vmlinuz-") :] for name in listing if name.startswith("vmlinuz-")]
    running = probe["commands"][" ".join(RUNNING_KERNEL)]["stdout"].strip()
    bootloader = _json(probe, WANTED).get("bootloader")
    return boot_kernel.next_kernel(
        bootloader, probe["files"].get(GRUB_CFG), probe["files"].get(BOOT_PIN), vmlinuz, running
    )


def nvidia_module(probe: dict, release: str) -> tuple[bool, str]:
    """(DKMS built the NVIDIA module for `release`, what dkms status lists)."""
    built = nvidia_driver.parse_dkms_status(probe["commands"][" ".join(DKMS_STATUS)]["stdout"])
    seen = "; ".join(sorted({f"{e['kernel']} {e['state']}" for e in built})) or "none"
    return any(e["kernel"] == release and e["state"] == "installed" for e in built), seen


def _oneshot(probe: dict) -> str | None:
    raw = (probe.get("binary_files") or {}).get(next_boot.ONESHOT)
    return boot_trial.efi_string(base64.b64decode(raw)) if raw else None


def lines(probe: dict) -> list[dict]:
    """The lines the node may boot next (module_utils/next_boot.py lines), each with what it does to the IOMMU
    (`iommu`, against this boot's measured mode), whether that differs from this boot's (`pending`) and, for a line of
    the bootloader the kernel phase configures, what it lacks of the phase's arguments (`lacks`)."""
    files = probe["files"]
    reads = dict(
        grub_cfg=files.get(GRUB_CFG),
        grubenv=files.get(next_boot.GRUBENV),
        grub_custom=files.get(next_boot.GRUB_CUSTOM),
        kernel_cmdline=files.get(next_boot.KERNEL_CMDLINE),
        grub_configured=probe["commands"].get(" ".join(GRUB_CONFIGURED)),
        oneshot=_oneshot(probe),
        trial_line=next_boot.trial_line(files.get(next_boot.TRIAL_RECORD)),
    )
    running_line = probe.get("proc_cmdline") or ""
    # this boot's mode as the P2P decision reads it: the GPUs' IOMMU groups, else the recorded log line
    groups = list((probe.get("gpu_groups") or {}).values())
    running = gpu_p2p.iommu_mode(groups, _json(probe, FINDINGS).get("iommu_default_domain"))
    wanted = _json(probe, WANTED)
    found = []
    for entry in next_boot.lines(reads):
        line = entry["cmdline"]
        own = wanted.get("bootloader") == entry["loader"] and line is not None  # the lines the kernel phase writes
        gap = kernel_cmdline.missing(line, wanted["add"], wanted["remove"]) if own else None
        lacks = [*gap["absent"], *(f"no {a}" for a in gap["still_present"])] if gap and not gap["ok"] else []
        pending = line is not None and next_boot.iommu_args(line) != next_boot.iommu_args(running_line)
        iommu = next_boot.boot_iommu(running_line, running, line)
        found.append(dict(entry, iommu=iommu, pending=pending, lacks=lacks))
    return found


def node(probe: dict, pinned: bool) -> dict:
    """A node's next boot: {kernel, nvidia_module (installed, missing, or not managed: no pinned driver), lines}."""
    release = kernel(probe)
    built, seen = nvidia_module(probe, release)
    state = "not managed" if not pinned else "installed" if built else "missing"
    return {"kernel": release, "nvidia_module": state, "dkms_status": seen, "lines": lines(probe)}


def container(probe: dict, node_lines: list[dict]) -> list[dict]:
    """What a container's SGLang unit starts with in each boot its node may boot next (gpu_p2p.starts_with)."""
    text = probe["files"].get(SERVICE_STATE)
    if not text:
        return []
    record = json.loads(text)
    return [dict(gpu_p2p.starts_with(record, b["cmdline"], b["iommu"]), source=b["source"]) for b in node_lines]


def report(spec: dict) -> dict[str, dict]:
    """verify's `next_boot`: per node that was read (a node verified, or a verified container's node; no container or
    gateway), its next boot
    and, per container on it, its P2P there."""
    readings, containers = spec.get("readings") or {}, spec.get("nodes") or {}
    found = {}
    for name, reading in readings.items():
        suites = (spec.get("hosts") or {}).get(name, [])
        is_node = "test_host.py" in suites or name in containers.values()  # a verified node, or a container's
        if not is_node or not reading.get("probe"):
            continue
        pinned = nvidia_driver.pinned((reading.get("vars") or {}).get("nvidia_driver_version"))
        found[name] = dict(node(reading["probe"], pinned), containers={})
    for ct, name in containers.items():
        probe = (readings.get(ct) or {}).get("probe")
        if name in found and probe:
            found[name]["containers"][ct] = container(probe, found[name]["lines"])
    return found
