"""Build and cache the lab's disk images: a bookworm rootfs, a GRUB disk and a systemd-boot disk."""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import shutil
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

from provision.errors import ProvisionError

HERE = Path(__file__).resolve().parent
ROOT_UUID = "6b3d2f9e-1a2b-4c3d-8e4f-5a6b7c8d9e0f"
ESP_VOLID = "1AB0C0DE"
REQUIRED_TOOLS = {
    "mmdebstrap": "mmdebstrap",
    "qemu-system-x86_64": "qemu-system-x86",
    "qemu-img": "qemu-utils",
    "mkfs.ext4": "e2fsprogs",
    "mkfs.vfat": "dosfstools",
    "mcopy": "mtools",
    "sfdisk": "fdisk",
    "systemd-nspawn": "systemd-container",
    "ip": "iproute2",
    "nsenter": "util-linux",  # the lab's PVE hot-plugs device nodes into a running container
    "unshare": "util-linux",  # the rootfs build runs in a mount namespace of its own
}
# a command run after this prefix mounts in a namespace of its own: its mounts go when its last process does
PRIVATE_MOUNTS = ["unshare", "--mount", "--propagation", "private"]
OVMF_CODE = Path("/usr/share/OVMF/OVMF_CODE_4M.fd")
OVMF_VARS = Path("/usr/share/OVMF/OVMF_VARS_4M.fd")


def check_tools() -> None:
    missing = sorted({pkg for tool, pkg in REQUIRED_TOOLS.items() if not shutil.which(tool)})
    if not OVMF_CODE.exists():
        missing.append("ovmf")
    if missing:
        raise ProvisionError(
            f"the lab needs Debian packages that are not installed: {' '.join(missing)} "
            f"(run .ci/setup, or: apt-get install {' '.join(missing)} eatmydata)"
        )
    if os.geteuid() != 0:
        raise ProvisionError("the lab needs root (mounts, network namespaces, systemd-nspawn)")


def cache_root() -> Path:
    base = os.environ.get("PROVISION_LAB_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME", os.path.expanduser("~/.cache")), "provision", "lab"
    )
    return Path(base)


@contextlib.contextmanager
def cache_lock(progress=print):
    """Held while a lab builds or reads what the cache holds (image, client key, wheels, booted snapshots): labs that
    come up at once (one per pytest-xdist worker) take turns, and none reads another's half-built file."""
    root = cache_root()
    root.mkdir(parents=True, exist_ok=True)
    with open(root / ".lock", "w") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            progress(f"lab: waiting for another lab's bring-up to release {root / '.lock'}")
            fcntl.flock(handle, fcntl.LOCK_EX)
        yield


def _digest(paths: list[Path]) -> str:
    h = hashlib.sha256()
    for path in paths:
        for f in sorted(p for p in ([path] if path.is_file() else path.rglob("*")) if p.is_file()):
            h.update(str(f.relative_to(HERE)).encode())
            h.update(f.read_bytes())
    return h.hexdigest()[:16]


@dataclass
class Image:
    rootfs: Path
    grub_disk: Path
    sdboot_disk: Path
    timings_s: dict[str, float] = field(default_factory=dict)


def _run(cmd: list[str], log: Path, what: str) -> None:
    with log.open("a") as out:
        proc = subprocess.run(cmd, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT)
    if proc.returncode != 0:
        tail = log.read_text(errors="replace").strip().splitlines()[-5:]
        raise ProvisionError(f"lab image: {what} failed (exit {proc.returncode}); see {log}: " + " | ".join(tail))


def unmount_under(tree: Path) -> list[str]:
    """Unmount everything mounted at or under `tree`, deepest first (lazily: a mount still in use goes once it is
    not), so that removing the tree never walks into another filesystem. A rootfs build killed while mmdebstrap had
    /proc, /sys or /dev mounted in it, outside a namespace of its own, leaves them so. Returns what it unmounted."""
    prefix = str(tree.resolve()) if tree.exists() else str(tree)
    with open("/proc/self/mountinfo") as f:
        # field 5 is the mount point, with space, tab, newline and backslash written as octal escapes
        points = [line.split()[4].encode().decode("unicode_escape") for line in f]
    inside = sorted({p for p in points if p == prefix or p.startswith(prefix + "/")}, key=len, reverse=True)
    for point in inside:
        subprocess.run(["umount", "--lazy", point], check=True, stdin=subprocess.DEVNULL, capture_output=True)
    return inside


def ensure_image(progress=print) -> Image:
    """Return the cached image for the current recipe, building what is missing."""
    check_tools()
    root = cache_root()
    rootfs_sources = [HERE / "build-rootfs.sh", HERE / "lab-headers-deb.sh"]
    rootfs_key = _digest(rootfs_sources)
    disks_key = _digest([*rootfs_sources, HERE / "build-disks.sh", HERE / "overlay"])
    rootfs = root / f"rootfs-{rootfs_key}"
    disks = root / f"disks-{disks_key}"
    root.mkdir(parents=True, exist_ok=True)
    log = root / "build.log"
    timings: dict[str, float] = {}
    if not (rootfs / "etc" / "os-release").is_file():
        progress(f"lab image: building the bookworm rootfs with mmdebstrap (about 2 min) -> {rootfs}")
        start = time.monotonic()
        unmount_under(Path(f"{rootfs}.tmp"))
        # in a mount namespace of its own: what mmdebstrap mounts in the tree (/proc, /sys, /dev) goes with the
        # build's processes, a build killed mid-way included
        build = ["bash", str(HERE / "build-rootfs.sh"), str(rootfs), str(root / "debs")]
        _run([*PRIVATE_MOUNTS, *build], log, "rootfs build")
        timings["rootfs_s"] = round(time.monotonic() - start, 1)
    if not ((disks / "grub.raw").is_file() and (disks / "sdboot.raw").is_file()):
        progress(f"lab image: building the GRUB and systemd-boot disks -> {disks}")
        start = time.monotonic()
        _run(
            [
                "bash",
                str(HERE / "build-disks.sh"),
                str(rootfs),
                str(HERE / "overlay"),
                str(disks),
                ROOT_UUID,
                ESP_VOLID,
            ],
            log,
            "disk build",
        )
        timings["disks_s"] = round(time.monotonic() - start, 1)
    for old in root.glob("disks-*"):
        if old != disks:
            shutil.rmtree(old, ignore_errors=True)
    return Image(rootfs=rootfs, grub_disk=disks / "grub.raw", sdboot_disk=disks / "sdboot.raw", timings_s=timings)
