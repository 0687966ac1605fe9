"""The one loader tests use for Python that is not an importable package: the scripts the roles copy to hosts,
the collection's filter plugins, a file taken out of a wheel. Modules that import their module_utils go through
tests/unit/collection.py instead, and module_utils through provision.paths.module_util, as the product loads them."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

REPO = Path(__file__).resolve().parent.parent


def load_file(path: Path) -> ModuleType:
    """The Python file at `path`, run as a module named after the file (not entered in sys.modules)."""
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def repo_file(relative: str) -> ModuleType:
    """A file of this checkout by its path in it, e.g. roles/sglang/files/service_probe.py (a fresh module each call,
    so no test file sees what another did to it)."""
    return load_file(REPO / relative)
