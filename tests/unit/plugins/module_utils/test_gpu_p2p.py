"""The per-link P2P decision of the sglang role (plugins/module_utils/gpu_p2p.py), on real topo -m outputs."""

from __future__ import annotations

import pytest

from provision.paths import module_util
from tests.unit import FIXTURES

p2p = module_util("gpu_p2p")
TOPO = FIXTURES / "topo"

CONTEXT = {
    "boot_id": "6f1c0d6e-0b43-4c52-9b0e-2f3d7c1a9e55",
    "cmdline": "BOOT_IMAGE=/boot/vmlinuz-6.14.8-2-pve root=/dev/mapper/pve-root ro quiet iommu=nopt kvm_amd.sev_snp=1",
    "iommu": "default domain Translated",
    "driver_version": "580.159.04",
    "gpus": ["0000:41:00.0", "0000:42:00.0"],
}
TRANSLATES = {"translates": True, "source": "default domain Translated"}
PHB = {"gpus": ["GPU0", "GPU1"], "links": [{"a": "GPU0", "b": "GPU1", "link": "PHB"}]}
NV18 = {"gpus": ["GPU0", "GPU1"], "links": [{"a": "GPU0", "b": "GPU1", "link": "NV18"}]}


def healthy(**context_changes):
    return {
        "verdict": "healthy",
        "reason": "every peer copy was bit-exact",
        "context": {**CONTEXT, **context_changes},
        "recorded_at": 1_780_000_000.0,
    }


def topo(name):
    return p2p.parse_topo((TOPO / name).read_text())


def test_parse_hgx_h100_every_pair_nv18():
    t = topo("h100-8x-nv18.txt")
    assert t["gpus"] == [f"GPU{i}" for i in range(8)]
    assert len(t["links"]) == 28 and {link["link"] for link in t["links"]} == {"NV18"}


def test_parse_pcie_machines_and_nics_are_not_gpus():
    t = topo("rtx4090-8x-sys.txt")
    assert len(t["gpus"]) == 8 and {link["link"] for link in t["links"]} == {"SYS"}
    assert topo("rtx5090-2x-phb.txt")["links"] == [{"a": "GPU0", "b": "GPU1", "link": "PHB"}]


def test_parse_the_real_bytes_with_their_terminal_escapes():
    # nvidia-smi underlines the header (ESC[4m ... ESC[0m) even into a pipe: a parser that looks for a
    # plain "GPU0" first token finds no GPU and would leave P2P on
    raw = (TOPO / "h200-1x-raw.txt").read_bytes()
    assert raw.startswith(b"\t\x1b[4mGPU0\t")
    assert topo("h200-1x-raw.txt") == {"gpus": ["GPU0"], "links": []}
    underlined = (TOPO / "rtx5090-2x-phb.txt").read_text().replace("\tGPU0", "\t\x1b[4mGPU0", 1)
    underlined = underlined.replace("GPU NUMA ID\n", "GPU NUMA ID\x1b[0m\n", 1)
    assert p2p.parse_topo(underlined)["links"] == [{"a": "GPU0", "b": "GPU1", "link": "PHB"}]
    assert p2p.decide("auto", p2p.parse_topo(underlined), TRANSLATES, None, CONTEXT)["policy"] == "off"


def test_parse_space_aligned_output_and_one_gpu():
    assert topo("dask-2x-nv12-space-aligned.txt")["links"] == [{"a": "GPU0", "b": "GPU1", "link": "NV12"}]
    assert topo("h200-1x.txt") == {"gpus": ["GPU0"], "links": []}


def test_nvlink_only_keeps_p2p_on_and_names_the_link():
    d = p2p.decide("auto", topo("h100-8x-nv18.txt"), TRANSLATES, None, CONTEXT)
    assert d["policy"] == "on" and "GPU0-GPU1 NV18" in d["reason"] and "NVLink" in d["reason"]


def test_pcie_behind_a_translating_iommu_without_a_verdict_is_off():
    d = p2p.decide("auto", PHB, TRANSLATES, None, CONTEXT)
    assert d == {
        "policy": "off",
        "reason": "PCIe peers (GPU0-GPU1 PHB) behind a translating IOMMU (default domain Translated); "
        "no diagnostic verdict (provision diag)",
    }


def test_a_healthy_verdict_from_another_boot_leaves_p2p_off_and_says_why():
    d = p2p.decide("auto", PHB, TRANSLATES, healthy(boot_id="0d9e…other-boot"), CONTEXT)
    assert d["policy"] == "off" and "stale: the node's boot id (it rebooted since) changed" in d["reason"]


def test_a_verdict_taken_under_iommu_pt_does_not_survive_the_switch_to_translation():
    before = healthy(cmdline="BOOT_IMAGE=... iommu=pt", iommu="default domain Passthrough")
    d = p2p.decide("auto", PHB, TRANSLATES, before, CONTEXT)
    assert d["policy"] == "off"
    assert "the node's kernel command line, the node's IOMMU mode changed" in d["reason"]


def test_a_healthy_verdict_from_this_context_turns_it_on():
    d = p2p.decide("auto", PHB, TRANSLATES, healthy(), CONTEXT)
    assert d["policy"] == "on" and "diagnostic verdict healthy in this context" in d["reason"]


def test_a_verdict_older_than_the_kernel_phase_change_does_not_count():
    d = p2p.decide("auto", PHB, TRANSLATES, healthy(), CONTEXT, cmdline_changed_at="2026-06-01T00:00:00+00:00")
    assert d["policy"] == "off" and "predates the kernel phase" in d["reason"]
    assert p2p.decide("auto", PHB, TRANSLATES, healthy(), CONTEXT, cmdline_changed_at=1_700_000_000)["policy"] == "on"


def test_a_mix_of_nvlink_and_pcie_is_off_unless_a_current_verdict_says_healthy():
    mix = {
        "gpus": ["GPU0", "GPU1", "GPU2"],
        "links": [
            {"a": "GPU0", "b": "GPU1", "link": "NV12"},
            {"a": "GPU0", "b": "GPU2", "link": "SYS"},
            {"a": "GPU1", "b": "GPU2", "link": "SYS"},
        ],
    }
    off = p2p.decide("auto", mix, TRANSLATES, None, CONTEXT)
    assert off["policy"] == "off" and "GPU0-GPU2 SYS, GPU1-GPU2 SYS" in off["reason"]
    assert p2p.decide("auto", mix, TRANSLATES, healthy(), CONTEXT)["policy"] == "on"


@pytest.mark.parametrize("verdict", ["p2p-corrupt", "p2p-hang", "nccl-broken"])
def test_a_current_bad_verdict_turns_p2p_off_even_on_nvlink(verdict):
    d = p2p.decide("auto", NV18, TRANSLATES, {**healthy(), "verdict": verdict, "reason": "x"}, CONTEXT)
    assert d["policy"] == "off" and d["reason"].startswith(f"diagnostic verdict {verdict} in this context")


def test_insufficient_gpu_memory_is_not_a_p2p_verdict():
    verdict = {**healthy(), "verdict": "insufficient-gpu-memory", "reason": "CUDA out of memory"}
    assert p2p.decide("auto", NV18, TRANSLATES, verdict, CONTEXT)["policy"] == "on"
    d = p2p.decide("auto", PHB, TRANSLATES, verdict, CONTEXT)
    assert d["policy"] == "off" and "says nothing about P2P" in d["reason"]


def test_iommu_mode_prefers_the_gpus_groups_and_is_unknown_without_a_source():
    assert p2p.iommu_mode(["identity", "identity"], "Translated") == {
        "translates": False,
        "source": "GPU IOMMU group type identity",
    }
    assert p2p.iommu_mode(["DMA-FQ"], None)["translates"] is True
    assert p2p.iommu_mode([], None)["translates"] is None
    d = p2p.decide("auto", PHB, p2p.iommu_mode([], None), None, CONTEXT)
    assert d["policy"] == "off" and "may translate" in d["reason"]
    passthrough = p2p.decide("auto", PHB, p2p.iommu_mode([], "Passthrough"), None, CONTEXT)
    assert passthrough["policy"] == "on"


def test_explicit_modes_and_one_gpu():
    assert p2p.decide("on", PHB, TRANSLATES, None, CONTEXT) == {"policy": "on", "reason": "set by sglang_p2p"}
    assert p2p.decide("auto", topo("h200-1x.txt"), TRANSLATES, None, CONTEXT)["policy"] == "on"
