"""A ps task: holds variables (or shards) and serves reads and updates to its clients.

`PSTask(host, port).start()` runs a `TCPStore` on `host:port` and a thread that forms a gloo
pair (`transport.form_pair`) with every client that announces itself, then one thread per
client. Variables are replaced, never changed in place: a read sends the tensors current when
it arrived, and an update (`add`, `assign`) is applied under a lock only once its whole
message has arrived, so a client killed mid-message changes nothing.

Example::

    task = PSTask("127.0.0.1", 0).start()     # port 0: any free port, see task.port
    task.stop()
"""

from __future__ import annotations

import atexit
import datetime
import os
import socket
import threading
import time
from typing import Any

import torch
import torch.distributed as dist

from nbdist.errors import InvalidArgumentError
from nbdist.strategies.parameter_server.transport import _ANNOUNCE, SESSIONS, form_pair

__all__ = ["PSTask"]


class PSTask:
    """The variables of one ps task and the threads serving them."""

    def __init__(
        self, host: str = "127.0.0.1", port: int = 0, timeout: float = 300.0, *,
        bind_only: bool = False,
    ):  # fmt: skip
        self.host = host
        self._port = port
        self._timeout = timeout
        self._bind_only = bind_only
        """Listen on `host` only, not on every interface (Note [A ps store on one address])."""
        self._variables: dict[int, torch.Tensor] = {}
        self._slots: dict[tuple[int, int], dict[str, torch.Tensor]] = {}
        """Optimizer state kept with the variables: (shard id, optimizer id) -> name -> value."""
        self._lock = threading.Lock()
        self._stopped = threading.Event()
        self._store: Any = None
        self._thread: threading.Thread | None = None
        self.sessions = 0
        self._live: set[int] = set()
        self.updates = 0

    @property
    def port(self) -> int:
        """The port the store listens on."""
        return int(self._store.port) if self._store is not None else self._port

    def start(self) -> PSTask:
        """Listen and serve in background threads; returns at once."""
        # Note [A ps store on one address]: torch's TCPStore server listens on every
        # interface, and it has no authentication. A ps task that `nd.Cluster` starts
        # (`start_here`) listens on the address that reaches the notebook and the workers only:
        # the socket is opened here and handed to the store. A TF_CONFIG script's ps keeps
        # torch's default (other tasks may reach it through another of its addresses).
        listener = _listen(self.host, self._port) if self._bind_only else None
        port = listener.getsockname()[1] if listener is not None else self._port
        extra = {"master_listen_fd": listener.detach()} if listener is not None else {}
        self._store = dist.TCPStore(
            self.host,
            port,
            is_master=True,
            wait_for_workers=False,
            timeout=datetime.timedelta(seconds=30),
            **extra,
        )
        self._port = port
        self._thread = threading.Thread(target=self._accept, name="nbdist-ps-accept", daemon=True)
        self._thread.start()
        _register_exit(self)
        return self

    def stop(self) -> None:
        """Stop accepting clients (running sessions end with their clients)."""
        self._stopped.set()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def refuse_clients(self) -> None:
        """Stop accepting clients without waiting (the accept thread ends within 5 ms)."""
        self._stopped.set()

    @property
    def serving(self) -> bool:
        """True while a client's session is running."""
        return bool(self._live)

    def wait(self) -> None:
        """Block until `stop()`."""
        self._stopped.wait()

    def _accept(self) -> None:
        # Note [Sessions out of order]: a client takes its session number (`store.add`), then
        # announces it. A client killed between the two leaves a number that is never
        # announced; waiting for the numbers strictly in order would then leave every later
        # client (a restarted worker) waiting for its pair forever. So every number handed out
        # is checked, and each announced one served once, whatever the order.
        first_unserved, served = 1, set()
        while not self._stopped.is_set():
            try:
                taken = int(self._store.add(SESSIONS, 0))
                for session in range(first_unserved, taken + 1):
                    if session not in served and self._store.check([f"{_ANNOUNCE}{session}"]):
                        served.add(session)
                        threading.Thread(
                            target=self._serve, args=(session,), name=f"nbdist-ps-s{session}",
                            daemon=True,
                        ).start()  # fmt: skip
            except Exception:
                return  # the store is gone: the process is ending
            while first_unserved in served:
                served.discard(first_unserved)
                first_unserved += 1
            self._stopped.wait(0.005)  # poll: TCPStore has no wait that stops on request

    def _serve(self, session: int) -> None:
        try:
            self._session(session)
        finally:
            self._live.discard(session)

    def _session(self, session: int) -> None:
        try:
            pair = form_pair(self._store, session, 0, self.host, self._timeout)
        except Exception:
            return
        self.sessions += 1
        self._live.add(session)
        while not self._stopped.is_set():
            try:
                (op, ids), tensors = pair.recv()
            except Exception:
                return  # the client left (or died): its half-sent message is dropped
            if op == "bye":
                return
            try:
                answer, out = self._handle(op, ids, tensors)
            except Exception as error:
                answer, out = {"error": f"{type(error).__name__}: {error}"}, []
            try:
                pair.send(answer, out)
            except Exception:
                return

    def _handle(self, op: str, ids: list[int], tensors: list[torch.Tensor]) -> tuple[Any, list]:
        if op == "read":
            with self._lock:
                missing = [i for i in ids if i not in self._variables]
                if missing:
                    raise InvalidArgumentError(
                        f"variables {missing} were never created on this ps task"
                    )
                return "ok", [self._variables[i] for i in ids]
        if op == "assign":
            with self._lock:
                self._variables.update(zip(ids, tensors))
            return "ok", []
        if op == "add":
            with self._lock:
                fresh = {i: self._variables[i] + t for i, t in zip(ids, tensors)}
                self._variables.update(fresh)
                self.updates += 1
            return "ok", []
        if op == "slots_read":
            # ids: [(shard, optimizer)]; answer: the slot names of each, tensors in that order.
            with self._lock:
                found = [self._slots.get(tuple(key), {}) for key in ids]
                return [list(slots) for slots in found], [
                    value for slots in found for value in slots.values()
                ]
        if op == "slots_write":
            # ids: [(shard, optimizer, name, mode)]; "add" adds the difference, "init" creates
            # the slot unless another worker created it first (that one's state is kept),
            # "set" overwrites it (the chief's strategy.push of a restored optimizer).
            with self._lock:
                for (shard, owner, name, mode), tensor in zip(ids, tensors):
                    slots = self._slots.setdefault((shard, owner), {})
                    if mode == "add" and name in slots:
                        slots[name] = slots[name] + tensor
                    elif mode == "set" or name not in slots:
                        slots[name] = tensor
                self.updates += 1
            return "ok", []
        if op == "ping":
            return "ok", []
        if op == "stats":
            return {"variables": len(self._variables), "updates": self.updates}, []
        raise InvalidArgumentError(f"unknown request {op!r}")


def _listen(host: str, port: int) -> socket.socket:
    """A socket listening on `host:port` only (port 0: a free one)."""
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind((host, port))
        listener.listen(socket.SOMAXCONN)
    except OSError:
        listener.close()
        raise
    return listener


_tasks: list[PSTask] = []


def _register_exit(task: PSTask) -> None:
    if not _tasks:
        atexit.register(_stop_at_exit)
    _tasks.append(task)


def _stop_at_exit(wait_s: float = 1.0) -> None:
    """At interpreter exit, before Python finalises: stop every ps task's accept thread and
    end the sessions of this process's own clients, then let the interpreter exit with the
    script's own status.

    Note [ps task at exit]: the accept thread polls the store (a C++ call without the GIL)
    every 5 ms; a daemon thread that comes back from C++ while Python finalises is ended
    through C++ frames that cannot unwind, and the process aborts ("terminate called without
    an active exception"). So it is stopped (joined) here. The sessions of clients in this
    process (an in-process cluster: the chief, worker servers) are closed too, so their
    threads are not inside gloo either. A session of another process's client waits in a
    gloo receive, which finalisation leaves alone. This hook never exits the process itself:
    an earlier `os._exit(0)` here turned a failing script's status into 0.
    """
    from nbdist.strategies.parameter_server.transport import close_clients

    for task in _tasks:
        task.refuse_clients()
    close_clients()
    deadline = time.monotonic() + wait_s
    for task in _tasks:
        task.stop()
        while task.serving and time.monotonic() < deadline:
            time.sleep(0.01)  # a session's thread returns once it has read its client's "bye"


_here: dict[str, PSTask] = {}


def start_here(host: str = "127.0.0.1") -> dict[str, Any]:
    """Make this process (an engine) a ps task on `host` and a free port; returns its address,
    pid and host name. Called once per ps engine by `nd.Cluster(strategy="parameter_server")`
    with the engine's address that reaches the notebook; it listens there only."""
    if "task" not in _here:
        _here["task"] = PSTask(host, 0, bind_only=True).start()
    task = _here["task"]
    return {"address": f"{host}:{task.port}", "pid": os.getpid(), "host": socket.gethostname()}
