"""provision: a bare Proxmox VE GPU host to a verified, benchmarked SGLang endpoint.

The command line (`provision.cli`) is a thin shell over this package's Python API:
`provision.inventory` loads and validates, `provision.runner` drives ansible-runner,
and one module per capability (`apply`, `verify`, ...) builds on those.
"""

import functools
import os
import warnings

from cryptography.utils import CryptographyDeprecationWarning


@functools.cache
def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("provision-pve-sglang")
    except PackageNotFoundError:  # running from a source tree that was never installed
        return "0.0.0+source"


def __getattr__(name: str) -> str:
    """`provision.__version__`, read from the installed metadata when first asked for: importlib.metadata is most
    of the package's import time, which a process that never asks (the run's watchdog) does not pay."""
    if name == "__version__":
        return _version()
    raise AttributeError(name)


# cryptography's deprecation notices (DSA, raised when ansible-core imports its ssh-agent support) are addressed to
# the developers of the library that imports the algorithm, not to provision's user: all of them are silenced in
# provision's process. A child Python (ansible-playbook, verify's checks) reads PYTHONWARNINGS before its
# site-packages is on sys.path, so there a filter can name only a builtin category: the notices it is known to print,
# by their text, as UserWarning (cryptography's warning class derives from it). Every other warning shows as usual.
warnings.filterwarnings("ignore", category=CryptographyDeprecationWarning)
LIBRARY_NOTICES = ("DSA is deprecated",)


def child_warnings(environ: dict[str, str] | None = None) -> str:
    """PYTHONWARNINGS for a child process: the user's filters, then the library notices silenced."""
    user = (os.environ if environ is None else environ).get("PYTHONWARNINGS", "")
    return ",".join([*filter(None, [user]), *(f"ignore:{notice}:UserWarning" for notice in LIBRARY_NOTICES)])
