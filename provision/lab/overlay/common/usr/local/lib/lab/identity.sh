#!/bin/sh
# Lab only: takes this machine's identity from qemu's fw_cfg (set per VM by `provision lab up`):
# ssh host key (so the lab's known_hosts is written before the VM boots), the lab's client
# key for root, hostname and the
# number of fake GPUs. Containers get theirs written into their root directly.
set -eu
modprobe qemu_fw_cfg 2>/dev/null || true
FW=/sys/firmware/qemu_fw_cfg/by_name/opt/lab
[ -d "$FW" ] || exit 0
if [ -r "$FW/ssh_host_ed25519_key/raw" ]; then
  install -m600 "$FW/ssh_host_ed25519_key/raw" /etc/ssh/ssh_host_ed25519_key
  install -m644 "$FW/ssh_host_ed25519_key.pub/raw" /etc/ssh/ssh_host_ed25519_key.pub
fi
if [ -r "$FW/authorized_keys/raw" ]; then
  install -d -m700 /root/.ssh
  install -m600 "$FW/authorized_keys/raw" /root/.ssh/authorized_keys
fi
if [ -r "$FW/hostname/raw" ]; then
  name=$(cat "$FW/hostname/raw")
  echo "$name" > /etc/hostname
  hostname "$name"
  printf '127.0.0.1 localhost\n127.0.1.1 %s\n' "$name" > /etc/hosts
fi
mkdir -p /etc/lab
[ -r "$FW/gpus/raw" ] && cat "$FW/gpus/raw" > /etc/lab/gpus
# the driver the lab comes up with (none with --bare); once an installer wrote the userspace's version, it stays
[ -r "$FW/driver_version/raw" ] && [ ! -e /etc/lab/driver_version ] && cat "$FW/driver_version/raw" > /etc/lab/driver_version
exit 0
