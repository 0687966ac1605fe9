"""Unit tests share one process: Ansible's collection finder is set up first, knowing this checkout
as provision.pve_sglang (tests/unit/collection.py), before any test loads an inventory."""

import pytest

import tests.unit.collection  # noqa: F401

HF_TOKEN = "hf_labtokenlabtoken"  # the lab hub's token in the tests that run the real client against it


@pytest.fixture
def hub():
    """The lab's Hugging Face hub (provision/lab/hfhub.py) on 127.0.0.1, serving its tiny gated repo."""
    from provision.lab import hfhub

    served = hfhub.Hub([hfhub.tiny_repo()], {HF_TOKEN}).start()
    yield served
    served.stop()
