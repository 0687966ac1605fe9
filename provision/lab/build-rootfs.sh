#!/bin/bash
# Builds the lab's Debian 12 (bookworm) root filesystem from Debian's packages only.
#   build-rootfs.sh OUT_DIR DEB_CACHE_DIR
# The rootfs serves both the lab VMs (PVE host stand-ins: kernel, GRUB, systemd-boot) and
# the nspawn containers (LXC stand-ins). Lab-only additions (fake GPU nodes, nvidia-smi and
# proxmox-boot-tool shims) are laid down by lab-overlay/ at disk-build time, not here.
# Timers and boot-time housekeeping masked below (apt, man-db, e2scrub, dpkg's database backup, fstrim) play
# no part in what provision does; under TCG, e2scrub_reap alone took 12-30 s of the guest's CPU at every boot.
# The initramfs holds only the modules a lab VM needs to mount its root (MODULES=list). Debian's default,
# MODULES=most, made a 30 MB initramfs for every boot to load and unpack under TCG (list: 6.6 MB); rebuilding it
# inside a VM, as the driver phase does after it blacklists nouveau, took 67 s with MODULES=dep and 46 s with list,
# measured back to back, and more than 10 minutes with most on a loaded machine.
set -euo pipefail
OUT=$1 CACHE=$2
mkdir -p "$CACHE"
rm -rf "$OUT.tmp"
PACKAGES=systemd-sysv,udev,dbus,grub-pc,systemd-boot,openssh-server,python3,python3-apt
PACKAGES+=,python3-venv,python3-pip,iproute2,sudo,kmod,procps,ca-certificates,less,zstd,e2fsprogs,dosfstools
PACKAGES+=,pciutils,curl
# What the sglang role installs into a GPU container at run time (roles/sglang/defaults sglang_runtime_packages:
# Triton's C compiler and the headers of the service's Python): downloaded, not installed, into a local apt
# repository that is the lab's only apt source, so a container made from this rootfs lacks them until apt installs
# them, as one made from PVE's minimal template does. Its Packages index is what apt-ftparchive writes: each .deb's
# control fields, then Filename, Size and SHA256.
export CT_RUNTIME_PACKAGES="gcc libc6-dev python3-dev"
# Two real kernels of Debian 12's 6.1 series, the last two ABIs its pockets hold (bookworm main keeps the previous
# point release's beside its own, and bookworm-security often has a newer one): the image boots the older, and the
# newer is downloaded into the lab's apt repository, with the lab's headers package for it (lab-headers-deb.sh), for
# `provision lab kernel` (a kernel update on a node). A newer series is no choice under this machine's qemu 7.2 TCG:
# bookworm-backports' 6.12 died of a double fault in the SLUB allocator at every boot, whatever the CPU model.
export LAB_KERNELS='set -e
kernels=$(apt-cache pkgnames linux-image-6.1.0- | grep -E "^linux-image-6[.]1[.]0-[0-9]+-amd64\$" | sort -V | tail -n2)
[ "$(echo "$kernels" | wc -w)" = 2 ] || { echo "want two linux-image-6.1.0-N-amd64 in bookworm, found: $kernels" >&2; exit 1; }
DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends $(echo "$kernels" | head -n1)
mkdir -p /srv/lab-apt/partial
apt-get install --download-only --no-install-recommends -y -o Dir::Cache::Archives=/srv/lab-apt/ $(echo "$kernels" | tail -n1)'
export LAB_APT_INDEX='cd /srv/lab-apt && rm -rf partial lock && for d in *.deb; do dpkg-deb -f "$d"; printf "Filename: ./%s\nSize: %s\nSHA256: %s\n\n" "$d" "$(stat -c %s "$d")" "$(sha256sum "$d" | cut -d" " -f1)"; done > Packages'
mmdebstrap --variant=apt --hook-dir=/usr/share/mmdebstrap/hooks/eatmydata \
  --include="$PACKAGES" \
  --skip=essential/unlink \
  --setup-hook='mkdir -p "$1"/var/cache/apt/archives/' \
  --setup-hook="sync-in $CACHE /var/cache/apt/archives/" \
  --essential-hook='chroot "$1" dpkg-divert --local --rename --add /usr/sbin/update-initramfs && ln -s /bin/true "$1"/usr/sbin/update-initramfs' \
  --customize-hook='chroot "$1" sh -c "$LAB_KERNELS"' \
  --customize-hook="sync-out /var/cache/apt/archives $CACHE" \
  --customize-hook='printf "\nvirtio_pci\nvirtio_blk\next4\n" >> "$1"/etc/initramfs-tools/modules && echo MODULES=list > "$1"/etc/initramfs-tools/conf.d/lab-modules.conf' \
  --customize-hook='rm "$1"/usr/sbin/update-initramfs && chroot "$1" dpkg-divert --local --rename --remove /usr/sbin/update-initramfs && chroot "$1" update-initramfs -c -k all' \
  --customize-hook='mkdir -p "$1"/srv/lab-apt/partial && chroot "$1" apt-get install --download-only --no-install-recommends -y -o Dir::Cache::Archives=/srv/lab-apt/ $CT_RUNTIME_PACKAGES' \
  --customize-hook="$(dirname "$0")"'/lab-headers-deb.sh "$1"/srv/lab-apt' \
  --customize-hook='chroot "$1" sh -c "$LAB_APT_INDEX"' \
  --customize-hook='echo "deb [trusted=yes] file:/srv/lab-apt ./" > "$1"/etc/apt/sources.list' \
  --customize-hook='for t in apt-daily.timer apt-daily-upgrade.timer man-db.timer e2scrub_all.timer e2scrub_reap.service dpkg-db-backup.timer fstrim.timer; do chroot "$1" systemctl mask $t; done' \
  --customize-hook='chroot "$1" systemctl enable systemd-networkd' \
  --customize-hook='rm -f "$1"/etc/ssh/ssh_host_*' \
  bookworm "$OUT.tmp" \
  "deb http://deb.debian.org/debian bookworm main" \
  "deb http://deb.debian.org/debian bookworm-updates main" \
  "deb http://deb.debian.org/debian-security bookworm-security main"
rm -rf "$OUT"
mv "$OUT.tmp" "$OUT"
