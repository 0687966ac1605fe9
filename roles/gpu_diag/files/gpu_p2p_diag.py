#!/usr/bin/env python3
"""GPU peer-to-peer and NCCL correctness diagnostic. Needs only Python 3.9+ and PyTorch.

Copy it anywhere and run it with the interpreter whose torch you want to test (for
example the SGLang venv's); the host findings need kernel_findings.py and sev_snp.py from
the collection's plugins/module_utils/ beside it. It prints one JSON document on stdout:

- for every ordered GPU pair, direct device-to-device copies at several sizes (up to
  256 MiB by default), repeated, each compared bit-exact with the same data copied
  through the CPU; plus what `can_device_access_peer` claims and the copy bandwidth;
- a NCCL all-reduce across all GPUs, one process per GPU, checked for exact sums at a
  small and a large size, run twice: P2P allowed, and with NCCL_P2P_DISABLE=1, recording
  the transport NCCL chose (its "via P2P/..." or "via SHM/..." lines);
- host findings (IOMMU default domain, SEV-SNP proven or not and why, IO_PAGE_FAULTs: the
  kernel_cmdline module's own rule, read through those two files; ACS control bits);
- a verdict: healthy, p2p-corrupt, p2p-hang, nccl-broken, insufficient-gpu-memory or no-gpu,
  and the recommended `sglang_p2p` policy (none for the last two: they say nothing about P2P).
  Beside a running server, which holds about 90% of each GPU's memory, an allocation that fails
  is reported as insufficient-gpu-memory, never as a hang or a P2P fault.

Every step runs under a timeout, so a hang is reported as a hang. Exit code: 0 healthy,
1 any other verdict, 2 bad usage.

Tools such as p2pBandwidthLatencyTest and nvbandwidth time copies but never look at the
data; silent corruption under a translating IOMMU is exactly what they miss.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

MIB = 1024 * 1024
DEFAULT_SIZES_MIB = (1, 16, 256)
DEFAULT_REPEATS = 3
DEFAULT_STEP_TIMEOUT_S = 60.0
DEFAULT_NCCL_TIMEOUT_S = 180.0
NCCL_SMALL_ELEMENTS = 1024
NCCL_LARGE_ELEMENTS = 256 * MIB // 4  # 256 MiB of float32

HEALTHY, P2P_CORRUPT, P2P_HANG, NCCL_BROKEN, NO_GPU = "healthy", "p2p-corrupt", "p2p-hang", "nccl-broken", "no-gpu"
NO_MEMORY = "insufficient-gpu-memory"
RECOMMENDED_POLICY = {
    HEALTHY: "on",
    P2P_CORRUPT: "off",
    P2P_HANG: "off",
    NCCL_BROKEN: "off",
    NO_GPU: None,
    NO_MEMORY: None,
}
# what CUDA, PyTorch and NCCL print when an allocation fails ("CUDA out of memory. Tried to allocate ...",
# "CUDA error: out of memory", NCCL's "Cuda failure 'out of memory'", cudaErrorMemoryAllocation)
_OUT_OF_MEMORY = re.compile(r"out of memory|OutOfMemoryError|cudaErrorMemoryAllocation", re.IGNORECASE)


def out_of_memory(text: str) -> bool:
    return bool(_OUT_OF_MEMORY.search(text))


class StepTimeout(Exception):
    pass


def run_with_timeout(fn: Callable[[], Any], timeout_s: float) -> Any:
    """Run fn in a daemon thread; raise StepTimeout if it is still running after timeout_s.

    A CUDA call that hangs cannot be interrupted; the thread is abandoned and the
    process exits at the end with os._exit so that it cannot block the report."""
    box: dict[str, Any] = {}

    def target() -> None:
        try:
            box["value"] = fn()
        except BaseException as exc:  # reported to the caller
            box["error"] = exc

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    thread.join(timeout_s)
    if thread.is_alive():
        raise StepTimeout(f"no answer after {timeout_s:.0f}s")
    if "error" in box:
        raise box["error"]
    return box.get("value")


# --------------------------------------------------------------------------------------
# Peer copies. The logic is written against four small functions so that it can be
# tested without GPUs: make(size, seed) -> data on src; direct(data, dst) -> copy on dst
# through the peer path; via_host(data, dst) -> copy on dst through the CPU;
# equal(a, b) -> bool (bit-exact).
# --------------------------------------------------------------------------------------


def _one_copy(src, dst, size, seed, make, direct, via_host, equal, sync, timeout_s) -> tuple[bool, float]:
    """One direct copy src->dst, timed, compared bit-exact with the copy through the CPU."""
    data = run_with_timeout(lambda: make(src, size, seed), timeout_s)

    def timed_copy():
        start = time.perf_counter()
        out = direct(data, dst)
        sync(dst)
        return out, time.perf_counter() - start

    got, seconds = run_with_timeout(timed_copy, timeout_s)
    expected = run_with_timeout(lambda: via_host(data, dst), timeout_s)
    return bool(run_with_timeout(lambda: equal(got, expected), timeout_s)), seconds


def check_peer_copies(
    pairs: list[tuple[int, int]],
    sizes: list[int],
    repeats: int,
    make: Callable[[int, int, int], Any],
    direct: Callable[[Any, int], Any],
    via_host: Callable[[Any, int], Any],
    equal: Callable[[Any, Any], bool],
    timeout_s: float,
    sync: Callable[[int], None] = lambda device: None,
) -> list[dict[str, Any]]:
    results = []
    for src, dst in pairs:
        pair: dict[str, Any] = {"src": src, "dst": dst, "copies": 0, "mismatches": [], "status": "ok"}
        best_gbps = 0.0
        for size in sizes:
            for rep in range(repeats):
                seed = (src * 131 + dst * 17 + size + rep) & 0x7FFFFFFF
                try:
                    got_same, seconds = _one_copy(src, dst, size, seed, make, direct, via_host, equal, sync, timeout_s)
                except StepTimeout as exc:
                    pair["status"] = "hang"
                    pair["error"] = (
                        f"{size // MIB if size >= MIB else size} {'MiB' if size >= MIB else 'bytes'} copy: {exc}"
                    )
                    break
                except Exception as exc:  # a CUDA error is a failed copy, reported as such
                    pair["error"] = f"{type(exc).__name__}: {exc}"
                    pair["status"] = "no-memory" if out_of_memory(pair["error"]) else "error"
                    break
                pair["copies"] += 1
                if seconds > 0:
                    best_gbps = max(best_gbps, size / seconds / 1e9)
                if not got_same:
                    pair["mismatches"].append({"bytes": size, "repeat": rep})
            if pair["status"] != "ok":
                break
        if pair["mismatches"] and pair["status"] == "ok":
            pair["status"] = "corrupt"
        pair["bandwidth_gbps"] = round(best_gbps, 2)
        results.append(pair)
    return results


# --------------------------------------------------------------------------------------
# NCCL all-reduce, one process per GPU (this same file, run with --nccl-worker).
# --------------------------------------------------------------------------------------

_TRANSPORT = re.compile(r"via (P2P/[A-Za-z0-9/_]+|SHM/[A-Za-z0-9/_]+|NET/[A-Za-z0-9/_]+|COLLNET/\S+)")


def transports_from_log(text: str) -> list[str]:
    return sorted(set(_TRANSPORT.findall(text)))


def nccl_worker(rank: int, world: int, port: int) -> int:
    import torch
    import torch.distributed as dist

    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    results = []
    for elements in (NCCL_SMALL_ELEMENTS, NCCL_LARGE_ELEMENTS):
        # integers below 2**24 are exact in float32, so the sum must match bit for bit
        base = torch.arange(elements, device="cuda", dtype=torch.float32).remainder_(1024)
        tensor = base + rank
        dist.all_reduce(tensor)
        torch.cuda.synchronize()
        expected = base * world + sum(range(world))
        wrong = int((tensor != expected).sum().item())
        results.append({"elements": elements, "wrong": wrong})
    dist.destroy_process_group()
    print("NCCL_RESULT " + json.dumps({"rank": rank, "results": results}), flush=True)
    return 0


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_nccl_allreduce(world: int, p2p_disabled: bool, timeout_s: float) -> dict[str, Any]:
    env = dict(os.environ)
    env.update({"NCCL_DEBUG": "INFO", "NCCL_DEBUG_SUBSYS": "INIT,ENV,P2P,SHM,NET"})
    # "0", not absent, when P2P is allowed: the venv's P2P-off .pth sets it to 1 when it is absent (roles/sglang)
    env["NCCL_P2P_DISABLE"] = "1" if p2p_disabled else "0"
    port = _free_port()
    procs = [
        subprocess.Popen(
            [sys.executable, os.path.abspath(__file__), "--nccl-worker", str(rank), str(world), str(port)],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env=env,
        )
        for rank in range(world)
    ]
    started = time.monotonic()
    outputs, hung = _wait_for_workers(procs, started, timeout_s)
    log = "\n".join(outputs)
    result: dict[str, Any] = {
        "p2p_disabled": p2p_disabled,
        "seconds": round(time.monotonic() - started, 2),
        "transports": transports_from_log(log),
        "transport_lines": sorted({line.strip() for line in log.splitlines() if " via " in line})[:8],
    }
    if hung:
        result.update(status="hang", error=f"all-reduce did not finish in {timeout_s:.0f}s")
    else:
        result.update(_allreduce_outcome(log, [p.returncode for p in procs], world))
    return result


def _wait_for_workers(procs: list[subprocess.Popen], started: float, timeout_s: float) -> tuple[list[str], bool]:
    """(each worker's output, whether the run hung): all of them are killed once timeout_s has passed."""
    outputs, hung = [], False
    for proc in procs:
        remaining = max(1.0, timeout_s - (time.monotonic() - started))
        try:
            out, _err = proc.communicate(timeout=remaining)
        except subprocess.TimeoutExpired:
            hung = True
            for p in procs:
                p.kill()
            out, _err = proc.communicate()
        outputs.append(out or "")
    return outputs, hung


def _allreduce_outcome(log: str, returncodes: list[int], world: int) -> dict[str, Any]:
    """status (ok, corrupt, no-memory or error) and what it rests on, from the workers' output and exit codes."""
    ranks = [json.loads(line.split(" ", 1)[1]) for line in log.splitlines() if line.startswith("NCCL_RESULT ")]
    failed = [rc for rc in returncodes if rc != 0]
    if failed or len(ranks) != world:
        tail = [line for line in log.splitlines() if "error" in line.lower() or "warn" in line.lower()][-3:]
        status = "no-memory" if out_of_memory(log) else "error"
        return {"status": status, "error": f"worker exit codes {failed}; " + " | ".join(tail)}
    wrong = sum(r["wrong"] for rank in ranks for r in rank["results"])
    return {
        "sizes_elements": [r["elements"] for r in ranks[0]["results"]],
        "wrong_elements": wrong,
        "status": "ok" if wrong == 0 else "corrupt",
    }


# --------------------------------------------------------------------------------------
# Host findings: data for the verdict's explanation, best effort, never fatal.
# --------------------------------------------------------------------------------------


def _run(argv: list[str]) -> tuple[int, str]:
    """(rc, stdout); a tool that is missing or hangs answers 127, as unreadable."""
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=30, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return 127, ""
    return proc.returncode, proc.stdout


def _module_utils():
    """kernel_findings and sev_snp from the collection's plugins/module_utils/: the gpu_diag role ships them beside
    this script; in the collection's own tree they are three directories up."""
    here = os.path.dirname(os.path.abspath(__file__))
    for where in (here, os.path.join(here, os.pardir, os.pardir, os.pardir, "plugins", "module_utils")):
        if os.path.isfile(os.path.join(where, "kernel_findings.py")):
            if where not in sys.path:
                sys.path.insert(0, where)
            break
    import kernel_findings
    import sev_snp

    return kernel_findings, sev_snp


def host_findings() -> dict[str, Any]:
    """The node's IOMMU and SEV-SNP findings by the kernel_cmdline module's own rule (kernel_findings.py), and the
    PCIe ACS control bits lspci shows (acs_control)."""
    try:
        kernel_findings, sev_snp = _module_utils()
    except ImportError as exc:
        return {"unavailable": f"{exc}: kernel_findings.py and sev_snp.py are not beside {__file__}"}
    dmesg, kernel_log = kernel_findings.read_logs(_run)
    findings = kernel_findings.findings(dmesg, sev_snp.node_proof(kernel_log))
    rc, out = _run(["lspci", "-vvv"])
    if rc == 127:
        findings["acs_ctl"] = "lspci not available"
    else:
        findings["acs_ctl"] = acs_control(out)
    return findings


def acs_control(lspci_vvv):
    """The ACS control bits of every port lspci -vvv shows ("ACSCtl: SrcValid+ TransBlk- ReqRedir+ CmpltRedir+
    UpstreamFwd+ EgressCtrl- DirectTrans-", pciutils ls-ecaps.c cap_acs). P2P between two GPUs under one switch
    goes up to the root complex, through the IOMMU, where a port redirects requests or completions (ReqRedir+,
    CmpltRedir+), and straight across where it does not; SrcValid+ alone redirects nothing."""
    acs = [line.strip() for line in lspci_vvv.splitlines() if "ACSCtl:" in line]
    return {
        "lines": len(acs),
        "redirecting": sum("ReqRedir+" in a or "CmpltRedir+" in a for a in acs),
        "direct_translated": sum("DirectTrans+" in a for a in acs),
        "src_valid_enabled": sum("SrcValid+" in a for a in acs),
    }


# --------------------------------------------------------------------------------------
# Verdict
# --------------------------------------------------------------------------------------


def decide(
    gpu_count: int, copies: list[dict[str, Any]], nccl_p2p: dict[str, Any] | None, nccl_shm: dict[str, Any] | None
) -> tuple[str, str]:
    """The overall verdict and its reason, from the individual tests."""
    if gpu_count == 0:
        return NO_GPU, "no CUDA device is usable"
    fault = _fault(copies, nccl_p2p, nccl_shm)
    if fault is not None:
        return fault
    short = [c for c in copies if c["status"] == "no-memory"]
    short += [run for run in (nccl_p2p, nccl_shm) if _status(run) == "no-memory"]
    if short:  # only when no test showed a fault: a fault seen is a fault, whatever else ran short
        return NO_MEMORY, (
            "a GPU had too little free memory for the test (a running server holds most of it): "
            f"{short[0].get('error', '')[:200]}; this says nothing about P2P: run it before the server starts"
        )
    if gpu_count == 1:
        return HEALTHY, "one GPU: no peer-to-peer path exists; single-GPU work is unaffected"
    return HEALTHY, "every peer copy was bit-exact and NCCL all-reduce was exact with and without P2P"


def _status(run: dict[str, Any] | None) -> str | None:
    return run.get("status") if run is not None else None


def _fault(
    copies: list[dict[str, Any]], nccl_p2p: dict[str, Any] | None, nccl_shm: dict[str, Any] | None
) -> tuple[str, str] | None:
    """The fault verdict the tests show, worst first (NCCL broken without P2P, corrupt, hung), or None."""
    if nccl_shm is not None and nccl_shm.get("status") not in ("ok", "no-memory"):
        return NCCL_BROKEN, f"NCCL all-reduce fails even with NCCL_P2P_DISABLE=1 ({nccl_shm.get('status')})"
    corrupt = [c for c in copies if c["status"] == "corrupt"]
    if corrupt or _status(nccl_p2p) == "corrupt":
        return P2P_CORRUPT, f"peer-to-peer data arrived wrong ({_where(corrupt)})"
    hung = [c for c in copies if c["status"] in ("hang", "error")]
    if hung or _status(nccl_p2p) in ("hang", "error"):
        return P2P_HANG, f"peer-to-peer transfer hung or failed ({_where(hung)})"
    return None


def _where(pairs: list[dict[str, Any]]) -> str:
    return ", ".join(f"{c['src']}->{c['dst']}" for c in pairs) or "NCCL all-reduce with P2P"


def report(
    gpu_count: int,
    copies: list[dict[str, Any]],
    nccl_p2p: dict[str, Any] | None,
    nccl_shm: dict[str, Any] | None,
    extra: dict[str, Any] | None = None,
) -> dict[str, Any]:
    verdict, reason = decide(gpu_count, copies, nccl_p2p, nccl_shm)
    return {
        "verdict": verdict,
        "reason": reason,
        "recommended_sglang_p2p": RECOMMENDED_POLICY[verdict],
        "gpu_count": gpu_count,
        "tests": {
            "peer_copies": copies,
            "nccl_allreduce_p2p": nccl_p2p,
            "nccl_allreduce_p2p_disabled": nccl_shm,
        },
        **(extra or {}),
    }


# --------------------------------------------------------------------------------------
# The torch-backed run
# --------------------------------------------------------------------------------------


def inject_fault(direct: Callable[[Any, int], Any], fault: str | None, step_timeout: float):
    """Wrap the direct copy to prove, on the real machine, that the checks catch faults:
    'flip' flips one bit of every copy after it lands, 'hang' stalls past the step timeout."""
    if fault is None:
        return direct
    if fault == "flip":

        def flipped(data, dst):
            out = direct(data, dst)
            out.view(-1)[len(out.view(-1)) // 2] ^= 1
            return out

        return flipped

    def stalled(data, dst):
        time.sleep(step_timeout * 2)
        return direct(data, dst)

    return stalled


def torch_run(
    sizes_mib: list[int],
    repeats: int,
    step_timeout: float,
    nccl_timeout: float,
    skip_nccl: bool,
    fault: str | None = None,
) -> dict:
    started = time.monotonic()
    extra: dict[str, Any] = {"python": sys.executable, "hostname": socket.gethostname()}
    try:
        import torch
    except ImportError as exc:
        nodes = sorted(n for n in os.listdir("/dev") if n.startswith("nvidia")) if os.path.isdir("/dev") else []
        extra["reason_detail"] = f"PyTorch is not importable from {sys.executable} ({exc}); device nodes: {nodes}"
        return _no_gpu(extra, f"no CUDA device is usable: PyTorch not installed for {sys.executable}")
    extra["torch"] = torch.__version__
    if not torch.cuda.is_available():
        nodes = sorted(n for n in os.listdir("/dev") if n.startswith("nvidia"))
        return _no_gpu(extra, f"no CUDA device is usable: torch.cuda.is_available() is False (device nodes: {nodes})")
    count = torch.cuda.device_count()
    extra.update(_torch_versions(torch, count))
    copies = _torch_peer_copies(torch, count, sizes_mib, repeats, step_timeout, fault)
    nccl_p2p = nccl_shm = None
    if not skip_nccl and count >= 1:
        nccl_p2p = run_nccl_allreduce(count, p2p_disabled=False, timeout_s=nccl_timeout)
        nccl_shm = run_nccl_allreduce(count, p2p_disabled=True, timeout_s=nccl_timeout)
    if fault:
        extra["injected_fault"] = fault
    out = report(count, copies, nccl_p2p, nccl_shm, extra)
    out["seconds"] = round(time.monotonic() - started, 1)
    return out


def _no_gpu(extra: dict[str, Any], reason: str) -> dict[str, Any]:
    out = report(0, [], None, None, extra)
    out["reason"] = reason
    return out


def _torch_versions(torch, count: int) -> dict[str, Any]:
    """The devices' names, and the CUDA and NCCL versions this torch was built with."""
    found: dict[str, Any] = {"devices": [torch.cuda.get_device_name(i) for i in range(count)]}
    found["cuda"] = torch.version.cuda
    try:
        found["nccl"] = ".".join(map(str, torch.cuda.nccl.version()))
    except Exception:
        found["nccl"] = None
    return found


def _torch_peer_copies(
    torch, count: int, sizes_mib: list[int], repeats: int, step_timeout: float, fault: str | None
) -> list[dict[str, Any]]:
    """check_peer_copies on every ordered pair of CUDA devices, each with what can_device_access_peer says."""
    pairs = [(i, j) for i in range(count) for j in range(count) if i != j]

    def make(src: int, size: int, seed: int):
        gen = torch.Generator(device=f"cuda:{src}").manual_seed(seed)
        return torch.randint(0, 256, (size,), dtype=torch.uint8, device=f"cuda:{src}", generator=gen)

    copies = check_peer_copies(
        pairs,
        [s * MIB for s in sizes_mib],
        repeats,
        make,
        direct=inject_fault(lambda data, dst: data.to(f"cuda:{dst}", non_blocking=False), fault, step_timeout),
        via_host=lambda data, dst: data.cpu().to(f"cuda:{dst}"),
        equal=lambda a, b: bool(torch.equal(a, b)),
        timeout_s=step_timeout,
        sync=torch.cuda.synchronize,
    )
    for c in copies:
        c["can_device_access_peer"] = bool(torch.cuda.can_device_access_peer(c["src"], c["dst"]))
    return copies


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--nccl-worker"]:
        return nccl_worker(int(argv[1]), int(argv[2]), int(argv[3]))
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", maxsplit=1)[0])
    parser.add_argument("--sizes-mib", default=",".join(map(str, DEFAULT_SIZES_MIB)), help="copy sizes in MiB")
    parser.add_argument("--repeats", type=int, default=DEFAULT_REPEATS)
    parser.add_argument("--step-timeout", type=float, default=DEFAULT_STEP_TIMEOUT_S)
    parser.add_argument("--nccl-timeout", type=float, default=DEFAULT_NCCL_TIMEOUT_S)
    parser.add_argument("--skip-nccl", action="store_true")
    parser.add_argument("--no-host-findings", action="store_true")
    parser.add_argument(
        "--inject-fault",
        choices=("flip", "hang"),
        help="self-test: corrupt or stall the direct copies to see the checks catch it (verdict is then not real)",
    )
    args = parser.parse_args(argv)
    try:
        sizes = [int(s) for s in args.sizes_mib.split(",") if s.strip()]
    except ValueError:
        parser.error("--sizes-mib: comma-separated integers")
    result = torch_run(sizes, args.repeats, args.step_timeout, args.nccl_timeout, args.skip_nccl, args.inject_fault)
    if not args.no_host_findings:
        result["host_findings"] = host_findings()
    print(json.dumps(result, indent=2, sort_keys=True), flush=True)
    # os._exit: a hung CUDA call in an abandoned thread must not keep the process alive
    os._exit(0 if result["verdict"] == HEALTHY else 1)


if __name__ == "__main__":
    sys.exit(main())
