"""Checks for a PVE node (group proxmox_hosts)."""

PROVISION_STATE = "/var/lib/provision/applied.json"


def test_host_reachable(host):
    """The node answers over ssh with the inventory's connection settings."""
    boot_id = host.file("/proc/sys/kernel/random/boot_id")
    assert boot_id.exists, "cannot read /proc/sys/kernel/random/boot_id"


def test_provision_applied(host):
    """`provision apply` has converged this host at least once."""
    state = host.file(PROVISION_STATE)
    assert state.exists, f"{PROVISION_STATE} is missing: run provision apply first"
