"""The notebook's view of the engines as one strategy: `EngineStrategy`, and `nd.remote`.

`cluster.strategy` is an `EngineStrategy`: its replicas are the engines, replica `i` being
the engine of rank `i`. `run(fn, args)` sends `fn` to every engine and runs it there inside the
engine's own `MultiWorkerMirroredStrategy.run` (replica context, so collectives work); names
in `fn` resolve in the engine's namespace when `fn` comes from the notebook (Note [Names
resolve on the engines] in `_wire`). Results come back as `PerReplica` values that `reduce`,
`gather` and `experimental_local_results` combine here, in the notebook.

Example (needs engines, so not run here)::

    cluster = nd.Cluster(n=2).start()
    def step(scale):
        ctx = nd.get_replica_context()
        return ctx.all_reduce("sum", torch.tensor(1.0 + ctx.replica_id_in_sync_group)) * scale
    out = cluster.strategy.run(step, args=(nd.PerReplica([1.0, 10.0]),))
    cluster.strategy.experimental_local_results(out)   # (tensor(3.), tensor(30.))
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from nbdist._private_api import pytree
from nbdist.cluster import _wire
from nbdist.cluster.engine_side import entry_points as entries
from nbdist.cluster.refs import RemoteRef, remote
from nbdist.core.reduce.op import ReduceOp
from nbdist.core.reduce.placement import Placement, SingleWorker
from nbdist.core.values import DistributedValues, PerReplica
from nbdist.errors import ArgumentTypeError, ContextError, InvalidArgumentError
from nbdist.input.errors import StepsExhaustedError

if TYPE_CHECKING:
    from nbdist.cluster.handle import ClusterHandle

__all__ = ["EngineStrategy", "RemoteRef", "remote"]


class EngineStrategy:
    """A client-side strategy whose replicas are a `Cluster`'s engines (`cluster.strategy`).

    `timeout` (seconds, default None: no limit) bounds how long `run` and `run_steps` wait for
    the engines; past it the engines still running are interrupted and `EngineTimeoutError`
    is raised. Ctrl-C while waiting interrupts the engines too.
    """

    def __init__(self, cluster: ClusterHandle):
        self._cluster = cluster
        self.timeout: float | None = None

    @property
    def cluster(self) -> ClusterHandle:
        """The `Cluster` whose engines are the replicas."""
        return self._cluster

    @property
    def num_replicas_in_sync(self) -> int:
        """The number of engines (one replica each)."""
        return self._cluster.num_engines

    def _client_workers(self) -> SingleWorker:
        """The engines' results, all in the notebook: replicas with nothing left to exchange."""
        return SingleWorker(Placement(devices=("cpu",) * self.num_replicas_in_sync))

    # -- run ----------------------------------------------------------------------------
    def run(
        self,
        fn: Callable[..., Any],
        args: Sequence[Any] = (),
        kwargs: dict[str, Any] | None = None,
        options: Any = None,
        *,
        timeout: float | None = None,
    ) -> Any:
        """Run `fn(*args, **kwargs)` once on every engine, in replica context; gather results.

        Context: the notebook, from any thread: calls into one cluster take turns (a call
        waits for another thread's to finish, and its `timeout` covers that wait).
        Hangs if: never past `timeout`; with no timeout, as long as the engines work (an
        engine that dies or fails releases the others) and as long as earlier calls run.

        Args:
            fn: A function. Defined in the notebook (`__main__`), its global names resolve in
                each engine's namespace; other callables are pickled by cloudpickle.
            args, kwargs: Sent to every engine. A `PerReplica` (or `Mirrored`) at any depth is
                scattered: engine `i` gets component `i`. `nd.remote("name")` becomes each
                engine's object of that name.
            options: Must be None (nbdist has no run options; any other value raises
                `UnsupportedOptionError` before anything is sent).
            timeout: Seconds to wait (default: `self.timeout`).

        Returns:
            Leaf by leaf, a `PerReplica` of the engines' values in replica order (tensors
            detached, on the CPU); `None` where every engine returned `None`.

        Raises:
            RemoteError: one or more engines raised; lists them, shows the first traceback.
            SerializationError: (a `TypeError`) `fn` or an argument cannot be pickled.
            EngineTimeoutError: (a `TimeoutError`) the engines did not finish in time.
            BusyError: (a `TimeoutError`) another thread's call into the cluster still ran
                when `timeout` passed; nothing was sent.
        """
        if not callable(fn):
            raise ArgumentTypeError(f"strategy.run needs a function to call, got {fn!r}.")
        if options is not None:  # the in-process strategies' check (imports them: torch)
            from nbdist.strategies.base import check_run_options

            check_run_options(options)
        kwargs = dict(kwargs or {})
        n = self.num_replicas_in_sync
        if _has_distributed((args, kwargs)):
            payloads = [_encode_call(fn, *_scatter((tuple(args), kwargs), i, n)) for i in range(n)]
        else:
            payloads = _encode_call(fn, tuple(args), kwargs)
        replies = self._cluster.call(
            entries.call, payloads, timeout=self._timeout(timeout),
            what=f"strategy.run({_name(fn)})", fn=fn, needs_group=True,
        )  # fmt: skip
        return _merge([reply["value"] for reply in replies])

    def run_steps(
        self,
        fn: Callable[[Any], Any],
        iterator: str | RemoteRef,
        steps: int = 1,
        *,
        timeout: float | None = None,
    ) -> Any:
        """Run `fn(next(iterator))` `steps` times on every engine in one round trip.

        Each step is one `strategy.run` on the engine; only the last step's result comes
        back. Use it to keep the notebook out of the inner training loop.

        Args:
            fn: Called with one batch per step (see `run` for how names resolve).
            iterator: The name of (or `nd.remote` to) an iterator on the engines, e.g. one
                made with `it = iter(strategy.experimental_distribute_dataset(data))`.
            steps: Steps per call, at least 1.
            timeout: Seconds to wait (default: `self.timeout`).

        Returns:
            The last step's result, as `run` returns it. An engine whose iterator ran out
            before its first step contributes `None`. Engines must have equally long data
            (nbdist's distributed datasets give every replica the same number of batches);
            an engine that runs out early leaves the others waiting in their collectives
            until the collective timeout.

        Raises:
            StepsExhaustedError: (an `InputExhaustedError` and a `StopIteration`) every
                engine's iterator was exhausted before the first step.
            RemoteError, SerializationError, EngineTimeoutError: as `run`.
        """
        if not callable(fn):
            raise ArgumentTypeError(f"run_steps needs a function to call, got {fn!r}.")
        if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
            raise InvalidArgumentError(f"steps must be a whole number >= 1, got {steps!r}.")
        ref = iterator if isinstance(iterator, RemoteRef) else RemoteRef(iterator)
        payload = _encode_call(fn, (ref,), {})
        replies = self._cluster.call(
            entries.call_steps, payload, steps, timeout=self._timeout(timeout),
            what=f"strategy.run_steps({_name(fn)}, {ref!r}, steps={steps})", fn=fn,
            needs_group=True,
        )  # fmt: skip
        if all(reply.get("steps", 0) == 0 for reply in replies):
            raise StepsExhaustedError(
                f"The iterator {ref!r} is exhausted on every engine: the epoch is over. Make a "
                "new one on the engines for the next epoch, e.g. "
                "`it = iter(strategy.experimental_distribute_dataset(data))`."
            )
        return _merge([reply["value"] for reply in replies])

    def _timeout(self, timeout: float | None) -> float | None:
        chosen = self.timeout if timeout is None else timeout
        if chosen is not None and not chosen > 0:
            raise InvalidArgumentError(
                f"timeout must be a positive number of seconds, got {chosen!r}."
            )
        return chosen

    # -- cross-replica, in the notebook ---------------------------------------------------
    def reduce(self, reduce_op: ReduceOp | str, value: Any, axis: int | None = None) -> Any:
        """Combine what `run` returned, here in the notebook (`Strategy.reduce`'s semantics).

        Example (what two engines returned; any object with `num_engines` stands in for the
        cluster here):
            >>> import torch
            >>> class TwoEngines:
            ...     num_engines = 2
            >>> s = EngineStrategy(TwoEngines())
            >>> value = PerReplica([torch.tensor([0.0, 1.0]), torch.tensor([4.0])])
            >>> s.reduce("mean", value, axis=0), s.gather(value, axis=0)
            (tensor(1.6667), tensor([0., 1., 4.]))
        """
        from nbdist.core.reduce import rules as reduction

        op = ReduceOp.from_value(reduce_op)
        reduction.check_axis_argument(axis, "reduce", optional=True)
        replicas = self._client_workers()
        return pytree.tree_map(
            lambda leaf: reduction.reduce_value(replicas, op, leaf, axis),
            value,
            is_leaf=lambda leaf: isinstance(leaf, DistributedValues),
        )

    def gather(self, value: Any, axis: int) -> Any:
        """Concatenate the replicas' components along `axis`, in replica order, on the CPU."""
        from nbdist.core.reduce import rules as reduction

        replicas = self._client_workers()
        return pytree.tree_map(
            lambda leaf: reduction.gather_value(replicas, leaf, axis),
            value,
            is_leaf=lambda leaf: isinstance(leaf, DistributedValues),
        )

    def experimental_local_results(self, value: Any) -> tuple[Any, ...]:
        """The components of `value`, one per engine; a plain value gives `(value,)`."""
        if isinstance(value, DistributedValues):
            return value.values
        flat, _ = pytree.tree_flatten(value, is_leaf=lambda v: isinstance(v, DistributedValues))
        count = max((len(v.values) for v in flat if isinstance(v, DistributedValues)), default=0)
        if count == 0:
            return (value,)
        return tuple(_scatter(value, i, count) for i in range(count))

    def scope(self) -> Any:
        """Not available in the notebook: models and optimizers live on the engines."""
        raise ContextError(
            "cluster.strategy is the notebook's handle on the engines and has no scope(): "
            "models and optimizers live on the engines. Create them there inside "
            "`with strategy.scope():` (in a %%distribute cell, or in a function given to "
            "cluster.strategy.run) and pass nd.remote('name') to refer to them."
        )

    def __repr__(self) -> str:
        return f"<EngineStrategy: {self.num_replicas_in_sync} replica(s) on {self._cluster!r}>"


# -- helpers ---------------------------------------------------------------------------------
def _name(fn: Any) -> str:
    return getattr(fn, "__qualname__", None) or getattr(fn, "__name__", None) or repr(fn)


def _is_distributed(value: Any) -> bool:
    return isinstance(value, DistributedValues)


def _has_distributed(structure: Any) -> bool:
    flat, _ = pytree.tree_flatten(structure, is_leaf=_is_distributed)
    return any(_is_distributed(leaf) for leaf in flat)


def _scatter(structure: Any, index: int, n: int) -> Any:
    """`structure` with every distributed value replaced by its component `index`."""

    def pick(value: Any) -> Any:
        if not _is_distributed(value):
            return value
        if len(value.values) != n:
            raise InvalidArgumentError(
                f"A {type(value).__name__} with {len(value.values)} component(s) was passed to "
                f"the engines, but there are {n} replicas (one per engine). Give one component "
                "per engine, in replica order."
            )
        return value.values[index]

    return pytree.tree_map(pick, structure, is_leaf=_is_distributed)


def _encode_call(fn: Callable[..., Any], args: tuple, kwargs: dict[str, Any]) -> bytes:
    parts = [("the function", fn)]
    parts += [(f"args[{i}]", arg) for i, arg in enumerate(args)]
    parts += [(f"kwargs[{key!r}]", arg) for key, arg in kwargs.items()]
    return _wire.encode(_wire.Call.of(fn, args, kwargs), parts)


def _merge(values: list[Any]) -> Any:
    """The engines' results, leaf by leaf, as `PerReplica` values (None where all are None)."""
    if all(value is None for value in values):
        return None
    flat0, spec0 = pytree.tree_flatten(values[0], is_leaf=_is_distributed)
    columns = [flat0]
    for value in values[1:]:
        flat, spec = pytree.tree_flatten(value, is_leaf=_is_distributed)
        if spec != spec0:
            return PerReplica(values)  # differently structured: one component per engine
        columns.append(flat)
    leaves = [
        None if all(c is None for c in components) else PerReplica(components)
        for components in zip(*columns)
    ]
    return pytree.tree_unflatten(leaves, spec0)
