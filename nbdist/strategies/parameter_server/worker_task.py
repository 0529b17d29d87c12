"""What a worker task does with a scheduled function: read, run, send the changes back.

A `WorkerState` is one worker task: its connections to the ps tasks, its copies of the
variables, its per-worker datasets. Each `nd.Server` worker has its own, so several worker
servers in one process (an in-process cluster) never share a tensor; an engine is one worker
and uses the module's functions, which act on the process's one `WorkerState`.

`run_closure(payload)` runs in the worker's process (an engine or a `nd.Server` worker):
it unpickles the function with references resolved to this worker's objects (a cached tensor
per variable, its own per-worker datasets), reads the current value of every variable the
function uses from the ps tasks (one request per ps), runs it, and sends what the function
changed back as differences (`assign_add` on each shard, one message per ps, applied whole).
It returns `{"value": ...}` or `{"error": exception, "traceback": text}`.

Example::

    payload = coordinator-side encode_call(...)       # see coordinator.py
    reply = run_closure(payload)                      # this process's worker
    reply = WorkerState().run_closure(payload)        # a worker of its own (nd.Server)
"""

from __future__ import annotations

import contextlib
import os
import pickle
import socket
import traceback
from collections.abc import Iterator
from typing import Any

import cloudpickle
import torch

from nbdist.errors import ContextError, InvalidArgumentError, is_nbdist_file
from nbdist.strategies.parameter_server.closures import VarSpec, loads_closure
from nbdist.strategies.parameter_server.transport import PSClient

__all__ = ["WorkerState", "WorkerStrategy", "make_dataset", "run_closure", "worker_info"]


class WorkerStrategy:
    """The strategy as a scheduled function sees it on a worker: one replica, this worker.

    `run(fn, args, kwargs)` calls `fn` once; `reduce` of a plain value returns it (reduced
    along `axis` when given). It exists so that TF-style step functions (`strategy.run`
    inside the scheduled function) work unchanged.
    """

    num_replicas_in_sync = 1

    def run(self, fn: Any, args: Any = (), kwargs: Any = None, options: Any = None) -> Any:
        return fn(*args, **(kwargs or {}))

    def reduce(self, reduce_op: Any, value: Any, axis: int | None = None) -> Any:
        from nbdist.reduce import ReduceOp

        if axis is None:
            return value
        op = ReduceOp.from_value(reduce_op)
        if op is ReduceOp.SUM:
            return torch.as_tensor(value).sum(axis)
        if op is ReduceOp.MEAN:
            return torch.as_tensor(value).float().mean(axis)
        tensor = torch.as_tensor(value)
        return tensor.amax(axis) if op is ReduceOp.MAX else tensor.amin(axis)

    def experimental_local_results(self, value: Any) -> tuple:
        return (value,)

    @contextlib.contextmanager
    def scope(self) -> Iterator[WorkerStrategy]:
        yield self


class WorkerState:
    """One worker task's state: ps connections, variable copies, datasets, buffers.

    Why one object per worker: the copies of the variables are the tensors a scheduled
    function computes with (their autograd graphs, the buffers received from the ps); two
    workers sharing them in one process change each other's tensors in the middle of a
    function (wrong updates, autograd's "modified by an inplace operation", heap corruption).

    Example::

        worker = WorkerState()
        reply = worker.run_closure(payload)    # {"value": ...} or {"error": ..., ...}
    """

    def __init__(self) -> None:
        self.clients: dict[str, PSClient] = {}  # ps address -> PSClient
        self.vars: dict[int, tuple[VarSpec, Any]] = {}  # vid -> (spec, Parameter or Variable)
        self.datasets: dict[int, Any] = {}  # dataset id -> dataset
        self.iterators: dict[tuple[int, int], Any] = {}  # iterator key -> iterator
        self.buffers: dict[tuple[str, int], torch.Tensor] = {}  # (ps, shard) -> last read
        self.closures = 0

    def worker_info(self) -> dict[str, Any]:
        """Host, pid and how many functions this worker has run."""
        return {"host": socket.gethostname(), "pid": os.getpid(), "closures": self.closures}

    def make_dataset(self, dataset_id: int, fn_bytes: bytes) -> dict[str, Any]:
        """Build per-worker dataset `dataset_id` here by calling its pickled `dataset_fn()`."""
        try:
            fn = cloudpickle.loads(fn_bytes)
            self.datasets[dataset_id] = fn()
            for key in [k for k in self.iterators if k[0] == dataset_id]:
                del self.iterators[key]
            return {"value": None}
        except BaseException as error:
            return _error_reply(error)

    def close(self) -> None:
        """Say goodbye to every ps task (a stopped worker server)."""
        for client in self.clients.values():
            client.close()
        self.clients.clear()

    def _client(self, index: int, address: str, timeout: float) -> PSClient:
        if address not in self.clients:
            self.clients[address] = PSClient(index, address, timeout)
        return self.clients[address]

    def _local_object(self, spec: VarSpec) -> Any:
        entry = self.vars.get(spec.vid)
        if entry is not None:
            return entry[1]
        tensor = torch.zeros(spec.shape, dtype=spec.dtype)
        if spec.kind == "parameter":
            obj: Any = torch.nn.Parameter(tensor, requires_grad=spec.requires_grad)
        else:
            from nbdist.variables import Variable

            obj = Variable.__new__(Variable)
            Variable.__init__(obj, tensor, trainable=spec.requires_grad, name=spec.name)
        self.vars[spec.vid] = (spec, obj)
        return obj

    def run_closure(self, payload: bytes) -> dict[str, Any]:
        """Run one scheduled function here (see the module docstring)."""
        used: dict[int, VarSpec] = {}
        try:
            header = pickle.loads(payload)
            addresses: list[str] = header["ps"]
            timeout: float = header["timeout"]

            def resolve(ref: Any) -> Any:
                kind = ref[0]
                if kind == "var":
                    spec: VarSpec = ref[1]
                    used[spec.vid] = spec
                    return self._local_object(spec)
                if kind == "strategy":
                    return WorkerStrategy()
                if kind == "dataset":
                    return self._dataset(ref[1])
                if kind == "iterator":
                    key = (ref[1], ref[2])
                    if key not in self.iterators:
                        self.iterators[key] = iter(self._dataset(ref[1]))
                    return self.iterators[key]
                raise InvalidArgumentError(f"unknown reference {ref!r}")

            fn, args, kwargs = loads_closure(header["closure"], resolve)
            before = self._read_variables(used, addresses, timeout)
            self.closures += 1
            value = fn(*args, **kwargs)
            self._send_changes(used, before, addresses, timeout)
            return {"value": _detached(value)}
        except BaseException as error:
            return _error_reply(error)

    def _dataset(self, dataset_id: int) -> Any:
        if dataset_id not in self.datasets:
            raise ContextError(
                f"Per-worker dataset {dataset_id} was not built on this worker; create it with "
                "coordinator.create_per_worker_dataset(dataset_fn)."
            )
        return self.datasets[dataset_id]

    def _read_variables(
        self, used: dict[int, VarSpec], addresses: list[str], timeout: float
    ) -> dict[int, list[torch.Tensor]]:
        """Bring every shard the function uses from its ps task into this worker's copies.

        Each shard is received into the buffer that held it last time (no fresh 100 MB
        allocation per function for a large table) and copied into the variable's tensor; the
        buffers stay as they arrived: they are what `_send_changes` compares against. Returns,
        per variable, its shards' values as read, in row order.
        """
        wanted: dict[int, list[int]] = {}
        for spec in used.values():
            for ps, shard, _ in spec.shards:
                wanted.setdefault(ps, []).append(shard)
        values: dict[tuple[int, int], torch.Tensor] = {}
        for ps, shards in wanted.items():
            keys = [(addresses[ps], shard) for shard in shards]
            into = [self.buffers.get(key) for key in keys]
            read = self._client(ps, addresses[ps], timeout).read(shards, into=into)
            for key, shard, tensor in zip(keys, shards, read):
                self.buffers[key] = tensor
                values[(ps, shard)] = tensor
        before: dict[int, list[torch.Tensor]] = {}
        for vid, spec in used.items():
            parts = [values[(ps, shard)] for ps, shard, _ in spec.shards]
            obj = self.vars[vid][1]
            local = _tensor_of(obj)
            with torch.no_grad():
                if len(parts) == 1:
                    local.copy_(parts[0].reshape(spec.shape))
                else:
                    row = 0
                    for part in parts:
                        local[row : row + part.shape[0]].copy_(part)
                        row += part.shape[0]
            if isinstance(obj, torch.Tensor):
                obj.grad = None
            before[vid] = parts
        return before

    def _send_changes(
        self,
        used: dict[int, VarSpec],
        before: dict[int, list[torch.Tensor]],
        addresses: list[str],
        timeout: float,
    ) -> None:
        """Send what the function changed: per shard, `now - as read`, one message per ps
        task; shards it left unchanged are not sent."""
        deltas: dict[int, dict[int, torch.Tensor]] = {}
        for vid, spec in used.items():
            now = _tensor_of(self.vars[vid][1]).detach()
            row = 0
            for (ps, shard, rows), old in zip(spec.shards, before[vid]):
                part = now.reshape(old.shape) if len(spec.shards) == 1 else now[row : row + rows]
                row += rows
                if not torch.equal(part, old):
                    deltas.setdefault(ps, {})[shard] = part - old
        for ps, shard_deltas in deltas.items():
            self._client(ps, addresses[ps], timeout).add(shard_deltas)


_process = WorkerState()
"""The worker of this process: an engine is one worker task (`nbdist.cluster.ps_dispatch`)."""


def worker_info() -> dict[str, Any]:
    """Host, pid and how many functions this process's worker has run."""
    return _process.worker_info()


def make_dataset(dataset_id: int, fn_bytes: bytes) -> dict[str, Any]:
    """Build per-worker dataset `dataset_id` on this process's worker."""
    return _process.make_dataset(dataset_id, fn_bytes)


def run_closure(payload: bytes) -> dict[str, Any]:
    """Run one scheduled function on this process's worker (see the module docstring)."""
    return _process.run_closure(payload)


def _tensor_of(obj: Any) -> torch.Tensor:
    return obj.data if isinstance(obj, torch.Tensor) else obj._tensor


def _detached(value: Any) -> Any:
    from nbdist._private_api import pytree

    def leaf(item: Any) -> Any:
        if isinstance(item, torch.Tensor):
            return item.detach().cpu().clone()
        return item

    return pytree.tree_map(leaf, value)


def _error_reply(error: BaseException) -> dict[str, Any]:
    frames = [
        frame
        for frame in traceback.extract_tb(error.__traceback__)
        if not is_nbdist_file(frame.filename)
    ]
    text = "".join(traceback.format_list(frames))
    try:
        pickle.dumps(error)
        shipped: BaseException = error
    except Exception:
        shipped = RuntimeError(f"{type(error).__name__}: {error}")
    shipped.__traceback__ = None
    return {"error": shipped, "traceback": text}
