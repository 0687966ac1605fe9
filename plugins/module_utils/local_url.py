"""The URL a client on the same host calls a server at, from the address the server listens on.

One rule for the sglang role (its readiness wait, and the service record that `provision verify` and the
sglang_bench role read) through the `local_url` filter (plugins/filter/local_url.py).
"""

from __future__ import annotations

# A server listening on every address is called on the loopback address of the same family: `::` may be IPv6 only
# (net.ipv6.bindv6only, IPV6_V6ONLY), and then nothing answers on 127.0.0.1. SGLang takes an empty --host as its
# default, 127.0.0.1.
_EVERY_ADDRESS = {"": "127.0.0.1", "0.0.0.0": "127.0.0.1", "::": "::1"}


def url_host(listen) -> str:
    """The host part of that URL: 127.0.0.1 for 0.0.0.0, [::1] for ::, any other IPv6 address in brackets (a zone
    index escaped as RFC 6874 asks), a name or an IPv4 address as it is."""
    host = str(listen or "").strip()
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    host = _EVERY_ADDRESS.get(host, host)
    return "[" + host.replace("%", "%25") + "]" if ":" in host else host


def local_url(listen, port, path: str = "") -> str:
    """`http://<url_host(listen)>:<port><path>`."""
    return f"http://{url_host(listen)}:{int(port)}{path}"
