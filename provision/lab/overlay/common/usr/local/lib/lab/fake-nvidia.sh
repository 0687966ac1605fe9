#!/bin/sh
# Lab only: creates the device nodes the NVIDIA driver would, with no driver behind them
# (opening one gives ENXIO). nvidia0..N-1 and nvidiactl on major 195, like the real driver;
# nvidia-uvm and nvidia-caps on a dynamic major, as the real modules register theirs.
set -eu
n=$(cat /etc/lab/gpus 2>/dev/null || echo 2)
free_major() {  # the highest char major not in /proc/devices, below $1
  m=$1
  while awk '/^Block/{exit} {print $1}' /proc/devices | grep -qx "$m"; do m=$((m - 1)); done
  echo "$m"
}
i=0
while [ "$i" -lt "$n" ]; do
  [ -e "/dev/nvidia$i" ] || mknod -m 666 "/dev/nvidia$i" c 195 "$i"
  i=$((i + 1))
done
[ -e /dev/nvidiactl ] || mknod -m 666 /dev/nvidiactl c 195 255
[ -e /dev/nvidia-modeset ] || mknod -m 666 /dev/nvidia-modeset c 195 254
uvm=$(free_major 511)
[ -e /dev/nvidia-uvm ] || mknod -m 666 /dev/nvidia-uvm c "$uvm" 0
[ -e /dev/nvidia-uvm-tools ] || mknod -m 666 /dev/nvidia-uvm-tools c "$uvm" 1
caps=$(free_major $((uvm - 1)))
mkdir -p /dev/nvidia-caps
[ -e /dev/nvidia-caps/nvidia-cap1 ] || mknod -m 400 /dev/nvidia-caps/nvidia-cap1 c "$caps" 1
[ -e /dev/nvidia-caps/nvidia-cap2 ] || mknod -m 444 /dev/nvidia-caps/nvidia-cap2 c "$caps" 2
