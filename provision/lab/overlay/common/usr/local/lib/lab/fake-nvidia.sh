#!/bin/sh
# Lab only: "loads" the NVIDIA kernel module, with no driver behind it. Like the real module it creates
# NO /dev/nvidia* node (nvidia-modprobe, udev rules or nvidia-persistenced do that: see
# /usr/bin/nvidia-modprobe, the lab's shim). What it leaves is what the real module shows in
# /proc/driver/nvidia (formats read on a real H200 node: docs/nvidia-node-h200.md): version, one
# gpus/<bus>/information per GPU with its Device Minor, and the MIG capability files. The lab cannot
# add files to procfs, so they are made under /run/lab/driver and bind-mounted onto /proc/driver.
# The char majors the modules would register (nvidia-uvm, nvidia-caps are dynamic) go to
# /run/lab/driver-majors, where the shims read them instead of /proc/devices.
# Which module "loads": the version DKMS has installed for the running kernel (the lab's stand-in NVIDIA installer
# registers it, as `dkms install` marks it: /var/lib/dkms/nvidia/kernel-<kernel>-<arch> -> <version>/<kernel>/<arch>),
# else the driver the lab was brought up with (/etc/lab/driver_version, from qemu's fw_cfg). A node of
# `provision lab up --bare` has neither until the driver phase installs one: no module, no /proc/driver/nvidia.
set -eu
# Under TCG each process this boot-time unit starts costs a good part of a second, on the path to basic.target and
# so to ssh: files are read with the shell's own `read`, and the directories are made by one mkdir.
n=2; [ -r /etc/lab/gpus ] && read -r n < /etc/lab/gpus
read -r release < /proc/sys/kernel/osrelease; read -r arch < /proc/sys/kernel/arch
link=/var/lib/dkms/nvidia/kernel-$release-$arch
if [ -L "$link" ]; then
  version=$(readlink "$link"); version=${version%%/*}
elif [ -s /etc/lab/driver_version ]; then
  read -r version < /etc/lab/driver_version
else
  exit 0
fi
D=/run/lab/driver/nvidia
dirs="$D/capabilities/mig" i=0
while [ "$i" -lt "$n" ]; do dirs="$dirs $D/gpus/$(printf '0000:%02x:00.0' $((0x41 + i)))"; i=$((i + 1)); done
# shellcheck disable=SC2086
mkdir -p $dirs
printf 'NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  %s  Release Build  (lab@provision)  \nGCC version:  gcc version 12.2.0 (Debian 12.2.0-14) \n' "$version" > "$D/version"
i=0
while [ "$i" -lt "$n" ]; do
  bus=$(printf '0000:%02x:00.0' $((0x41 + i)))
  printf 'Model: \t\t Lab Fake GPU (no device)\nIRQ:   \t\t 0\nGPU UUID: \t GPU-1ab00000-0000-4000-8000-%012d\nVideo BIOS: \t 00.00.00.00.00\nBus Type: \t PCIe\nDMA Size: \t 52 bits\nDMA Mask: \t 0xfffffffffffff\nBus Location: \t %s\nDevice Minor: \t %d\nGPU Firmware: \t %s\nGPU Excluded:\t No\n' \
    "$i" "$bus" "$i" "$version" > "$D/gpus/$bus/information"
  i=$((i + 1))
done
printf 'DeviceFileMinor: 1\nDeviceFileMode: 256\nDeviceFileModify: 1\n' > "$D/capabilities/mig/config"
printf 'DeviceFileMinor: 2\nDeviceFileMode: 292\nDeviceFileModify: 1\n' > "$D/capabilities/mig/monitor"
used=" "  # the char majors in /proc/devices, read once
while read -r major _; do
  case "$major" in Block) break ;; [0-9]*) used="$used$major " ;; esac
done < /proc/devices
free_major() {  # the highest char major not in /proc/devices, below $1
  m=$1
  while case "$used" in *" $m "*) true ;; *) false ;; esac; do m=$((m - 1)); done
  echo "$m"
}
uvm=$(free_major 511)
printf 'nvidia 195\nnvidia-uvm %s\nnvidia-caps %s\n' "$uvm" "$(free_major $((uvm - 1)))" > /run/lab/driver-majors
mountpoint -q /proc/driver || mount --bind /run/lab/driver /proc/driver
