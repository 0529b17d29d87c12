"""Abandoning a process group that a collective is blocked in, from any process.

Note [Waking a blocked collective]: gloo has no abort that reaches a collective in progress:
`ProcessGroup.abort()`, `shutdown()` and `destroy_process_group()` leave its connections open,
and a rank blocked in `all_reduce` or `recv` returns only when a peer's connection closes or the
group's timeout (minutes) passes. SIGINT does not help either: Python runs its handler only once
the C++ call returns. So each rank remembers the TCP connections its group opened
(`GroupSockets`) and, when the group is abandoned, shuts them down (`shutdown(2)` on a duplicate
of each socket): every send or receive blocked on them, on this rank and on its peers, fails at
once with "Connection closed by peer", and the processes keep their Python state, so the group
can be formed again (`DistGroup.reform`). The listening socket is left alone (gloo's listener
thread aborts the process when its socket fails), and so are the rendezvous store's connections.

Any process that reaches the rendezvous store can ask every rank to do this: `request_abort`
writes the group's abort key, which each rank's heartbeat thread reads (`Liveness`). The notebook
uses it when a cell times out or is interrupted; an engine uses it when it finished a cell whose
collective its peers still wait in.

Linux only (`/proc/self/fd`); elsewhere nothing is shut down and the group's timeout applies.

Example:
    >>> decode_abort(encode_abort("replica 1 never arrived", missing=[1]))
    ('replica 1 never arrived', (1,), False)
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
from datetime import timedelta

__all__ = [
    "ABORT_KEY",
    "GroupSockets",
    "abort_kind",
    "decode_abort",
    "encode_abort",
    "request_abort",
]

ABORT_KEY = "abort"
"""The key (under a group's prefix) whose presence abandons the group."""


def encode_abort(
    reason: str,
    *,
    missing: list[int] | tuple[int, ...] = (),
    secondary: bool = False,
    kind: str | None = None,
) -> str:
    """The abort key's value: why, which ranks never arrived, whether it follows a failure,
    and the error class a blocked collective raises (`kind`: a collective timeout enforced by
    `held.TimeoutWatch`; None: `WorkerLostError` naming the reason)."""
    data = {"reason": reason[:1000], "missing": [int(r) for r in missing], "secondary": secondary}
    if kind is not None:
        data["kind"] = kind
    return json.dumps(data)


def abort_kind(value: str | bytes) -> str | None:
    """The error class named by `encode_abort(kind=...)` in the abort key's value, or None.

    Example:
        >>> abort_kind(encode_abort("late", kind="CollectiveTimeoutError"))
        'CollectiveTimeoutError'
    """
    if isinstance(value, bytes):
        value = value.decode(errors="replace")
    try:
        kind = json.loads(value).get("kind")
    except (ValueError, AttributeError):
        return None
    return kind if isinstance(kind, str) else None


def decode_abort(value: str | bytes) -> tuple[str, tuple[int, ...], bool]:
    """`(reason, missing ranks, secondary)` from the abort key's value."""
    if isinstance(value, bytes):
        value = value.decode(errors="replace")
    try:
        data = json.loads(value)
        return str(data["reason"]), tuple(int(r) for r in data["missing"]), bool(data["secondary"])
    except (ValueError, KeyError, TypeError):
        return str(value), (), False


def request_abort(
    addr: str, port: int, prefix: str, reason: str, *, missing=(), timeout: float = 5.0
) -> bool:
    """Ask every rank of the group under `prefix` (on the store at `addr:port`) to abandon it.

    Returns False when the store cannot be reached (rank 0's process is gone: its peers'
    connections to it are closed already).
    """
    import torch.distributed as dist

    try:
        store = dist.TCPStore(
            addr, port, None, False, timedelta(seconds=timeout), wait_for_workers=False
        )
        store.set(f"{prefix}{ABORT_KEY}", encode_abort(reason, missing=missing))
    except (RuntimeError, OSError, ValueError):
        return False
    return True


class GroupSockets:
    """The established TCP connections a process group opened in this process.

    Call `before()` just before creating the group and `after()` just after; `shutdown()`
    then fails every collective blocked on them (Note [Waking a blocked collective]).

    Args:
        store_port: The rendezvous store's port (its connections are not the group's).
    """

    def __init__(self, store_port: int):
        self.store_port = int(store_port)
        self._before: dict[int, str] = {}
        self._owned: dict[int, str] = {}

    def before(self) -> None:
        """Remember the sockets open now."""
        self._before = _socket_fds()

    def after(self) -> None:
        """Remember the group's connections: established since `before()`, not the store's."""
        new = {fd: link for fd, link in _socket_fds().items() if self._before.get(fd) != link}
        self._owned = {}
        if not new:
            return
        try:
            import psutil

            connections = psutil.Process().net_connections(kind="tcp")
        except Exception:  # psutil missing or /proc unreadable: nothing to shut down later
            return
        for connection in connections:
            if connection.fd not in new or connection.status != "ESTABLISHED":
                continue
            ports = {connection.laddr.port, getattr(connection.raddr, "port", None)}
            if self.store_port not in ports:
                self._owned[connection.fd] = new[connection.fd]

    @property
    def count(self) -> int:
        """How many connections are remembered."""
        return len(self._owned)

    def shutdown(self) -> int:
        """Shut down the remembered connections that are still open; how many were."""
        done = 0
        for fd, link in self._owned.items():
            with contextlib.suppress(OSError):
                if os.readlink(f"/proc/self/fd/{fd}") != link:
                    continue  # closed, and the number reused by something else
                sock = socket.socket(fileno=os.dup(fd))
                try:
                    sock.shutdown(socket.SHUT_RDWR)
                    done += 1
                finally:
                    sock.close()
        self._owned = {}
        return done


def _socket_fds() -> dict[int, str]:
    """`{fd: "socket:[inode]"}` for this process's sockets (empty where /proc is missing)."""
    found: dict[int, str] = {}
    try:
        names = os.listdir("/proc/self/fd")
    except OSError:
        return found
    for name in names:
        with contextlib.suppress(OSError, ValueError):
            link = os.readlink(f"/proc/self/fd/{name}")
            if link.startswith("socket:"):
                found[int(name)] = link
    return found
