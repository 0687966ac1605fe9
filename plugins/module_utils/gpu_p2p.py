"""The P2P policy for SGLang's GPUs, decided per link (pure functions; read by the sglang_p2p module and tests).

Three inputs, each with its own truth:
- the links between the container's GPUs, from `nvidia-smi topo -m` (NV# = NVLink, through no IOMMU;
  PIX/PXB/PHB/NODE/SYS = PCIe, whose peer DMA goes through the IOMMU);
- the node's IOMMU mode: the GPUs' own IOMMU groups where sysfs shows them (identity = passthrough,
  DMA/DMA-FQ = translated), else the kernel's "iommu: Default domain type" line of this boot;
- the GPU diagnostic's verdict (provision diag), which counts only in the context it was taken in: the
  node's boot id, kernel command line, IOMMU mode, driver version and the GPU set. A verdict taken under
  iommu=pt says nothing once the node translates: that was the scenario's silent NCCL corruption.
"""

from __future__ import annotations

import re
from datetime import datetime

from ansible_collections.provision.pve_sglang.plugins.module_utils.next_boot import iommu_args

CONTEXT_KEYS = ("boot_id", "cmdline", "iommu", "driver_version", "gpus")
CONTEXT_NAMES = {
    "boot_id": "the node's boot id (it rebooted since)",
    "cmdline": "the node's kernel command line",
    "iommu": "the node's IOMMU mode",
    "driver_version": "the NVIDIA driver version",
    "gpus": "the container's GPU set",
}
# diagnostic verdicts that say nothing about peer-to-peer (RECOMMENDED_POLICY None in gpu_p2p_diag.py)
NOT_ABOUT_P2P = ("no-gpu", "insufficient-gpu-memory")
TRANSLATED_GROUP_TYPES = ("DMA", "DMA-FQ")
# P2P off for an SGLang server: NCCL's peer-to-peer transport through its environment variable, and SGLang's own
# peer-memory all-reduce paths, which ignore that variable: its custom all-reduce, and with tp > 1 FlashInfer's
# all-reduce fusion. The sglang role sets them (the sglang_p2p_off filter); provision verify checks the server.
P2P_OFF_ENV = {"NCCL_P2P_DISABLE": "1"}
P2P_OFF_FLAGS = ("--disable-custom-all-reduce", "--enforce-disable-flashinfer-allreduce-fusion")
# the variable through which the sglang unit's start guard passes the P2P-off flags (roles/sglang/templates/p2p-guard)
GUARD_FLAGS_ENV = "SGLANG_P2P_GUARD_FLAGS"
_NVLINK = re.compile(r"NV\d+$")
_RANK = {False: 0, None: 1, True: 2}  # how strict an IOMMU mode makes the decision: translated > unknown > not
# the real nvidia-smi underlines the matrix header with terminal escapes, even into a pipe:
# "\t\x1b[4mGPU0\tCPU Affinity\t...\x1b[0m" (read on an H200, tests/unit/fixtures/topo/h200-1x-raw.txt)
_ESCAPES = re.compile(r"\x1b\[[0-9;]*m")


def parse_topo(text: str) -> dict:
    """`nvidia-smi topo -m` -> {"gpus": ["GPU0", ...], "links": [{"a", "b", "link"}]} for each GPU pair.

    The matrix columns are the header's names before "CPU Affinity" (GPUs, then NICs); each GPU row holds
    one cell per column ("X" for itself). Everything after "Legend:" is ignored."""
    columns: list[str] = []
    rows: dict[str, list[str]] = {}
    for line in _ESCAPES.sub("", text).split("Legend:")[0].splitlines():
        tokens = line.split()
        if not tokens:
            continue
        if not columns and tokens[0] == "GPU0":
            columns = tokens[: tokens.index("CPU")] if "CPU" in tokens else tokens
        elif columns and tokens[0] in columns and re.fullmatch(r"GPU\d+", tokens[0]):
            rows[tokens[0]] = tokens[1 : 1 + len(columns)]
    gpus = [c for c in columns if re.fullmatch(r"GPU\d+", c) and c in rows]
    links = []
    for i, a in enumerate(gpus):
        for b in gpus[i + 1 :]:
            cells = rows[a]
            links.append({"a": a, "b": b, "link": cells[columns.index(b)] if columns.index(b) < len(cells) else "?"})
    return {"gpus": gpus, "links": links}


def is_nvlink(link: str) -> bool:
    return bool(_NVLINK.match(link))


def p2p_off_flags(tp_size) -> list[str]:
    """The P2P-off flags of a server with this tensor-parallel size (the fusion flag only with tp > 1)."""
    return list(P2P_OFF_FLAGS if int(tp_size) > 1 else P2P_OFF_FLAGS[:1])


def iommu_mode(group_types: list[str], default_domain: str | None) -> dict:
    """{"translates": True/False/None, "source": ...}: the GPUs' groups when sysfs shows them, else the log line."""
    if group_types:
        translated = [t for t in group_types if t in TRANSLATED_GROUP_TYPES]
        return {"translates": bool(translated), "source": "GPU IOMMU group type " + "/".join(sorted(set(group_types)))}
    if default_domain in ("Translated", "Passthrough"):
        return {"translates": default_domain == "Translated", "source": "default domain " + default_domain}
    return {"translates": None, "source": "IOMMU mode unknown (" + (default_domain or "no log line") + ")"}


def _epoch(value) -> float | None:
    if value is None:
        return None
    if isinstance(value, (int, float)):
        return float(value)
    try:
        return datetime.fromisoformat(str(value).replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


def verdict_standing(verdict: dict | None, context: dict, cmdline_changed_at=None) -> tuple[bool, str]:
    """(counts, why): whether a stored diagnostic verdict speaks for this context, and if not, why not."""
    if not verdict:
        return False, "no diagnostic verdict (provision diag)"
    name = verdict.get("verdict", "?")
    if name in NOT_ABOUT_P2P:
        return False, f"the diagnostic verdict {name} says nothing about P2P"
    stored = verdict.get("context")
    if not isinstance(stored, dict):
        return False, f"the diagnostic verdict {name} has no context (an older provision took it): ignored"
    changed = [CONTEXT_NAMES[k] for k in CONTEXT_KEYS if stored.get(k) != context.get(k)]
    if changed:
        return False, f"the diagnostic verdict {name} is stale: {', '.join(changed)} changed since it was taken"
    recorded, marker = _epoch(verdict.get("recorded_at")), _epoch(cmdline_changed_at)
    if marker is not None and (recorded is None or recorded < marker):
        return False, f"the diagnostic verdict {name} predates the kernel phase's last command-line change"
    return True, f"diagnostic verdict {name} in this context: {verdict.get('reason', '')}"


def strictest(running: dict, boots: list[dict]) -> dict | None:
    """The next boot (each {"source", "cmdline", "iommu"}) whose IOMMU mode is stricter than this boot's, the
    strictest of them; None where none is."""
    worst = max(boots, key=lambda b: _RANK[b["iommu"]["translates"]], default=None)
    if worst is None or _RANK[worst["iommu"]["translates"]] <= _RANK[running["translates"]]:
        return None
    return worst


def _pairs(links: list[dict]) -> str:
    return ", ".join(f"{p['a']}-{p['b']} {p['link']}" for p in links)


def decide(
    mode: str, topo: dict, iommu: dict, verdict: dict | None, context: dict, cmdline_changed_at=None, next_boots=()
) -> dict:
    """{"policy": "on"|"off", "reason": ...} for sglang_p2p = mode, for this boot and every boot in `next_boots`
    ({"source", "cmdline", "iommu"} each, module_utils/next_boot.py): a next boot whose IOMMU is stricter than this
    one's decides, and a diagnostic verdict, taken in this boot, says nothing for it.

    An "on" that rests on the IOMMU's mode or on a verdict also says what it holds while (`holds_while`): "iommu"
    (a boot with the same IOMMU arguments) or "boot" (this boot only); the sglang unit's start guard checks it."""
    if mode != "auto":
        return {"policy": mode, "reason": "set by sglang_p2p"}
    if len(topo["gpus"]) < 2:
        return {"policy": "on", "reason": f"{len(topo['gpus'])} GPU(s): no peer-to-peer path"}
    counts, why = verdict_standing(verdict, context, cmdline_changed_at)
    if counts and verdict.get("verdict") != "healthy":
        return {"policy": "off", "reason": why}
    pcie = [p for p in topo["links"] if not is_nvlink(p["link"])]
    if not pcie:
        why = f"every GPU pair is joined by NVLink ({_pairs(topo['links'])}), which does not pass through the IOMMU"
        return {"policy": "on", "reason": why}
    nxt = strictest(iommu, list(next_boots))
    if nxt is not None:
        iommu = {
            "translates": nxt["iommu"]["translates"],
            "source": f"at the next boot: {nxt['source']} has {nxt['iommu']['source']}",
        }
        if counts:
            counts, why = False, f"{why}, but a verdict speaks only for the boot it was taken in, not the next"
    if iommu["translates"] is False:
        why = f"PCIe peers ({_pairs(pcie)}), and the IOMMU does not translate ({iommu['source']})"
        return {"policy": "on", "reason": why, "holds_while": "iommu"}
    where = f"PCIe peers ({_pairs(pcie)}) behind a translating IOMMU ({iommu['source']})"
    if iommu["translates"] is None:
        where = f"PCIe peers ({_pairs(pcie)}), and the IOMMU may translate ({iommu['source']})"
    if counts:
        return {"policy": "on", "reason": f"{where}; {why}", "holds_while": "boot"}
    return {"policy": "off", "reason": f"{where}; {why}"}


def _guarded(guard: dict, line: str | None) -> dict | None:
    """What the unit's start guard does in a boot of `line`: P2P off where the boot is not the one decided in (a
    verdict's boot, or other IOMMU arguments), else None (P2P on, as decided)."""
    if guard.get("container_boot_id"):
        return {
            "p2p": "off",
            "why": "the start guard: P2P on rests on a verdict of the running boot only",
            "safe": True,
        }
    now = " ".join(iommu_args(line)) if line is not None else None
    if now == guard.get("iommu_args"):
        return None
    said = "cannot be read here" if now is None else f"'{now or 'none'}'"
    why = f"the start guard: IOMMU arguments {said}, decided for '{guard.get('iommu_args') or 'none'}'"
    return {"p2p": "off", "why": why, "safe": True}


def starts_with(record: dict, line: str | None, iommu: dict) -> dict:
    """What the sglang unit starts with in a boot of `line` (whose IOMMU mode is `iommu`, {"translates", "source"}),
    from the sglang role's record of its decision (p2p_policy, p2p_mode, p2p_guard, p2p_links): {"p2p": "on"|"off",
    "why", "safe"}. Unsafe is P2P on, chosen by auto, between PCIe peers in a boot that translates or may."""
    if record.get("p2p_policy") == "off":
        return {"p2p": "off", "why": "the P2P policy is off", "safe": True}
    if "p2p_links" not in record:
        why = "the service record predates the next-boot check: run provision apply --tags sglang"
        return {"p2p": "on", "why": why, "safe": False}
    guarded = _guarded(record["p2p_guard"], line) if record.get("p2p_guard") else None
    if guarded:
        return guarded
    pcie = [p for p in record["p2p_links"] if not is_nvlink(p["link"])]
    if record.get("p2p_mode") == "on" or not pcie:
        why = "set by sglang_p2p" if record.get("p2p_mode") == "on" else "no PCIe peers"
        return {"p2p": "on", "why": why, "safe": True}
    safe = iommu["translates"] is False
    said = "does not translate" if safe else "may translate" if iommu["translates"] is None else "translates"
    return {"p2p": "on", "why": f"PCIe peers, and the IOMMU {said} ({iommu['source']})", "safe": safe}
