"""The collection's modules imported as Ansible imports them, as
ansible_collections.provision.pve_sglang.plugins.modules.<name> (their module_utils likewise)."""

from __future__ import annotations

import atexit
import importlib
import shutil
import sys
import tempfile
from pathlib import Path
from types import ModuleType

from ansible.plugins.loader import init_plugin_loader

from provision.paths import collections_path

# one directory that holds ansible_collections/provision/pve_sglang, a link to this checkout
COLLECTIONS = Path(tempfile.mkdtemp(prefix="provision-collections-"))
collections_path(COLLECTIONS)
atexit.register(shutil.rmtree, COLLECTIONS, ignore_errors=True)
# Ansible's collection finder, as its CLIs (and provision's inventory loading) install it, once per process:
# with COLLECTIONS first, so that every later import of ansible_collections.* finds this checkout
init_plugin_loader([str(COLLECTIONS)])

# the prefix of every module's name; run a module file in a subprocess with COLLECTIONS first on sys.path
PACKAGE = "ansible_collections.provision.pve_sglang.plugins"


def module(name: str) -> ModuleType:
    """plugins/modules/<name>.py, imported (its main() not run)."""
    if str(COLLECTIONS) not in sys.path:
        sys.path.insert(0, str(COLLECTIONS))
    return importlib.import_module(f"{PACKAGE}.modules.{name}")


def module_util(name: str) -> ModuleType:
    """plugins/module_utils/<name>.py, imported as the collection's modules import it."""
    module("kernel_cmdline")  # COLLECTIONS on sys.path
    return importlib.import_module(f"{PACKAGE}.module_utils.{name}")


def main_result(mod: ModuleType, args: dict) -> dict:
    """Run a module's main() as Ansible starts it (its arguments through ansible's patch_module_args) and return
    the JSON it exits with: the result, with msg and failed on a failure."""
    import contextlib
    import io
    import json

    from ansible.module_utils.testing import patch_module_args

    out = io.StringIO()
    with patch_module_args(args), contextlib.redirect_stdout(out), contextlib.suppress(SystemExit):
        mod.main()
    return json.loads(out.getvalue())
