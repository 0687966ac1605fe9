#!/bin/sh
# Lab only: the unprivileged ssh user `ops`, with sudo, that the lab's inventory connects as
# (become), as sites do that allow no root ssh. Its key is root's lab client key.
set -eu
id ops >/dev/null 2>&1 || useradd --create-home --shell /bin/bash ops
install -d -m700 -o ops -g ops /home/ops/.ssh
install -m600 -o ops -g ops /root/.ssh/authorized_keys /home/ops/.ssh/authorized_keys
printf 'ops ALL=(ALL:ALL) NOPASSWD: ALL\n' > /etc/sudoers.d/lab-ops
chmod 440 /etc/sudoers.d/lab-ops
