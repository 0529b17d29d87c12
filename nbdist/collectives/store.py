"""The rendezvous store of a process group: torch's `TCPStore`, reached or hosted safely.

Note [A store on one address]: torch's `TCPStore` server listens on every interface, and the
store has no authentication. When the rendezvous address is a loopback one (every worker on
this machine), rank 0 therefore opens the listening socket itself on that address and hands it
to the store (`master_listen_fd`). Other addresses get the same when `BIND_STORE_ENV` is "1"
(nd.Cluster's engines: their rendezvous address is the one the other engines reach); for
scripts (torchrun, TF_CONFIG) torch's default stays, since on a machine with several networks
other workers may reach rank 0 through another of its addresses. When `STORE_PEERS_ENV` names
the cluster's machines (nd.Cluster's engines on other hosts), that socket also drops every
connection from elsewhere (Note [Store peers] in `nbdist.collectives.peer_filter`).
"""

from __future__ import annotations

import contextlib
import errno
import ipaddress
import os
import socket
import threading
from datetime import timedelta
from typing import Any

import torch.distributed as dist

from nbdist.collectives.peer_filter import attach, peers_from_env
from nbdist.errors import RendezvousError

__all__ = ["BIND_STORE_ENV", "connect_store"]

BIND_STORE_ENV = "NBDIST_BIND_STORE"
"""Set to "1" to make rank 0's store listen on the rendezvous address only, whatever it is
(Note [A store on one address])."""

_SERVERS: dict[tuple[str, int], Any] = {}
_SERVERS_LOCK = threading.Lock()


def connect_store(
    addr: str, port: int, rank: int, world_size: int, timeout: float, *, client: bool = False
) -> Any:
    """A `TCPStore` client of the rendezvous at `addr:port`; on rank 0 (unless `client`) the
    server, one per address for the life of the process (Note [Store generations] in
    `nbdist.collectives.torch_dist`), listening on that address only where it can (Note [A
    store on one address]).

    Raises:
        RendezvousError: the port is taken by another program, or the store cannot be
            reached within `timeout`; the message names the fix.
    """
    is_master = (
        not client and rank == 0 and os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != "True"
    )
    if is_master:
        with _SERVERS_LOCK:
            server = _SERVERS.get((addr, port))
            if server is None:
                server = _SERVERS[(addr, port)] = _open_store(
                    addr, port, rank, world_size, timeout, True
                )
            return server
    return _open_store(addr, port, rank, world_size, timeout, False)


def _open_store(addr: str, port: int, rank: int, world_size: int, timeout: float, is_master: bool):
    listener = _listen_on(addr, port) if is_master else None
    try:
        if listener is not None:
            return dist.TCPStore(
                addr, port, world_size, True, timedelta(seconds=timeout),
                wait_for_workers=False, master_listen_fd=listener.detach(),
            )  # fmt: skip
        return dist.TCPStore(
            addr, port, world_size, is_master, timedelta(seconds=timeout),
            wait_for_workers=False,
        )  # fmt: skip
    except (RuntimeError, OSError) as error:
        if listener is not None:
            listener.close()
        text = str(error).lower()
        if "address already in use" in text or "eaddrinuse" in text or "errno 98" in text:
            raise _port_in_use(addr, port) from error
        raise RendezvousError(
            f"Rank {rank} could not reach the rendezvous at {addr}:{port} within {timeout:g} s "
            f"({error}). Check that rank 0 is running and the address and port are right."
        ) from error


def _port_in_use(addr: str, port: int) -> RendezvousError:
    return RendezvousError(
        f"Port {port} on {addr} is already in use, so rank 0 cannot host the rendezvous. "
        "Choose a free port (MASTER_PORT, or the first address in TF_CONFIG), or stop the "
        "process holding it."
    )


def _listen_on(addr: str, port: int) -> socket.socket | None:
    """A socket listening on `addr:port` only, for the store server (Note [A store on one
    address]); None when `addr` is not an address of this machine (torch then listens on
    every interface, as before)."""
    try:
        infos = socket.getaddrinfo(addr, port, type=socket.SOCK_STREAM)
    except OSError:
        return None
    loopback = all(ipaddress.ip_address(info[4][0].split("%")[0]).is_loopback for info in infos)
    if not loopback and os.environ.get(BIND_STORE_ENV) != "1":
        return None
    local = _local_addresses()
    infos.sort(key=lambda info: info[0] != socket.AF_INET)  # IPv4 first, as clients try it
    for family, kind, proto, _, sockaddr in infos:
        if sockaddr[0] not in local:
            continue
        listener = socket.socket(family, kind, proto)
        try:
            listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            listener.bind(sockaddr)
            listener.listen(socket.SOMAXCONN)
            peers = peers_from_env()
            if peers and not loopback and family == socket.AF_INET:
                attach(listener, [*peers, sockaddr[0]])  # Note [Store peers]
        except OSError as error:
            listener.close()
            if error.errno == errno.EADDRINUSE:
                raise _port_in_use(addr, port) from error
            continue
        return listener
    return None


def _local_addresses() -> set[str]:
    """The IP addresses of this machine's interfaces (loopback always included)."""
    found = {"127.0.0.1", "::1"}
    with contextlib.suppress(Exception):
        import psutil

        for addresses in psutil.net_if_addrs().values():
            found.update(a.address.split("%")[0] for a in addresses if a.family in (
                socket.AF_INET, socket.AF_INET6))  # fmt: skip
    return found
