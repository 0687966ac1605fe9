"""Where the packaged playbooks, roles, plugins and example inventories are, installed or not.

A wheel carries them inside the package (see pyproject's force-include); a source
checkout keeps them at the top of the repository. Either directory is also the Ansible
collection provision.pve_sglang (galaxy.yml): the roles and playbooks run as that collection,
and its Python shared with this package lives in plugins/module_utils/.
"""

import functools
import importlib.util
import os
import re
import sys
from pathlib import Path
from types import ModuleType

_PACKAGE_DIR = Path(__file__).resolve().parent
_SOURCE_ROOT = _PACKAGE_DIR.parent


def _data_dir(name: str) -> Path:
    for candidate in (_PACKAGE_DIR / name, _SOURCE_ROOT / name):
        if candidate.is_dir():
            return candidate
    raise FileNotFoundError(f"packaged directory {name!r} is missing from {_PACKAGE_DIR}")


def playbooks_dir() -> Path:
    return _data_dir("playbooks")


def roles_dir() -> Path:
    return _data_dir("roles")


def plugins_dir() -> Path:
    return _data_dir("plugins")


def collection_root() -> Path:
    """The directory that holds the collection's playbooks/, roles/ and plugins/."""
    return plugins_dir().parent


# how the collection's modules import a module_utils file, and how one such file imports another
MODULE_UTILS_PACKAGE = "ansible_collections.provision.pve_sglang.plugins.module_utils"
_SIBLING = re.compile(rf"^from {re.escape(MODULE_UTILS_PACKAGE)}\.(\w+) import", re.M)


@functools.cache
def module_util(name: str) -> ModuleType:
    """plugins/module_utils/<name>.py, the same file the collection's modules import as
    ansible_collections.provision.pve_sglang.plugins.module_utils.<name>: one rule for both.
    These files import only the standard library and each other; each loads by path, after the files it imports,
    under the name the collection gives it, so that their imports of each other find it without Ansible's loader."""
    full = f"{MODULE_UTILS_PACKAGE}.{name}"
    if full in sys.modules:
        return sys.modules[full]
    path = plugins_dir() / "module_utils" / f"{name}.py"
    for sibling in _SIBLING.findall(path.read_text()):
        module_util(sibling)
    spec = importlib.util.spec_from_file_location(full, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[full] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[full]
        raise
    return module


def collections_path(parent: Path) -> str:
    """ANSIBLE_COLLECTIONS_PATH for a run of these playbooks: `parent`, where a link makes
    collection_root() the collection provision.pve_sglang, ahead of the paths Ansible is configured
    with (an installed provision.pve_sglang of another release is not the one that runs)."""
    from ansible import constants

    link = parent / "ansible_collections" / "provision" / "pve_sglang"
    link.parent.mkdir(parents=True, exist_ok=True)
    link.symlink_to(collection_root(), target_is_directory=True)
    return os.pathsep.join([str(parent), *constants.COLLECTIONS_PATHS])


@functools.cache
def role_default(role: str, name: str):
    """A role's default (roles/<role>/defaults/main.yml), for the Python that must agree with it: the one place
    such a value is written."""
    import yaml

    with open(roles_dir() / role / "defaults" / "main.yml") as f:
        return yaml.safe_load(f)[name]


def example_inventory_dir() -> Path:
    """The packaged example inventory (`--inventory example`)."""
    return _data_dir("inventory") / "prod"
