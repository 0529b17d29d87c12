"""How the coordinator reaches a worker task: a `WorkerChannel` calls a function of
`worker_task` there (passed as the function, e.g. `worker_task.worker_info`) and returns its
reply, or raises `WorkerUnreachable` when the worker died.

`SocketChannel` talks to a `nd.Server` worker task over `multiprocessing.connection` (a
script's cluster); engines use `nbdist.cluster.ps_dispatch.EngineChannel` (ipyparallel).

Example (needs a running worker task, so not run here)::

    channel = SocketChannel("127.0.0.1:2222")
    channel.call(worker_task.worker_info)
"""

from __future__ import annotations

import contextlib
import os
import pickle
import threading
from collections.abc import Callable
from multiprocessing.connection import Client
from typing import Any

from nbdist.strategies.parameter_server.transport import split_address

__all__ = ["SocketChannel", "WorkerChannel", "WorkerUnreachable", "authkey"]


def authkey() -> bytes:
    """The key worker servers and the chief share (`NBDIST_PS_AUTHKEY`, default fixed)."""
    return os.environ.get("NBDIST_PS_AUTHKEY", "nbdist-parameter-server").encode()


class WorkerUnreachable(ConnectionError):
    """The worker died or cannot be reached; what it was running goes back on the queue."""


class WorkerChannel:
    """Interface: `call(entry, *args)` → reply dict (`entry`: a function of `worker_task`);
    `alive()`; `close()`; `name`."""

    name = "worker"
    generation = 0
    """Changes whenever the worker behind the channel may be a new process."""

    def call(self, entry: Callable[..., dict[str, Any]], *args: Any) -> dict[str, Any]:
        raise NotImplementedError

    def alive(self) -> bool:
        return True

    def close(self) -> None:
        pass


class SocketChannel(WorkerChannel):
    """A connection to the `nd.Server` worker task at `address`; reconnects when asked again
    after a failure (a restarted worker task on the same address rejoins)."""

    def __init__(self, address: str, name: str = "worker"):
        self.address = address
        self.name = name
        self._conn: Any = None
        self._lock = threading.Lock()
        self.generation = 0

    def _connect(self) -> Any:
        if self._conn is None:
            try:
                self._conn = Client(split_address(self.address), authkey=authkey())
                self.generation += 1  # a new connection may be a restarted worker task
            except (OSError, EOFError) as error:
                raise WorkerUnreachable(f"{self.name} at {self.address}: {error}") from None
        return self._conn

    def alive(self) -> bool:
        with self._lock:
            try:
                self._connect()
                return True
            except WorkerUnreachable:
                return False

    def call(self, entry: Callable[..., dict[str, Any]], *args: Any) -> dict[str, Any]:
        """Run `entry(*args)` on the worker task; the task's server looks the function up by
        its name in the table of what it serves (`server._ENTRIES`)."""
        with self._lock:
            conn = self._connect()
            try:
                # Plain pickle: multiprocessing's own pickler sends tensors as shared memory.
                request = (entry.__name__, args)
                conn.send_bytes(pickle.dumps(request, protocol=pickle.HIGHEST_PROTOCOL))
                return pickle.loads(conn.recv_bytes())
            except (OSError, EOFError) as error:
                self._drop()
                raise WorkerUnreachable(f"{self.name} at {self.address}: {error!r}") from None

    def _drop(self) -> None:
        if self._conn is not None:
            with contextlib.suppress(OSError):
                self._conn.close()
        self._conn = None

    def close(self) -> None:
        with self._lock:
            self._drop()
