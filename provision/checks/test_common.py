"""Checks for every managed host, node or container: it answers, and provision has converged it."""

from __future__ import annotations

from provision.checks.support import VERIFY_RECORD


def test_reachable(target):
    """The host answers over ssh with the inventory's connection settings."""
    assert target.data["boot_id"], "cannot read /proc/sys/kernel/random/boot_id"


def test_provision_applied(target):
    """`provision apply` has converged this host at least once."""
    assert target.file(VERIFY_RECORD) is not None, f"{target.path(VERIFY_RECORD)} is missing: run provision apply"
