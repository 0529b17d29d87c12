"""Which address of this machine reaches another one, and which interface carries it.

A machine in a cluster has several interfaces (loopback, a management network, the cluster's
network, a container bridge). Listening on every interface exposes the controller to networks
that have nothing to do with the cluster, and gloo, left to itself, binds to whatever the
machine's own hostname resolves to (on Debian often 127.0.1.1, which no other host reaches).
So the controller listens on the address that the route to the first engine host leaves from,
and each engine's gloo uses the interface holding the address that reaches the rendezvous.
Asking the kernel's routing table sends no packet (a UDP socket's `connect`).

Example:
    >>> address_towards("127.0.0.1")
    '127.0.0.1'
    >>> interface_with("127.0.0.1") is not None
    True
"""

from __future__ import annotations

import contextlib
import socket

__all__ = ["address_towards", "interface_with", "store_peers", "strip_user"]


def strip_user(host: str) -> str:
    """`user@host` -> `host` (brackets of an IPv6 literal removed).

    Example:
        >>> strip_user("me@node1")
        'node1'
    """
    return host.rpartition("@")[2].strip("[]")


def address_towards(peer: str) -> str | None:
    """This machine's IPv4 address on the route to `peer` (a name or an address); 127.0.0.1
    for a loopback peer; None when `peer` does not resolve or no route leads there."""
    try:
        target = socket.gethostbyname(strip_user(peer))
    except OSError:
        return None
    if target.startswith("127."):
        return "127.0.0.1"
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        try:
            probe.connect((target, 9))
        except OSError:
            return None
        return str(probe.getsockname()[0])


def interface_with(address: str) -> str | None:
    """The name of the interface that holds `address` (e.g. "eth0"), None when none does."""
    with contextlib.suppress(ImportError):
        import psutil

        for name, addresses in psutil.net_if_addrs().items():
            if any(getattr(item, "address", None) == address for item in addresses):
                return name
    return None


def store_peers(engine_addresses: list[str], rendezvous: str) -> list[str]:
    """The machines that may connect to the rendezvous store (Note [Store peers] in
    `nbdist.collectives.peer_filter`): every engine's address, and this machine's (the
    notebook's: it reads heartbeats and writes abort notices there) on the route to the store.

    Example:
        >>> store_peers(["198.18.0.12", "198.18.0.11", "198.18.0.12"], "127.0.0.1")
        ['127.0.0.1', '198.18.0.11', '198.18.0.12']
    """
    own = address_towards(rendezvous)
    return sorted(set(engine_addresses) | ({own} if own else set()))
