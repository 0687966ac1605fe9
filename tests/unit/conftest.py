"""Unit tests share one process: Ansible's collection finder is set up first, knowing this checkout
as provision.pve_sglang (tests/unit/collection.py), before any test loads an inventory."""

import tests.unit.collection  # noqa: F401
