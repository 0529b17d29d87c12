"""`EngineChannel`: the coordinator's line to a worker engine, through ipyparallel.

Each scheduled function is sent to one engine on the cluster's engine-call path
(`supervisor.submit_one(client, engine_id, worker_task.run_closure, ...)`: the entry point
as a function, sent by reference); an engine that dies is reported by ipyparallel at once
(`EngineError`, from its nanny), and becomes `WorkerUnreachable`, so the coordinator puts
the function back on the queue.

Example (needs engines, so not run here)::

    channel = EngineChannel(client, engine_id=3, name="/job:worker/task:0")
    channel.call(worker_task.worker_info)
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from nbdist.cluster.supervisor import submit_one
from nbdist.strategies.parameter_server.channels import WorkerChannel, WorkerUnreachable

__all__ = ["EngineChannel"]

_POLL_S = 1.0


class EngineChannel(WorkerChannel):
    """Calls a function of `worker_task` on ipyparallel engine `engine_id`."""

    def __init__(self, client: Any, engine_id: int, name: str):
        self._client = client
        self.engine_id = engine_id
        self.name = name
        self._dead = False

    def alive(self) -> bool:
        if self._dead:
            return False
        try:
            return self.engine_id in self._client.ids
        except Exception:
            return False

    def call(self, entry: Callable[..., dict[str, Any]], *args: Any) -> dict[str, Any]:
        from ipyparallel import error as ipp_error

        if not self.alive():
            raise WorkerUnreachable(f"{self.name} (engine {self.engine_id}) is gone")
        try:
            result = submit_one(self._client, self.engine_id, entry, *args)
        except Exception as error:
            self._dead = True
            raise WorkerUnreachable(f"{self.name}: {error}") from None
        while True:
            try:
                reply = result.get(timeout=_POLL_S)
                return reply[0] if isinstance(reply, list) else reply
            except ipp_error.TimeoutError:
                if self._dead or self.engine_id not in self._client.ids:
                    self._dead = True
                    raise WorkerUnreachable(f"{self.name} (engine {self.engine_id}) died") from None
            except (ipp_error.EngineError, ipp_error.UnmetDependency) as error:
                self._dead = True
                raise WorkerUnreachable(f"{self.name} (engine {self.engine_id}): {error}") from None
            except ipp_error.RemoteError as error:
                ename = getattr(error, "ename", None)
                if ename == "EngineError" or "EngineError" in repr(error) or not self.alive():
                    self._dead = True  # ipyparallel's report of an engine that died mid-call
                    raise WorkerUnreachable(f"{self.name} (engine {self.engine_id}) died") from None
                text = f"{ename}: {getattr(error, 'evalue', error)}"
                return {"error": RuntimeError(text), "traceback": ""}

    def close(self) -> None:
        self._dead = True
