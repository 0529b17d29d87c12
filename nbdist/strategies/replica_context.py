"""`ReplicaContext`: the API inside `strategy.run` (who this replica is, and its collectives).

Each collective checks that it is called where it can be matched (`_require_current`), then
calls the hook its strategy implements. Imports core modules only (not
`nbdist.strategies.base`, which imports it).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import Any

from nbdist.core import context
from nbdist.core.reduce.op import RESOLVED_OPS, ReduceOp
from nbdist.errors import ArgumentTypeError, ContextError
from nbdist.strategies._compiled import collective_between_graphs

__all__ = ["ReplicaContext"]

_OP_TYPES = (str, ReduceOp)
# The caller's replica context: the context variable's own `get` (Note [Calls per collective]).
_current_replica = context.current_replica_context


class ReplicaContext:
    """The API inside `strategy.run`: who this replica is and how it talks to the others.

    Example:
        >>> import nbdist as nd
        >>> ctx = nd.get_replica_context()  # the default replica context, outside any scope
        >>> ctx.replica_id_in_sync_group, ctx.num_replicas_in_sync
        (0, 1)
    """

    def __init__(self, strategy: Any, replica_id_in_sync_group: int, local_replica_index: int):
        self._strategy = strategy
        self._replica_id = replica_id_in_sync_group
        self.local_replica_index = local_replica_index

    @property
    def strategy(self) -> Any:  # a `Strategy`
        """The strategy this replica belongs to."""
        return self._strategy

    @property
    def replica_id_in_sync_group(self) -> int:
        """This replica's id, 0..num_replicas_in_sync-1 (== rank for one replica a process)."""
        return self._replica_id

    @property
    def num_replicas_in_sync(self) -> int:
        """How many replicas take part."""
        return self._strategy.num_replicas_in_sync

    @property
    def devices(self) -> tuple[str, ...]:
        """The device(s) this replica computes on."""
        return (self._strategy.extended.worker_devices[self.local_replica_index],)

    @collective_between_graphs
    def all_reduce(self, reduce_op: ReduceOp | str, value: Any, options: Any = None) -> Any:
        """Every replica gets the reduction of all replicas' `value` (any nested structure).

        Context: replica (inside `strategy.run`). Hangs if: not every replica calls it; it
        then fails after the collective timeout naming the replicas that did not arrive.

        Example:
            >>> import torch
            >>> import nbdist as nd
            >>> s = nd.MirroredStrategy(["cpu:0", "cpu:1"])
            >>> s.run(lambda: nd.get_replica_context().all_reduce("sum", torch.tensor(1.0)))
            PerReplica:{0: tensor(2.), 1: tensor(2.)}
        """
        if _current_replica() is not self or not self._strategy.changes_context:
            self._require_current("all_reduce")
        # The op without a call when seen before (Note [Calls per collective]).
        op = RESOLVED_OPS.get(reduce_op) if type(reduce_op) in _OP_TYPES else None
        if op is None:
            op = ReduceOp.from_value(reduce_op)
        return self._strategy._replica_all_reduce(self, op, value, options)

    @collective_between_graphs
    def all_gather(self, value: Any, axis: int, options: Any = None) -> Any:
        """Every replica gets all replicas' `value` concatenated along `axis`, in replica order.

        Context: replica. Hangs if: not every replica calls it (fails after the timeout).
        """
        if type(axis) is bool:  # `axis=True` is not axis 1
            from nbdist.core.reduce.rules import check_axis_argument

            check_axis_argument(axis, "all_gather", optional=False)
        if _current_replica() is not self or not self._strategy.changes_context:
            self._require_current("all_gather")
        return self._strategy._replica_all_gather(self, value, axis, options)

    @collective_between_graphs
    def merge_call(
        self,
        merge_fn: Callable[..., Any],
        args: Sequence[Any] = (),
        kwargs: dict[str, Any] | None = None,
    ) -> Any:
        """Pause every replica and run `merge_fn(strategy, *args)` once in cross-replica context.

        Arguments are merged into `PerReplica` values (or passed as themselves when every
        replica passed the identical object); the result goes back to every replica,
        unwrapped to its component. `merge_fn` may not call `run` or a replica context's
        collectives (every replica waits in `merge_call` meanwhile): `ContextError` at once;
        combine its arguments with `strategy.reduce` or `strategy.extended.reduce_to`.

        Context: replica. Hangs if: not every replica calls it, or `merge_fn` never returns
        (the other replicas fail after the timeout).
        """
        if not callable(merge_fn):
            raise ArgumentTypeError(f"merge_call needs a function, got {merge_fn!r}.")
        if _current_replica() is not self or not self._strategy.changes_context:
            self._require_current("merge_call")
        return self._strategy._replica_merge_call(self, merge_fn, tuple(args), dict(kwargs or {}))

    def _require_current(self, what: str) -> None:
        """Refuse a collective called where this replica context is not the caller's (as
        TensorFlow's `require_replica_context`): it could never be matched, so it would wait
        until the timeout or pair with the wrong call. Also refuse the default context's
        collectives in a thread started inside an in-process replica function (Note [Threads
        started in a replica] in `nbdist.core.context`)."""
        current = _current_replica()
        default = not self._strategy.changes_context
        if current is self or (default and current is None and not context.in_merge_call()):
            if default:
                running = context.run_started_before(threading.current_thread())
                if running is not None:
                    raise ContextError(
                        f"ReplicaContext.{what} was called on the default replica context in "
                        f"thread {threading.current_thread().name!r}, which was started while "
                        f"{type(running).__name__}.run was running (inside a replica "
                        "function). A thread does not inherit its replica's context, so this "
                        f"{what} would only see the thread's own value. Call {what} in the "
                        "replica function's own thread: hand the thread's result back to it "
                        "(e.g. join the thread) and reduce it there."
                    )
            return
        fix = f"nd.get_replica_context().{what}(...)"
        if current is None and context.in_merge_call():
            raise ContextError(
                f"ReplicaContext.{what} was called inside a merge_call function (merge_fn), on "
                "a replica context captured outside it. merge_fn runs once, in cross-replica "
                "context, while every replica waits in merge_call, so no replica could join "
                f"this {what}. In merge_fn combine its PerReplica arguments with "
                "strategy.reduce or strategy.extended.reduce_to; or call "
                f"{what} in the replica function, before or after merge_call."
            )
        if current is None:
            raise ContextError(
                f"ReplicaContext.{what} of replica {self._replica_id} was called outside the "
                "strategy.run that made this context: after run returned, in cross-replica "
                "context, or in a thread started inside the replica function (threads do not "
                f"inherit the replica's context). Call {fix} in the replica function's own "
                "thread, while run runs."
            )
        if current.strategy is self._strategy:
            raise ContextError(
                f"ReplicaContext.{what} of replica {self._replica_id} was called from replica "
                f"{current.replica_id_in_sync_group}'s function (or another strategy.run). Each "
                f"replica calls collectives on its own context: {fix}."
            )
        raise ContextError(
            f"ReplicaContext.{what} of a {type(self._strategy).__name__} replica was called "
            f"inside {type(current.strategy).__name__}.run. Call collectives on the running "
            f"strategy's context: {fix}."
        )

    def __repr__(self) -> str:
        return (
            f"ReplicaContext(replica_id_in_sync_group={self._replica_id}, "
            f"num_replicas_in_sync={self.num_replicas_in_sync})"
        )
