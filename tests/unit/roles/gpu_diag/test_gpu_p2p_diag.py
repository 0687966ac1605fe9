"""The diagnostic's decision logic, on the CPU, with injected copy functions.

The script's checks are written against make/direct/via_host/equal callables; here they
work on bytearrays, so a copy that flips a bit, one that stalls, and a correct one can be
injected without any GPU.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
import time

import pytest

from tests.loaders import REPO, repo_file

SCRIPT = REPO / "roles" / "gpu_diag" / "files" / "gpu_p2p_diag.py"
diag = repo_file("roles/gpu_diag/files/gpu_p2p_diag.py")

PAIRS = [(0, 1), (1, 0)]
SIZES = [4096, 65536]


def make(src, size, seed):
    return bytearray((seed + i * 7) & 0xFF for i in range(size))


def via_host(data, dst):
    return bytes(data)


def equal(a, b):
    return bytes(a) == bytes(b)


def good_copy(data, dst):
    return bytes(data)


def flip_copy(data, dst):
    out = bytearray(data)
    out[len(out) // 3] ^= 0x10
    return bytes(out)


def flip_large_only(data, dst):
    return flip_copy(data, dst) if len(data) > 8192 else bytes(data)


def stall_copy(data, dst):
    time.sleep(2.0)
    return bytes(data)


def run(direct, timeout=0.5):
    return diag.check_peer_copies(PAIRS, SIZES, 2, make, direct, via_host, equal, timeout)


def nccl_ok():
    return {"status": "ok", "wrong_elements": 0}


def test_correct_copies_are_healthy():
    copies = run(good_copy)
    assert [c["status"] for c in copies] == ["ok", "ok"]
    assert all(c["copies"] == 4 and c["mismatches"] == [] for c in copies)
    out = diag.report(2, copies, nccl_ok(), nccl_ok())
    assert (out["verdict"], out["recommended_sglang_p2p"]) == ("healthy", "on")


def test_flipped_bit_is_p2p_corrupt():
    copies = run(flip_copy)
    assert all(c["status"] == "corrupt" and len(c["mismatches"]) == 4 for c in copies)
    out = diag.report(2, copies, nccl_ok(), nccl_ok())
    assert (out["verdict"], out["recommended_sglang_p2p"]) == ("p2p-corrupt", "off")
    assert "0->1" in out["reason"]


def test_corruption_only_at_large_sizes_is_caught():
    # SGLang's own probe checks 1 KiB only; the diagnostic must look at large copies too
    copies = run(flip_large_only)
    assert [m["bytes"] for m in copies[0]["mismatches"]] == [65536, 65536]
    assert diag.decide(2, copies, nccl_ok(), nccl_ok())[0] == "p2p-corrupt"


def test_stalled_copy_is_p2p_hang_within_the_timeout():
    start = time.monotonic()
    copies = run(stall_copy, timeout=0.3)
    assert time.monotonic() - start < 1.5, "a hang must not block the run"
    assert [c["status"] for c in copies] == ["hang", "hang"]
    assert "no answer after" in copies[0]["error"]
    out = diag.report(2, copies, nccl_ok(), nccl_ok())
    assert (out["verdict"], out["recommended_sglang_p2p"]) == ("p2p-hang", "off")


def test_copy_error_counts_as_hang_or_failure():
    def boom(data, dst):
        raise RuntimeError("CUDA error: an illegal memory access was encountered")

    copies = run(boom)
    assert copies[0]["status"] == "error" and "illegal memory access" in copies[0]["error"]
    assert diag.decide(2, copies, nccl_ok(), nccl_ok())[0] == "p2p-hang"


def test_an_allocation_failure_beside_a_live_server_is_its_own_verdict():
    def no_room(data, dst):  # what torch raises when the server holds ~90% of the GPU's memory
        raise RuntimeError(
            "CUDA out of memory. Tried to allocate 256.00 MiB. GPU 1 has a total capacity of 139.81 GiB of which "
            "104.00 MiB is free."
        )

    copies = run(no_room)
    assert copies[0]["status"] == "no-memory"
    out = diag.report(2, copies, nccl_ok(), nccl_ok())
    assert (out["verdict"], out["recommended_sglang_p2p"]) == ("insufficient-gpu-memory", None)
    assert "says nothing about P2P" in out["reason"] and "Tried to allocate 256.00 MiB" in out["reason"]
    # NCCL's own wording, from its worker log, is the same verdict, not nccl-broken or p2p-hang
    nccl_oom = {"status": "no-memory", "error": "worker exit codes [1]; NCCL WARN Cuda failure 'out of memory'"}
    assert diag.decide(2, run(good_copy), nccl_ok(), nccl_oom)[0] == "insufficient-gpu-memory"
    assert diag.out_of_memory("include/alloc.h:228 NCCL WARN Cuda failure 2 'out of memory'")


def test_a_fault_seen_is_reported_even_when_another_test_ran_short_of_memory():
    short = {"status": "no-memory", "error": "CUDA out of memory"}
    assert diag.decide(2, run(good_copy), {"status": "corrupt"}, short)[0] == "p2p-corrupt"
    assert diag.decide(2, run(good_copy), {"status": "hang"}, short)[0] == "p2p-hang"
    assert diag.decide(2, run(stall_copy), nccl_ok(), short)[0] == "p2p-hang"
    assert diag.decide(2, run(flip_copy), short, short)[0] == "p2p-corrupt"


def test_nccl_wrong_with_p2p_only_is_p2p_corrupt():
    copies = run(good_copy)
    assert diag.decide(2, copies, {"status": "corrupt"}, nccl_ok())[0] == "p2p-corrupt"


def test_nccl_hang_with_p2p_only_is_p2p_hang():
    assert diag.decide(2, run(good_copy), {"status": "hang"}, nccl_ok())[0] == "p2p-hang"


def test_nccl_broken_without_p2p_too():
    verdict, reason = diag.decide(2, run(good_copy), {"status": "corrupt"}, {"status": "corrupt"})
    assert verdict == "nccl-broken" and "NCCL_P2P_DISABLE=1" in reason


def test_no_gpu():
    out = diag.report(0, [], None, None)
    assert (out["verdict"], out["recommended_sglang_p2p"]) == ("no-gpu", None)


def test_single_gpu_is_healthy_with_reason():
    verdict, reason = diag.decide(1, [], nccl_ok(), nccl_ok())
    assert verdict == "healthy" and "one GPU" in reason


def test_transport_parsing_matches_nccl_lines():
    log = (
        "vm:717:717 [0] NCCL INFO Channel 00/0 : 0[0] -> 1[1] via P2P/CUMEM\n"
        "vm:797:797 [0] NCCL INFO Channel 00 : 0[0] -> 1[1] via SHM/direct/direct\n"
        "vm:797:797 [0] NCCL INFO Channel 01 : 0[0] -> 1[1] via P2P/IPC/read\n"
    )
    assert diag.transports_from_log(log) == ["P2P/CUMEM", "P2P/IPC/read", "SHM/direct/direct"]


def test_script_without_torch_reports_no_gpu_cleanly(tmp_path):
    # the interpreter running the tests has no torch: the script must say so, not crash
    pytest.importorskip("json")
    if importlib.util.find_spec("torch") is not None:
        pytest.skip("torch is installed here")
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), "--no-host-findings"], capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 1
    assert "Traceback" not in proc.stderr
    out = json.loads(proc.stdout)
    assert out["verdict"] == "no-gpu" and "PyTorch not installed" in out["reason"]


def test_recorded_h200_outputs_are_healthy():
    docs = REPO / "docs" / "diag"
    two = json.loads((docs / "h200-x2.json").read_text())
    assert two["verdict"] == "healthy" and two["gpu_count"] == 2
    assert two["tests"]["nccl_allreduce_p2p"]["transports"] == ["P2P/CUMEM"]
    assert two["tests"]["nccl_allreduce_p2p_disabled"]["transports"] == ["SHM/direct/direct"]


# lspci -vvv lines of two switch ports, as pciutils' ls-ecaps.c cap_acs prints the ACS control register
LSPCI_ACS = """\
41:00.0 PCI bridge: Broadcom / LSI PEX890xx PCIe Gen 5 Switch (rev b0)
\t\tACSCap:\tSrcValid+ TransBlk+ ReqRedir+ CmpltRedir+ UpstreamFwd+ EgressCtrl+ DirectTrans+
\t\tACSCtl:\tSrcValid+ TransBlk- ReqRedir+ CmpltRedir+ UpstreamFwd+ EgressCtrl- DirectTrans-
42:00.0 PCI bridge: Broadcom / LSI PEX890xx PCIe Gen 5 Switch (rev b0)
\t\tACSCtl:\tSrcValid+ TransBlk- ReqRedir- CmpltRedir- UpstreamFwd- EgressCtrl- DirectTrans-
"""


def test_acs_counts_the_ports_that_redirect_peer_traffic_not_only_source_validation():
    assert diag.acs_control(LSPCI_ACS) == {"lines": 2, "redirecting": 1, "direct_translated": 0, "src_valid_enabled": 2}
