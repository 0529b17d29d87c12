"""Only the cluster's hosts reach a listening socket: a kernel filter on the socket itself.

Note [Store peers]: torch's `TCPStore` has no authentication, so anyone who reaches its port can
read and write the rendezvous keys (heartbeats, failure notices, gloo's addresses). When an
nd.Cluster's engines run on other hosts, the store listens on the first engine's address on the
cluster's network (Note [A store on one address] in `nbdist.collectives.store`), and the notebook
hands every engine the addresses of the cluster's machines (each engine's, and the notebook's
own on the route to the store) in `STORE_PEERS_ENV`. The store's listening socket then gets a
classic BPF socket filter (`SO_ATTACH_FILTER`) that passes only TCP segments whose IPv4 source
is one of them (or loopback): a SYN from any other machine is dropped by the kernel before a
connection exists, so the other machine's `connect` gets no answer and times out. Accepted
connections inherit the filter. No firewall (nftables, iptables) is needed, nothing listens in
user space, and it costs nothing per store operation. Linux only; elsewhere `attach` does
nothing and returns False.

Example (Linux):
    >>> import socket
    >>> listener = socket.socket()
    >>> listener.bind(("127.0.0.1", 0)); listener.listen()
    >>> attach(listener, ["198.18.0.11"])
    True
    >>> listener.close()
"""

from __future__ import annotations

import ctypes
import ipaddress
import os
import socket
import struct
import sys
from collections.abc import Iterable

__all__ = ["STORE_PEERS_ENV", "attach", "peers_from_env", "program"]

STORE_PEERS_ENV = "NBDIST_STORE_PEERS"
"""Comma-separated IPv4 addresses that may connect to the rendezvous store (Note [Store peers]);
unset or empty: any."""

_SO_ATTACH_FILTER = 26
_SKF_NET_OFF = -0x100000
# classic BPF opcodes (linux/filter.h)
_LD_W_ABS = 0x20  # BPF_LD | BPF_W | BPF_ABS
_JEQ_K = 0x15  # BPF_JMP | BPF_JEQ | BPF_K
_RET_K = 0x06  # BPF_RET | BPF_K
_MAX_PEERS = 250  # a jump offset is one byte


def peers_from_env() -> list[str]:
    """The addresses in `STORE_PEERS_ENV` (empty when unset).

    Example:
        >>> os.environ[STORE_PEERS_ENV] = "198.18.0.11,198.18.0.12"
        >>> peers_from_env()
        ['198.18.0.11', '198.18.0.12']
        >>> del os.environ[STORE_PEERS_ENV]
    """
    return [p.strip() for p in os.environ.get(STORE_PEERS_ENV, "").split(",") if p.strip()]


def program(peers: Iterable[str]) -> list[tuple[int, int, int, int]]:
    """The filter: load the IPv4 source address, accept it if it is 127.0.0.1 or one of
    `peers` (other entries, such as IPv6 addresses, never reach an IPv4 socket and are left
    out), else drop. `(code, jt, jf, k)` per instruction.

    Example:
        >>> len(program(["198.18.0.11"]))  # load, 2 compares, drop, accept
        5
        >>> len(program(["198.18.0.11", "fe80::1"]))
        5
    """
    allowed = sorted({int(ipaddress.IPv4Address(p)) for p in peers if _is_ipv4(p)} | {0x7F000001})
    if len(allowed) > _MAX_PEERS:
        from nbdist.errors import InvalidArgumentError

        raise InvalidArgumentError(
            f"the store's peer filter takes at most {_MAX_PEERS} addresses, got {len(allowed)}; "
            f"unset {STORE_PEERS_ENV} and protect the store with a firewall instead"
        )
    code = [(_LD_W_ABS, 0, 0, (_SKF_NET_OFF + 12) & 0xFFFFFFFF)]  # the IPv4 source address
    for index, address in enumerate(allowed):
        to_accept = len(allowed) - index  # past the remaining compares and the drop
        code.append((_JEQ_K, to_accept, 0, address))
    code.append((_RET_K, 0, 0, 0))  # drop
    code.append((_RET_K, 0, 0, 0xFFFFFFFF))  # accept the whole segment
    return code


def attach(sock: socket.socket, peers: Iterable[str]) -> bool:
    """Let only `peers` (and loopback) reach `sock`, an IPv4 TCP socket (Note [Store peers]).

    Returns False where the kernel has no socket filters (not Linux); raises OSError when
    attaching fails.
    """
    if not sys.platform.startswith("linux"):
        return False
    code = program(peers)
    raw = b"".join(struct.pack("HBBI", *instruction) for instruction in code)
    buffer = ctypes.create_string_buffer(raw, len(raw))
    fprog = struct.pack("HL", len(code), ctypes.addressof(buffer))  # struct sock_fprog
    sock.setsockopt(socket.SOL_SOCKET, _SO_ATTACH_FILTER, fprog)
    return True


def _is_ipv4(text: str) -> bool:
    try:
        ipaddress.IPv4Address(text)
    except ValueError:
        return False
    return True
