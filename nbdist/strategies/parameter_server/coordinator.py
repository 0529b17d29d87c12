"""`ClusterCoordinator`: schedule functions on whichever worker is free (TF's
`tf.distribute.experimental.coordinator.ClusterCoordinator`).

One dispatcher thread per worker takes functions from one FIFO queue and runs each on its
worker (`worker_task.run_closure`). A worker that dies has its function put back at the head
of the queue for another worker (functions run at least once); its dispatcher waits for it to
come back and rebuilds its per-worker datasets there. The first error of any function is
raised once from the next `schedule`, `join` or `done`, after in-flight functions finished;
queued ones are cancelled. A ps task that dies (found by a watcher that pings every ps task,
or by a worker failing to reach it) makes `schedule`, `join` and `done` raise
`PSUnavailableError` naming it, from then on.

Example (needs running tasks, so not run here)::

    coordinator = ClusterCoordinator(strategy)
    result = coordinator.schedule(step, args=(iter(per_worker_dataset),))
    coordinator.join(); print(result.fetch())
"""

from __future__ import annotations

import collections
import itertools
import pickle
import threading
import time
from collections.abc import Callable
from typing import Any

import torch

from nbdist.errors import (
    ArgumentTypeError,
    CancelledError,
    ContextError,
    InvalidArgumentError,
    PSUnavailableError,
    WorkerLostError,
)
from nbdist.strategies.parameter_server import worker_task
from nbdist.strategies.parameter_server.channels import SocketChannel, WorkerUnreachable
from nbdist.strategies.parameter_server.closures import dumps_closure
from nbdist.strategies.parameter_server.transport import PSClient

__all__ = [
    "ClusterCoordinator",
    "PerWorkerDataset",
    "PerWorkerIterator",
    "RemoteValue",
]

_PING_S = 0.5


class Outcome:
    """What a scheduled function gave: set once by the coordinator (`succeed` or `fail`),
    read by the function's `RemoteValue`."""

    def __init__(self) -> None:
        self.done = threading.Event()
        self.value: Any = None
        self.error: BaseException | None = None
        self.worker: int | None = None

    def succeed(self, value: Any, worker: int) -> None:
        """The function returned `value` on worker task `worker`."""
        self.value, self.worker = value, worker
        self.done.set()

    def fail(self, error: BaseException, worker: int | None = None) -> None:
        """The function raised `error` (on `worker`; None: cancelled before it ran)."""
        self.error, self.worker = error, worker
        self.done.set()


class RemoteValue:
    """The result of a scheduled function, available once a worker ran it.

    `fetch()` blocks and returns it with tensors as NumPy arrays; `get()` with tensors. A
    function that raised re-raises its error (its type kept, the worker named); one cancelled
    because an earlier one failed raises `CancelledError`.
    """

    def __init__(self, name: str, outcome: Outcome | None = None):
        self._name = name
        self._outcome = outcome if outcome is not None else Outcome()

    @property
    def worker(self) -> int | None:
        """Index of the worker task that ran the function (None until it ran)."""
        return self._outcome.worker

    def get(self) -> Any:
        """Wait for the function and return its value (tensors stay tensors)."""
        outcome = self._outcome
        outcome.done.wait()
        if outcome.error is not None:
            raise outcome.error
        return outcome.value

    def fetch(self) -> Any:
        """Wait for the function and return its value with tensors as NumPy arrays."""
        from nbdist._private_api import pytree

        value = self.get()
        return pytree.tree_map(
            lambda leaf: leaf.numpy() if isinstance(leaf, torch.Tensor) else leaf, value
        )

    def __reduce__(self) -> Any:
        raise InvalidArgumentError(
            "A RemoteValue cannot be an argument of coordinator.schedule: its value may not "
            "exist yet. Call .fetch() (or .get()) on it first and pass the result."
        )

    def __repr__(self) -> str:
        state = "done" if self._outcome.done.is_set() else "pending"
        return f"<RemoteValue of {self._name}: {state}>"


class PerWorkerDataset:
    """A dataset built on every worker by `create_per_worker_dataset`; `iter()` of it gives a
    `PerWorkerIterator` to pass to `schedule`."""

    def __init__(self, coordinator: ClusterCoordinator, dataset_id: int, fn_bytes: bytes):
        self._coordinator = coordinator
        self.id = dataset_id
        self.fn_bytes = fn_bytes
        """The pickled `dataset_fn` that every worker builds its dataset from."""
        self._iterators = itertools.count()

    def __iter__(self) -> PerWorkerIterator:
        return PerWorkerIterator(self.id, next(self._iterators))

    def __repr__(self) -> str:
        return f"<PerWorkerDataset {self.id} on {self._coordinator.num_workers} worker(s)>"


class PerWorkerIterator:
    """An iterator with one component per worker; each scheduled function gets the one of the
    worker it runs on. It cannot be advanced on the coordinator."""

    def __init__(self, dataset_id: int, iterator_id: int):
        self.dataset_id = dataset_id
        self.iterator_id = iterator_id

    def __iter__(self) -> PerWorkerIterator:
        return self

    def __next__(self) -> Any:
        raise ArgumentTypeError(
            "next() of a per-worker iterator works only on a worker: pass the iterator to "
            "coordinator.schedule(fn, args=(iterator,)) and call next(iterator) inside fn."
        )

    get_next = __next__

    def __repr__(self) -> str:
        return f"<PerWorkerIterator of dataset {self.dataset_id}>"


class _Closure:
    def __init__(self, name: str, payload: bytes):
        self.name = name
        self.payload = payload
        self.outcome = Outcome()
        self.value = RemoteValue(name, self.outcome)


class ClusterCoordinator:
    """Schedules functions on the workers of a `ParameterServerStrategy`.

    Args:
        strategy: The `nd.ParameterServerStrategy` (its workers run the functions).

    Example (needs running tasks, so not run here)::

        coordinator = nd.experimental.coordinator.ClusterCoordinator(strategy)
        values = [coordinator.schedule(step) for _ in range(100)]
        coordinator.join()
    """

    def __init__(self, strategy: Any):
        from nbdist.strategies.parameter_server.strategy import ParameterServerStrategy

        if not isinstance(strategy, ParameterServerStrategy):
            raise ArgumentTypeError(
                "ClusterCoordinator needs a ParameterServerStrategy, got "
                f"{type(strategy).__name__}; create one with "
                "nd.ParameterServerStrategy(cluster_resolver)."
            )
        self.strategy = strategy
        channels = strategy.worker_channels
        if channels is None:
            channels = [
                SocketChannel(address, f"/job:worker/task:{i}")
                for i, address in enumerate(strategy.worker_addresses)
            ]
            strategy.worker_channels = channels
        self._cond = threading.Condition()
        self._queue: collections.deque[_Closure] = collections.deque()
        self._inflight = 0
        self._error: BaseException | None = None
        self._ps_error: PSUnavailableError | None = None
        self._datasets: list[PerWorkerDataset] = []
        self._built: dict[int, tuple[Any, set[int]]] = {}  # worker -> (channel key, dataset ids)
        self._stopped = False
        self._alive_at = time.monotonic()  # when a worker was last known reachable
        self._ids = itertools.count(1)
        self._threads = [
            threading.Thread(target=self._dispatch, args=(i,), daemon=True, name=f"nbdist-w{i}")
            for i in range(strategy.num_workers)
        ]
        self._threads.append(
            threading.Thread(target=self._watch_ps, daemon=True, name="nbdist-ps-watch")
        )
        for thread in self._threads:
            thread.start()

    @property
    def num_workers(self) -> int:
        return self.strategy.num_workers

    # -- public API -------------------------------------------------------------------------
    def schedule(
        self, fn: Callable[..., Any], args: Any = (), kwargs: dict[str, Any] | None = None
    ) -> RemoteValue:
        """Queue `fn(*args, **kwargs)` to run on a free worker; returns a `RemoteValue` at once.

        Raises:
            The first error of an earlier function (once); `PSUnavailableError` if a ps task
            died; `ValueError` for a `RemoteValue` argument; `TypeError` for a function or
            argument that cannot be pickled; `ContextError` after `shutdown()`.
        """
        self._raise_pending(wait=True)
        if self._stopped:
            raise ContextError(
                "This ClusterCoordinator was shut down: nothing would run the function. Create "
                "a new one with nd.experimental.coordinator.ClusterCoordinator(strategy)."
            )
        if not callable(fn):
            raise ArgumentTypeError(f"schedule needs a function to call, got {fn!r}.")
        args = tuple(args)
        kwargs = dict(kwargs or {})
        for where, value in [*((f"args[{i}]", a) for i, a in enumerate(args)), *kwargs.items()]:
            if isinstance(value, RemoteValue):
                raise InvalidArgumentError(
                    f"schedule got a RemoteValue as {where}: its value may not exist yet. Call "
                    ".fetch() (or .get()) on it first and pass the result."
                )
        name = getattr(fn, "__name__", type(fn).__name__)
        closure = _Closure(name, self._encode(name, fn, args, kwargs))
        with self._cond:
            self._queue.append(closure)
            self._cond.notify_all()
        return closure.value

    def join(self) -> None:
        """Block until every scheduled function has finished; then raise the first error of
        any (once), or `PSUnavailableError` if a ps task died.

        Raises `WorkerLostError` when functions wait and no worker has been reachable for
        `strategy.timeout` seconds (the functions stay queued: they run once a worker is back).
        """
        with self._cond:
            while (self._queue or self._inflight) and self._ps_error is None:
                if self._queue and not self._inflight:
                    self._check_some_worker_alive()
                self._cond.wait(timeout=1.0)
        self._raise_pending(wait=True)

    def done(self) -> bool:
        """True when every scheduled function has finished (never blocks, except to let
        in-flight functions finish before raising an earlier function's error)."""
        self._raise_pending(wait=True)
        with self._cond:
            return not self._queue and not self._inflight

    def create_per_worker_dataset(self, dataset_fn: Callable[[], Any]) -> PerWorkerDataset:
        """Build `dataset_fn()` on every worker (again on a worker that comes back); pass
        `iter()` of the result to `schedule`."""
        if not callable(dataset_fn):
            raise ArgumentTypeError(
                f"create_per_worker_dataset needs a function returning a dataset, got "
                f"{dataset_fn!r}; e.g. lambda: torch.utils.data.DataLoader(...)."
            )
        try:
            # The strategy and variables travel as references (TF's tutorial returns
            # strategy.distribute_datasets_from_function(...) from it), the rest by value.
            fn_bytes = dumps_closure(dataset_fn, self._reference)
        except InvalidArgumentError:
            raise
        except Exception as error:
            culprit = _captured_culprit(dataset_fn, self._reference)
            raise ArgumentTypeError(
                f"dataset_fn cannot be sent to the workers: {culprit} "
                f"cannot be pickled ({type(error).__name__}: {error}). Create it inside "
                "dataset_fn, or pass what it needs as picklable values (numbers, tensors, "
                "functions)."
            ) from None
        dataset = PerWorkerDataset(self, next(self._ids), fn_bytes)
        with self._cond:
            self._datasets.append(dataset)
            self._cond.notify_all()
        return dataset

    def fetch(self, value: Any) -> Any:
        """TF's `coordinator.fetch`: `RemoteValue`s (at any depth) replaced by their values."""
        from nbdist._private_api import pytree

        return pytree.tree_map(
            lambda leaf: leaf.fetch() if isinstance(leaf, RemoteValue) else leaf,
            value,
            is_leaf=lambda leaf: isinstance(leaf, RemoteValue),
        )

    def shutdown(self) -> None:
        """Stop the dispatcher threads (queued functions are cancelled)."""
        with self._cond:
            self._stopped = True
            self._cancel_queued(CancelledError("the coordinator was shut down"))
            self._cond.notify_all()

    # -- internals ------------------------------------------------------------------------------
    def _check_some_worker_alive(self) -> None:
        waited = time.monotonic() - self._alive_at
        if waited <= self.strategy.timeout:
            return
        workers = ", ".join(
            f"/job:worker/task:{i} ("
            + (getattr(channel, "address", None) or f"engine {getattr(channel, 'engine_id', '?')}")
            + ")"
            for i, channel in enumerate(self.strategy.worker_channels)
        )
        raise WorkerLostError(
            f"No worker task has been reachable for {waited:.0f} s (strategy.timeout is "
            f"{self.strategy.timeout:g} s) while {len(self._queue)} function(s) wait: {workers}. "
            "Start the worker tasks (nd.Server(cluster_spec, 'worker', i).join() in each, or "
            "cluster.restart_worker(i) for engines); the functions stay queued and run once a "
            "worker is back.",
            missing=tuple(range(self.num_workers)),
        )

    def _raise_pending(self, wait: bool) -> None:
        with self._cond:
            if self._ps_error is not None:
                raise self._ps_error
            if self._error is None:
                return
            while wait and self._inflight and self._ps_error is None:
                self._cond.wait(timeout=1.0)
            error, self._error = self._error, None
        raise error

    def _reference(self, obj: Any) -> Any:
        if isinstance(obj, PerWorkerIterator):
            return ("iterator", obj.dataset_id, obj.iterator_id)
        if isinstance(obj, PerWorkerDataset):
            return ("dataset", obj.id)
        if isinstance(obj, RemoteValue):
            obj.__reduce__()  # raises: a RemoteValue nested in an argument
        return self.strategy.closure_reference(obj)

    def _encode(self, name: str, fn: Any, args: tuple, kwargs: dict) -> bytes:
        try:
            closure = dumps_closure((fn, args, kwargs), self._reference)
        except InvalidArgumentError:
            raise
        except Exception as error:
            what = _unpicklable_part(fn, args, kwargs, self._reference)
            raise ArgumentTypeError(
                f"schedule cannot send {what} of {name!r} to a worker: "
                f"{type(error).__name__}: {error}. Pass values that can be pickled (tensors, "
                "numbers, modules and variables created in strategy.scope()); create "
                "locks, files or connections inside the function instead."
            ) from None
        header = {
            "ps": list(self.strategy.ps_addresses),
            "timeout": self.strategy.timeout,
            "closure": closure,
        }
        return pickle.dumps(header, protocol=pickle.HIGHEST_PROTOCOL)

    def _cancel_queued(self, error: BaseException) -> None:
        while self._queue:
            closure = self._queue.popleft()
            closure.outcome.fail(error)

    def _next_closure(self) -> _Closure | None:
        with self._cond:
            while not self._queue and not self._stopped:
                self._alive_at = time.monotonic()  # this worker was reachable; it waits for work
                self._cond.wait(timeout=1.0)
            if self._stopped:
                return None
            self._inflight += 1
            return self._queue.popleft()

    def _channel(self, worker: int) -> Any:
        return self.strategy.worker_channels[worker]

    def _dispatch(self, worker: int) -> None:
        while True:
            channel = self._channel(worker)
            if not self._wait_alive(worker, channel):
                return
            closure = self._next_closure()
            if closure is None:
                return
            channel = self._channel(worker)
            try:
                self._build_datasets(worker, channel)
                reply = channel.call(worker_task.run_closure, closure.payload)
            except WorkerUnreachable:
                with self._cond:  # put it back at the head: another worker runs it
                    self._inflight -= 1
                    self._queue.appendleft(closure)
                    self._cond.notify_all()
                continue
            except BaseException as error:
                reply = {"error": error, "traceback": ""}
            self._finish(worker, closure, reply)

    def _wait_alive(self, worker: int, channel: Any) -> bool:
        """Wait until `worker` is reachable (it may be a replacement); False once stopped."""
        while not self._stopped:
            channel = self._channel(worker)
            if channel is not None and channel.alive():
                self._alive_at = time.monotonic()
                return True
            with self._cond:
                self._cond.wait(timeout=0.5)
        return False

    def _build_datasets(self, worker: int, channel: Any) -> None:
        key = (id(channel), channel.generation)
        known, built = self._built.get(worker, (None, set()))
        if known != key:
            built = set()  # a new or restarted worker: its datasets are rebuilt
        for dataset in list(self._datasets):
            if dataset.id in built:
                continue
            reply = channel.call(worker_task.make_dataset, dataset.id, dataset.fn_bytes)
            if "error" in reply:
                raise _labelled(reply, worker, "create_per_worker_dataset's dataset_fn")
            built.add(dataset.id)
        self._built[worker] = (key, built)

    def _finish(self, worker: int, closure: _Closure, reply: dict[str, Any]) -> None:
        with self._cond:
            self._inflight -= 1
            if "error" not in reply:
                closure.outcome.succeed(reply["value"], worker)
            else:
                error = _labelled(reply, worker, closure.name)
                closure.outcome.fail(error, worker)
                if isinstance(error, PSUnavailableError):
                    self._ps_failed(error)
                elif self._error is None:
                    self._error = error
                    self._cancel_queued(
                        CancelledError(
                            f"{closure.name!r} was cancelled because an earlier function "
                            f"failed ({type(error).__name__}); schedule it again."
                        )
                    )
            self._cond.notify_all()

    def _ps_failed(self, error: PSUnavailableError) -> None:
        if self._ps_error is None:
            self._ps_error = error
        self._cancel_queued(error)
        self._cond.notify_all()

    def _watch_ps(self) -> None:
        clients = [
            PSClient(i, address, timeout=min(self.strategy.timeout, 30.0))
            for i, address in enumerate(self.strategy.ps_addresses)
        ]
        try:
            while not self._stopped and self._ps_error is None:
                for client in clients:
                    try:
                        client.ping()
                    except PSUnavailableError as error:
                        with self._cond:
                            self._ps_failed(error)
                        return
                with self._cond:
                    self._cond.wait(timeout=_PING_S)
        finally:
            for client in clients:
                client.close()


def _labelled(reply: dict[str, Any], worker: int, name: str) -> BaseException:
    error = reply["error"]
    where = f"/job:worker/task:{worker}"
    if isinstance(error, PSUnavailableError):
        return error
    message = f"{name!r} failed on {where}"
    if error.args and isinstance(error.args[0], str):
        error.args = (f"{error.args[0]} ({message})", *error.args[1:])
    else:
        error.add_note(message)
    if reply.get("traceback"):
        error.add_note(f"Traceback on {where} (most recent call last):\n{reply['traceback']}")
    return error


def _captured_culprit(fn: Any, lookup: Any) -> str:
    """Which object captured by `fn` (a global it uses, a closure cell, a default) cannot be
    pickled, as `"'name' (a Type)"`; `"an object it uses"` when none alone is the cause."""
    code = getattr(fn, "__code__", None)
    candidates: list[tuple[str, Any]] = []
    if code is not None:
        cells = getattr(fn, "__closure__", None) or ()
        for name, cell in zip(code.co_freevars, cells):
            try:
                candidates.append((name, cell.cell_contents))
            except ValueError:
                continue
        scope = getattr(fn, "__globals__", {})
        candidates += [(name, scope[name]) for name in code.co_names if name in scope]
        candidates += [(f"default {i}", d) for i, d in enumerate(fn.__defaults__ or ())]
    for name, value in candidates:
        try:
            dumps_closure(value, lookup)
        except Exception:
            return f"{name!r} (a {type(value).__name__} it uses)"
    return "an object it uses"


def _unpicklable_part(fn: Any, args: tuple, kwargs: dict, lookup: Any) -> str:
    parts = [("the function", fn)] + [(f"args[{i}]", a) for i, a in enumerate(args)]
    parts += [(f"kwargs[{k!r}]", v) for k, v in kwargs.items()]
    for label, value in parts:
        try:
            dumps_closure(value, lookup)
        except Exception:
            return label
    return "an argument"
