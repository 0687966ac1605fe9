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
n=$(cat /etc/lab/gpus 2>/dev/null || echo 2)
link=/var/lib/dkms/nvidia/kernel-$(uname -r)-$(uname -m)
if [ -L "$link" ]; then
  version=$(readlink "$link" | cut -d/ -f1)
elif [ -s /etc/lab/driver_version ]; then
  version=$(cat /etc/lab/driver_version)
else
  exit 0
fi
D=/run/lab/driver/nvidia
mkdir -p "$D/gpus" "$D/capabilities/mig"
printf 'NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  %s  Release Build  (lab@provision)  \nGCC version:  gcc version 12.2.0 (Debian 12.2.0-14) \n' "$version" > "$D/version"
i=0
while [ "$i" -lt "$n" ]; do
  bus=$(printf '0000:%02x:00.0' $((0x41 + i)))
  mkdir -p "$D/gpus/$bus"
  printf 'Model: \t\t Lab Fake GPU (no device)\nIRQ:   \t\t 0\nGPU UUID: \t GPU-1ab00000-0000-4000-8000-%012d\nVideo BIOS: \t 00.00.00.00.00\nBus Type: \t PCIe\nDMA Size: \t 52 bits\nDMA Mask: \t 0xfffffffffffff\nBus Location: \t %s\nDevice Minor: \t %d\nGPU Firmware: \t %s\nGPU Excluded:\t No\n' \
    "$i" "$bus" "$i" "$version" > "$D/gpus/$bus/information"
  i=$((i + 1))
done
printf 'DeviceFileMinor: 1\nDeviceFileMode: 256\nDeviceFileModify: 1\n' > "$D/capabilities/mig/config"
printf 'DeviceFileMinor: 2\nDeviceFileMode: 292\nDeviceFileModify: 1\n' > "$D/capabilities/mig/monitor"
free_major() {  # the highest char major not in /proc/devices, below $1
  m=$1
  while awk '/^Block/{exit} {print $1}' /proc/devices | grep -qx "$m"; do m=$((m - 1)); done
  echo "$m"
}
uvm=$(free_major 511)
printf 'nvidia 195\nnvidia-uvm %s\nnvidia-caps %s\n' "$uvm" "$(free_major $((uvm - 1)))" > /run/lab/driver-majors
mountpoint -q /proc/driver || mount --bind /run/lab/driver /proc/driver
