"""Where the packaged playbooks, roles and example inventories are, installed or not.

A wheel carries them inside the package (see pyproject's force-include); a source
checkout keeps them at the top of the repository.
"""

from pathlib import Path

from provision.errors import UsageError

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


def resolve_inventory(name_or_path: str) -> Path:
    """`prod` means `inventory/prod` (under the current directory, else the packaged example);
    anything that exists as a path, or contains a slash, is used as given."""
    given = Path(name_or_path)
    if given.exists() or "/" in name_or_path:
        if not given.is_dir():
            raise UsageError(f"{name_or_path}: inventory directory not found")
        return given.resolve()
    for root in (Path.cwd() / "inventory", _PACKAGE_DIR / "inventory", _SOURCE_ROOT / "inventory"):
        if (root / name_or_path).is_dir():
            return (root / name_or_path).resolve()
    raise UsageError(
        f"inventory {name_or_path!r} not found: looked for ./inventory/{name_or_path}/ "
        "and the packaged examples; pass a directory path instead"
    )
