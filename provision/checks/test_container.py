"""Checks for an SGLang container (group gpu_containers)."""

PROVISION_STATE = "/var/lib/provision/applied.json"


def test_container_reachable(host):
    """The container answers over ssh with the inventory's connection settings."""
    assert host.file("/proc/sys/kernel/random/boot_id").exists, "cannot read the boot id"


def test_provision_applied(host):
    """`provision apply` has converged this container at least once."""
    state = host.file(PROVISION_STATE)
    assert state.exists, f"{PROVISION_STATE} is missing: run provision apply first"
