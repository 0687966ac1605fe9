"""The lab: a test target that looks like a Proxmox VE GPU host wherever the roles look.

- `image`: a Debian 12 image built from Debian's packages, cached by recipe;
- `vm`: qemu VMs booting it with a real kernel, GRUB or systemd-boot, and reboots;
- `container`: systemd-nspawn containers standing in for the LXC container;
- `pve`: fakepve (PVE's schema, tokens, tickets, UPIDs, errors) on loopback with TLS;
- `lab`: `provision lab up|down|status`, which ties them together and writes inventory/lab/.

Product code never imports this package; only the CLI's `lab` commands and the tests do.
"""
