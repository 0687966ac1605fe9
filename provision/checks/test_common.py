"""Checks for every managed host, node or container: it answers, and provision has converged it."""

from __future__ import annotations

from provision.checks.support import STATE_DIR


def test_reachable(target):
    """The host answers over ssh with the inventory's connection settings."""
    assert target.data["boot_id"], "cannot read /proc/sys/kernel/random/boot_id"


def test_provision_applied(target):
    """`provision apply` has converged this host at least once."""
    record = f"{STATE_DIR}/verify.json"
    assert target.file(record) is not None, f"{record} is missing: run provision apply"
