"""provision: a bare Proxmox VE GPU host to a verified, benchmarked SGLang endpoint.

The command line (`provision.cli`) is a thin shell over this package's Python API:
`provision.inventory` loads and validates, `provision.runner` drives ansible-runner,
and one module per capability (`apply`, `verify`, ...) builds on those.
"""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("provision")
except PackageNotFoundError:  # running from a source tree that was never installed
    __version__ = "0.0.0+source"
