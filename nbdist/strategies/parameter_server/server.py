"""`nd.Server`: run a `ps` or `worker` task of a `ParameterServerStrategy` cluster in a script.

A ps task serves its variables (`ps_task.PSTask` on the task's address); a worker task listens
on its address for the chief's coordinator and runs the functions it sends
(`worker_task.run_closure`), one at a time. The chief's connection is authenticated with a
shared key (`NBDIST_PS_AUTHKEY`; set the same value on every task when the cluster spans
machines).

Example (a ps task's script; blocks, so not run here)::

    resolver = nd.cluster_resolver.TFConfigClusterResolver()
    nd.Server(resolver.cluster_spec(), job_name=resolver.task_type,
              task_index=resolver.task_id).join()
"""

from __future__ import annotations

import pickle
import threading
from multiprocessing import AuthenticationError
from multiprocessing.connection import Listener
from typing import Any

from nbdist.cluster_resolver import ClusterSpec
from nbdist.errors import ArgumentTypeError, ClusterConfigError
from nbdist.strategies.parameter_server import worker_task
from nbdist.strategies.parameter_server.channels import authkey
from nbdist.strategies.parameter_server.ps_task import PSTask
from nbdist.strategies.parameter_server.transport import split_address

__all__ = ["Server"]

_JOBS = ("ps", "worker")
_ENTRIES = {
    "run_closure": worker_task.run_closure,
    "make_dataset": worker_task.make_dataset,
    "worker_info": worker_task.worker_info,
}


class Server:
    """An in-process server for one task of a cluster (TF's `tf.distribute.Server`).

    Args:
        server_or_cluster_def: A `ClusterSpec` or a dict `{job: [address, ...]}`.
        job_name: `"ps"` or `"worker"` (the chief needs no server: it creates the strategy).
        task_index: This task's index in its job.
        protocol: Accepted for TF compatibility; only None or "grpc" (ignored).
        start: Start serving now (default True).

    Raises:
        ClusterConfigError: (a `ValueError`) an unknown job, a task index past the job's size.
    """

    def __init__(
        self,
        server_or_cluster_def: Any,
        job_name: str | None = None,
        task_index: int | None = None,
        protocol: str | None = None,
        start: bool = True,
    ):
        if isinstance(server_or_cluster_def, dict):
            server_or_cluster_def = ClusterSpec(server_or_cluster_def)
        if not isinstance(server_or_cluster_def, ClusterSpec):
            raise ArgumentTypeError(
                "nd.Server needs a ClusterSpec or a dict {job: [address, ...]}, got "
                f"{server_or_cluster_def!r}."
            )
        if job_name not in _JOBS:
            raise ClusterConfigError(
                f"nd.Server runs a 'ps' or 'worker' task, got job_name={job_name!r}; the chief "
                "creates nd.ParameterServerStrategy and a ClusterCoordinator instead."
            )
        if protocol not in (None, "grpc"):
            raise ClusterConfigError(f"protocol must be None, got {protocol!r}.")
        tasks = (
            server_or_cluster_def.job_tasks(job_name)
            if job_name in server_or_cluster_def.jobs
            else []
        )
        index = 0 if task_index is None else task_index
        if isinstance(index, bool) or not isinstance(index, int) or not 0 <= index < len(tasks):
            raise ClusterConfigError(
                f"task_index={task_index!r} is not a task of job {job_name!r}, which has "
                f"{len(tasks)} task(s) in {server_or_cluster_def.as_dict()}."
            )
        self.cluster_spec = server_or_cluster_def
        self.job_name = job_name
        self.task_index = index
        self.address = str(tasks[index])
        self._ps: PSTask | None = None
        self._listener: Any = None
        self._stopped = threading.Event()
        self._started = False
        if start:
            self.start()

    @property
    def target(self) -> str:
        """Where this task listens, as `nbdist://host:port`."""
        return f"nbdist://{self.address}"

    def start(self) -> Server:
        """Start serving in background threads (does nothing if started)."""
        if self._started:
            return self
        host, port = split_address(self.address)
        if self.job_name == "ps":
            self._ps = PSTask(host, port).start()
        else:
            self._listener = Listener((host, port), authkey=authkey())
            threading.Thread(target=self._accept, daemon=True, name="nbdist-worker").start()
        self._started = True
        return self

    def join(self) -> None:
        """Block until the server is stopped (a ps or worker task's script calls this last)."""
        self.start()
        self._stopped.wait()

    def stop(self) -> None:
        """Stop serving."""
        self._stopped.set()
        if self._ps is not None:
            self._ps.stop()
        if self._listener is not None:
            self._listener.close()

    def _accept(self) -> None:
        while not self._stopped.is_set():
            try:
                conn = self._listener.accept()
            except (OSError, EOFError, AuthenticationError):  # a stray or wrong-key client
                if self._stopped.is_set():
                    return
                continue
            self._serve(conn)  # one chief at a time

    def _serve(self, conn: Any) -> None:
        with conn:
            while True:
                try:
                    entry, args = pickle.loads(conn.recv_bytes())
                except (OSError, EOFError):
                    return
                handler = _ENTRIES.get(entry)
                reply = handler(*args) if handler else {"error": ValueError(entry)}
                try:
                    conn.send_bytes(_dumps(reply))
                except (OSError, EOFError):
                    return

    def __repr__(self) -> str:
        return f"<nbdist.Server /job:{self.job_name}/task:{self.task_index} at {self.address}>"


def _dumps(reply: dict[str, Any]) -> bytes:
    """The reply, pickled plainly (tensors by value); an unpicklable value becomes an error."""
    try:
        return pickle.dumps(reply, protocol=pickle.HIGHEST_PROTOCOL)
    except Exception as error:
        failure = TypeError(
            f"The scheduled function's return value cannot be sent back: {error}. Return "
            "tensors, numbers or structures of them."
        )
        return pickle.dumps({"error": failure, "traceback": ""})
