"""The lab's wheelhouse: the real sglang wheel and the SGLang stand-in, built as a wheel, and
the real SGLang benchmark client with what it imports.

The SGLang role installs from it through the same variables an offline site uses
(`sglang_pip_find_links`, no index), so the lab exercises the real install path.
"""

from __future__ import annotations

import base64
import hashlib
import json
import re
import subprocess
import sys
import zipfile
from pathlib import Path

from provision.errors import ProvisionError
from provision.paths import module_util, role_default

HERE = Path(__file__).resolve().parent
STANDIN_SRC = HERE / "standin" / "sglang_labserver"
# the release the sglang role pins (sglang_version): the lab fetches that wheel and builds its stand-in at it
SGLANG_VERSION = role_default("sglang", "sglang_version")
STANDIN_NAME = "sglang_labserver"
# What `python -m sglang.benchmark.serving` imports in 0.5.23 (found by importing it in an empty venv
# until it ran): through sglang/__init__ and sglang.srt it needs torch, torchvision and triton too.
# Versions come from the sglang wheel's own pins where it has them.
BENCH_CLIENT_IMPORTS = (
    "aiohttp",
    "apache-tvm-ffi",
    "compressed-tensors",
    "datasets",
    "gguf",
    "IPython",
    "msgspec",
    "numpy",
    "orjson",
    "pillow",
    "psutil",
    "pybase64",
    "pyzmq",
    "requests",
    "sentencepiece",
    "starlette",
    "tokenizers",
    "torch",
    "torchvision",
    "tqdm",
    "transformers",
)


def fetch_sglang_wheel(cache: Path, version: str = SGLANG_VERSION) -> Path:
    """The sglang wheel for this Python (3.11 on bookworm), downloaded once into the cache."""
    cache.mkdir(parents=True, exist_ok=True)
    found = sorted(cache.glob(f"sglang-{version}-*.whl"))
    if found:
        return found[0]
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "download",
            "--quiet",
            "--no-deps",
            "--only-binary=:all:",
            "--python-version",
            "3.11",
            "--platform",
            "manylinux_2_34_x86_64",
            "-d",
            str(cache),
            f"sglang=={version}",
        ],
        capture_output=True,
        text=True,
    )
    found = sorted(cache.glob(f"sglang-{version}-*.whl"))
    if proc.returncode != 0 or not found:
        raise ProvisionError(f"lab: cannot download sglang=={version}: {proc.stderr.strip()[-300:]}")
    return found[0]


def _canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def bench_client_requirements(sglang_wheel: Path) -> list[str]:
    """BENCH_CLIENT_IMPORTS with the sglang wheel's version pins (`torch==2.14.1`, ...)."""
    with zipfile.ZipFile(sglang_wheel) as zf:
        meta_name = next(n for n in zf.namelist() if n.endswith(".dist-info/METADATA"))
        metadata = zf.read(meta_name).decode()
    pins: dict[str, str] = {}
    for line in metadata.splitlines():
        if not line.startswith("Requires-Dist:") or "extra ==" in line:
            continue
        requirement = line.split(":", 1)[1].split(";")[0].strip()
        name = re.match(r"[A-Za-z0-9_.\-]+", requirement).group(0)
        pins[_canonical(name)] = requirement[len(name) :].strip()
    return [name + pins.get(_canonical(name), "") for name in BENCH_CLIENT_IMPORTS]


def fetch_bench_client_wheels(sglang_wheel: Path, cache: Path) -> list[Path]:
    """The benchmark client's requirements and everything they need, as wheels for this Python,
    downloaded once into `cache` (about 3 GB: torch is a CUDA build on PyPI)."""
    return _download_once(cache, bench_client_requirements(sglang_wheel), [], "the benchmark client's packages")


def _download_once(cache: Path, requirements: list[str], pip_args: list[str], what: str) -> list[Path]:
    """The wheels of `requirements` (pip requirement lines) in `cache`, downloaded with `pip download` and `pip_args`
    unless the last download there was of the same lines (its requirements.txt)."""
    cache.mkdir(parents=True, exist_ok=True)
    wanted = "\n".join(requirements) + "\n"
    stamp = cache / "requirements.txt"
    if not (stamp.exists() and stamp.read_text() == wanted):
        pending = cache / "requirements.pending"
        pending.write_text(wanted)
        pip = [sys.executable, "-m", "pip", "download", "-q", "--only-binary=:all:", "-d", str(cache)]
        proc = subprocess.run(
            [*pip, *pip_args, "-r", str(pending)],
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
        )
        if proc.returncode != 0:
            raise ProvisionError(f"lab: cannot download {what}: {proc.stderr.strip()[-400:]}")
        pending.replace(stamp)
    return sorted(cache.glob("*.whl"))


def pinned_name(wheel: Path) -> str:
    """`name==version` from a wheel's file name."""
    name, version = wheel.name.split("-")[:2]
    return f"{name}=={version}"


def _record_line(name: str, data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{name},sha256={digest},{len(data)}"


def build_standin_wheel(sglang_wheel: Path, out_dir: Path) -> Path:
    """A pure-Python wheel of the stand-in, carrying the real release's flag list."""
    files: dict[str, bytes] = {}
    for path in sorted(STANDIN_SRC.glob("*.py")):
        files[f"{STANDIN_NAME}/{path.name}"] = path.read_bytes()
    files[f"{STANDIN_NAME}/flags.json"] = json.dumps(
        module_util("sglang_flags").flags_from_wheel(sglang_wheel), indent=0
    ).encode()
    dist = f"{STANDIN_NAME}-{SGLANG_VERSION}.dist-info"
    files[f"{dist}/METADATA"] = (
        f"Metadata-Version: 2.1\nName: {STANDIN_NAME}\nVersion: {SGLANG_VERSION}\n"
        "Summary: provision lab stand-in for SGLang's HTTP server (no model)\nRequires-Python: >=3.9\n"
    ).encode()
    files[f"{dist}/WHEEL"] = b"Wheel-Version: 1.0\nGenerator: provision-lab\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
    record = [_record_line(name, data) for name, data in files.items()] + [f"{dist}/RECORD,,"]
    files[f"{dist}/RECORD"] = ("\n".join(record) + "\n").encode()
    out_dir.mkdir(parents=True, exist_ok=True)
    wheel = out_dir / f"{STANDIN_NAME}-{SGLANG_VERSION}-py3-none-any.whl"
    tmp = wheel.with_suffix(".tmp")
    with zipfile.ZipFile(tmp, "w", zipfile.ZIP_DEFLATED) as zf:
        for name, data in files.items():
            zf.writestr(name, data)
    tmp.replace(wheel)
    return wheel


def build_fake_nvidia_installer(out_dir: Path, version: str) -> Path:
    """The lab's stand-in for NVIDIA-Linux-x86_64-<version>.run (standin/nvidia_installer.sh, with this version and
    the lab's nvidia-smi shim): on a node it takes NVIDIA's flags, registers with DKMS and "loads" the module
    through the lab's fake driver; with --no-kernel-module (a container) it installs the userspace only."""
    shim = (HERE / "overlay" / "common" / "usr" / "local" / "bin" / "nvidia-smi").read_text()
    template = (STANDIN_SRC.parent / "nvidia_installer.sh").read_text()
    script = template.replace("@VERSION@", version).replace("@SMI@", shim)
    path = out_dir / f"NVIDIA-Linux-x86_64-{version}.run"
    path.write_text(script)
    path.chmod(0o755)
    return path


# what pip installs on Debian 12 x86_64 (glibc 2.36): a manylinux wheel of any glibc up to that one
GLIBC_2_36_PLATFORMS = tuple(
    arg
    for platform in [
        *(f"manylinux_2_{minor}" for minor in range(36, 4, -1)),
        "manylinux2014",
        "manylinux2010",
        "manylinux1",
    ]
    for arg in ("--platform", f"{platform}_x86_64")
)


def fetch_gateway_wheels(cache: Path) -> list[Path]:
    """SGLang's gateway and its dependencies as the gateway role pins them (sglang_gateway_requirements, each with its
    sha256), downloaded once into `cache` with pip's hash checking, for the CTs' Python (3.11, manylinux x86_64)."""
    requirements = role_default("sglang_gateway", "sglang_gateway_requirements")
    pip_args = ["--require-hashes", "--python-version", "3.11", *GLIBC_2_36_PLATFORMS]
    return _download_once(cache, requirements, pip_args, "the gateway's packages")
