"""What a worker task does with a scheduled function: read, run, send the changes back.

`run_closure(payload)` runs in the worker's process (an engine or a `nd.Server` worker):
it unpickles the function with references resolved to this worker's objects (a cached tensor
per variable, its own per-worker datasets), reads the current value of every variable the
function uses from the ps tasks (one request per ps), runs it, and sends what the function
changed back as differences (`assign_add` on each shard, one message per ps, applied whole).
It returns `{"value": ...}` or `{"error": exception, "traceback": text}`.

Example::

    payload = coordinator-side encode_call(...)       # see coordinator.py
    reply = run_closure(payload)
"""

from __future__ import annotations

import contextlib
import os
import pickle
import socket
import threading
import traceback
from collections.abc import Iterator
from typing import Any

import torch

from nbdist.errors import (
    ContextError,
    InvalidArgumentError,
    is_nbdist_file,
    show_internal_frames,
)
from nbdist.strategies.parameter_server import optimizers
from nbdist.strategies.parameter_server.closures import VarSpec, loads_closure
from nbdist.strategies.parameter_server.transport import PSClient

__all__ = ["WorkerStrategy", "make_dataset", "run_closure", "worker_info"]

def new_state() -> dict[str, Any]:
    """One worker task's state: its variables' copies, datasets, iterators, connections."""
    return {
        "clients": {},  # ps address -> PSClient
        "vars": {},  # vid -> (VarSpec, tensor or Parameter or Variable)
        "datasets": {},  # dataset id -> dataset
        "iterators": {},  # iterator id -> iterator
        "buffers": {},  # (ps address, shard id) -> the shard's value as last read from the ps
        "closures": 0,
    }


_process_state = new_state()  # an engine is one worker task: its state is the process's
_serving = threading.local()


def serve_as(state: dict[str, Any]) -> None:
    """Make this thread act as the worker task owning `state`: each `nd.Server` worker task
    of a process (TF's in-process cluster runs several) has its own variables, datasets and
    iterators, so two workers never share a generator or a parameter copy."""
    _serving.state = state


def _st() -> dict[str, Any]:
    return getattr(_serving, "state", _process_state)


class WorkerStrategy:
    """The strategy as a scheduled function sees it on a worker: one replica, this worker.

    `run(fn, args, kwargs)` calls `fn` once; `reduce` of a plain value returns it (reduced
    along `axis` when given), by the rules of every strategy's `reduce` (`nbdist.core.reduce.rules`:
    bools refused, integer MEAN floating, MAX/MIN of nothing the op's identity). It exists so
    that TF-style step functions (`strategy.run` inside the scheduled function) work unchanged.
    """

    num_replicas_in_sync = 1

    def run(self, fn: Any, args: Any = (), kwargs: Any = None, options: Any = None) -> Any:
        return fn(*args, **(kwargs or {}))

    def reduce(self, reduce_op: Any, value: Any, axis: int | None = None) -> Any:
        from nbdist._private_api import pytree
        from nbdist.core.reduce import rules as reduction
        from nbdist.core.reduce.op import ReduceOp
        from nbdist.core.reduce.placement import Placement, SingleWorker

        op = ReduceOp.from_value(reduce_op)
        reduction.check_axis_argument(axis, "reduce", optional=True)
        one = SingleWorker(Placement(devices=("cpu",)))
        return pytree.tree_map(lambda leaf: reduction.reduce_value(one, op, leaf, axis), value)

    def experimental_local_results(self, value: Any) -> tuple:
        return (value,)

    def distribute_datasets_from_function(self, dataset_fn: Any, options: Any = None) -> Any:
        """`dataset_fn(input_context)` for this worker, as TF's parameter-server strategy
        calls it: each worker is its own input pipeline, so the context says one pipeline
        (`num_input_pipelines=1`, `input_pipeline_id=0`) and one replica; the dataset is
        returned as it is (batched per worker)."""
        from nbdist.input import InputContext

        return dataset_fn(InputContext(1, 0, 1))

    def experimental_distribute_dataset(self, dataset: Any, options: Any = None) -> Any:
        """The dataset itself: on a worker, one replica takes every batch."""
        return dataset

    @contextlib.contextmanager
    def scope(self) -> Iterator[WorkerStrategy]:
        yield self


def worker_info() -> dict[str, Any]:
    """Host, pid and how many functions this worker has run."""
    return {"host": socket.gethostname(), "pid": os.getpid(), "closures": _st()["closures"]}


def make_dataset(dataset_id: int, fn_bytes: bytes) -> dict[str, Any]:
    """Build per-worker dataset `dataset_id` here by calling its pickled `dataset_fn()`."""

    def resolve(ref: Any) -> Any:
        if ref[0] == "strategy":
            return WorkerStrategy()
        raise ContextError(
            f"dataset_fn uses {ref[0]} {getattr(ref[1], 'name', '')!r} of the strategy: a "
            "per-worker dataset is built once per worker, before any function runs. Pass "
            "numbers or tensors to dataset_fn instead (read the variable on the chief first)."
        )

    try:
        fn = loads_closure(fn_bytes, resolve)
        _st()["datasets"][dataset_id] = fn()
        for key in [k for k in _st()["iterators"] if k[0] == dataset_id]:
            del _st()["iterators"][key]
        return {"value": None}
    except BaseException as error:
        return _error_reply(error)


def _client(index: int, address: str, timeout: float) -> PSClient:
    clients = _st()["clients"]
    if address not in clients:
        clients[address] = PSClient(index, address, timeout)
    return clients[address]


def _local_object(spec: VarSpec) -> Any:
    entry = _st()["vars"].get(spec.vid)
    if entry is not None and entry[0] == spec:
        return entry[1]
    # New, or the same id from another strategy served by this process (its values are read
    # from the ps tasks every function, so only the container's shape and kind matter).
    tensor = torch.zeros(spec.shape, dtype=spec.dtype)
    if spec.kind == "parameter":
        obj: Any = torch.nn.Parameter(tensor, requires_grad=spec.requires_grad)
    else:
        from nbdist.core.variables import Variable

        obj = Variable.__new__(Variable)
        Variable.__init__(obj, tensor, trainable=spec.requires_grad, name=spec.name)
    _st()["vars"][spec.vid] = (spec, obj)
    return obj


def _tensor_of(obj: Any) -> torch.Tensor:
    return obj.data if isinstance(obj, torch.Tensor) else obj.read_value_no_copy()


def run_closure(payload: bytes) -> dict[str, Any]:
    """Run one scheduled function here (see the module docstring)."""
    used: dict[int, VarSpec] = {}
    opts: dict[int, optimizers.WorkerOptimizer] = {}  # optimizer id -> rebuilt here
    try:
        header = pickle.loads(payload)
        addresses: list[str] = header["ps"]
        timeout: float = header["timeout"]

        def resolve(ref: Any) -> Any:
            kind = ref[0]
            if kind == "var":
                spec: VarSpec = ref[1]
                used[spec.vid] = spec
                return _local_object(spec)
            if kind == "strategy":
                return WorkerStrategy()
            if kind == "optimizer":
                # Its parameters arrived as this worker's copies (resolved above).
                described: optimizers.OptimizerRef = ref[1]
                if described.oid not in opts:
                    specs = {id(obj): spec for spec, obj in _st()["vars"].values()}
                    opts[described.oid] = optimizers.rebuild(described, specs)
                return opts[described.oid].optimizer
            if kind == "dataset":
                return _dataset(ref[1])
            if kind == "iterator":
                key = (ref[1], ref[2])
                if key not in _st()["iterators"]:
                    _st()["iterators"][key] = iter(_dataset(ref[1]))
                return _st()["iterators"][key]
            raise InvalidArgumentError(f"unknown reference {ref!r}")

        fn, args, kwargs = loads_closure(header["closure"], resolve)
        before = _read_variables(used, addresses, timeout)

        def client(ps: int) -> PSClient:
            return _client(ps, addresses[ps], timeout)

        for opt in opts.values():
            optimizers.load(opt, client)
        _st()["closures"] += 1
        value = fn(*args, **kwargs)
        _send_changes(used, before, addresses, timeout)
        for opt in opts.values():
            optimizers.store(opt, client)
        return {"value": _detached(value)}
    except BaseException as error:
        return _error_reply(error)


def _dataset(dataset_id: int) -> Any:
    if dataset_id not in _st()["datasets"]:
        raise ContextError(
            f"Per-worker dataset {dataset_id} was not built on this worker; create it with "
            "coordinator.create_per_worker_dataset(dataset_fn)."
        )
    return _st()["datasets"][dataset_id]


def _read_variables(
    used: dict[int, VarSpec], addresses: list[str], timeout: float
) -> dict[int, list[torch.Tensor]]:
    """Bring every shard the function uses from its ps task into this worker's copies.

    Each shard is received into the buffer that held it last time (no fresh 100 MB allocation
    per function for a large table) and copied into the variable's tensor; the buffers stay
    as they arrived: they are what `_send_changes` compares against. Returns, per variable,
    its shards' values as read, in row order.
    """
    wanted: dict[int, list[int]] = {}
    for spec in used.values():
        for ps, shard, _ in spec.shards:
            wanted.setdefault(ps, []).append(shard)
    buffers: dict[tuple[str, int], torch.Tensor] = _st()["buffers"]
    values: dict[tuple[int, int], torch.Tensor] = {}
    for ps, shards in wanted.items():
        keys = [(addresses[ps], shard) for shard in shards]
        into = [buffers.get(key) for key in keys]
        read = _client(ps, addresses[ps], timeout).read(shards, into=into)
        for key, shard, tensor in zip(keys, shards, read):
            buffers[key] = tensor
            values[(ps, shard)] = tensor
    before: dict[int, list[torch.Tensor]] = {}
    for vid, spec in used.items():
        parts = [values[(ps, shard)] for ps, shard, _ in spec.shards]
        obj = _st()["vars"][vid][1]
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
    used: dict[int, VarSpec],
    before: dict[int, list[torch.Tensor]],
    addresses: list[str],
    timeout: float,
) -> None:
    """Send what the function changed: per shard, `now - as read`, one message per ps task;
    shards it left unchanged are not sent."""
    deltas: dict[int, dict[int, torch.Tensor]] = {}
    for vid, spec in used.items():
        now = _tensor_of(_st()["vars"][vid][1]).detach()
        row = 0
        for (ps, shard, rows), old in zip(spec.shards, before[vid]):
            part = now.reshape(old.shape) if len(spec.shards) == 1 else now[row : row + rows]
            row += rows
            if not torch.equal(part, old):
                deltas.setdefault(ps, {})[shard] = part - old
    for ps, shard_deltas in deltas.items():
        _client(ps, addresses[ps], timeout).add(shard_deltas)


def _detached(value: Any) -> Any:
    from nbdist._private_api import pytree

    def leaf(item: Any) -> Any:
        if isinstance(item, torch.Tensor):
            return item.detach().cpu().clone()
        return item

    return pytree.tree_map(leaf, value)


def _error_reply(error: BaseException) -> dict[str, Any]:
    internal = show_internal_frames()  # NBDIST_SHOW_INTERNAL_FRAMES=1 keeps nbdist's frames
    frames = [
        frame
        for frame in traceback.extract_tb(error.__traceback__)
        if internal or not is_nbdist_file(frame.filename)
    ]
    text = "".join(traceback.format_list(frames))
    try:
        pickle.dumps(error)
        shipped: BaseException = error
    except Exception:
        shipped = RuntimeError(f"{type(error).__name__}: {error}")
    shipped.__traceback__ = None
    return {"error": shipped, "traceback": text}
