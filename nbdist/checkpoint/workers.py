"""Which worker writes a checkpoint, and every worker learning how a save or restore went.

Note [One writer, every worker told]: in a multi-worker strategy every worker calls
`save`/`restore` (sync-on-read variables are aggregated across workers, which is a
collective). Only the worker whose `strategy.extended.should_checkpoint` is True (the first)
writes. Then every worker takes part in one small all-gather of each worker's outcome: it is
the barrier that keeps other workers from reading a half-written file, and it turns an error
on one worker (an unwritable path, a truncated file on one host) into the same error on every
worker, within the strategy's collective timeout; never a hang, never one worker continuing
with other state. In one process (no strategy, or an in-process strategy) the caller is the
only worker.

Imports nbdist.context, nbdist.errors and nbdist.strategies.

Example:
    >>> workers = Workers.for_objects({})
    >>> workers.count, workers.is_writer
    (1, True)
"""

from __future__ import annotations

from typing import Any

import torch

from nbdist import context, errors
from nbdist.errors import CheckpointError
from nbdist.strategies.multi_worker import live_multi_worker_strategy
from nbdist.variables import DistributedVariable

__all__ = ["Workers"]

_ROW = 2048  # bytes per worker's outcome: the error's class name and message


class Workers:
    """The workers taking part in one checkpoint save or restore."""

    def __init__(self, strategy: Any | None):
        self.strategy = strategy
        self.count = int(getattr(strategy, "_num_workers", 1)) if strategy is not None else 1
        self.index = int(getattr(strategy, "_worker_index", 0)) if strategy is not None else 0

    @classmethod
    def for_objects(cls, objects: dict[str, Any]) -> Workers:
        """The workers of the current strategy (of `run` or `scope()`), else of the objects'
        strategy, else of this process's multi-worker strategy (a `%%distribute` cell outside
        `scope()`)."""
        replica = context.current_replica_context()
        strategy = replica.strategy if replica is not None else context.current_scope_strategy()
        if strategy is None:
            owners = [o._strategy for o in objects.values() if isinstance(o, DistributedVariable)]
            strategy = owners[0] if owners else live_multi_worker_strategy()
        return cls(strategy)

    @property
    def is_writer(self) -> bool:
        """True on the one worker that writes (`strategy.extended.should_checkpoint`)."""
        if self.strategy is None:
            return True
        return bool(self.strategy.extended.should_checkpoint)

    def settle(
        self, error: BaseException | None, what: str, *, done: str = "", wrote: bool = False
    ) -> int:
        """Tell every worker each worker's outcome; raise the first failure on all of them.

        A worker that failed re-raises its own error; the others raise the same class with
        the failed worker named. Every worker must call it (Note [One writer, every worker
        told]). `done` is added when another worker did not take part (e.g. "the file was
        written"). `wrote`: this worker wrote the file.

        Returns:
            How many workers wrote the file (each one's `wrote`), so a save that no worker
            wrote is an error rather than a checkpoint silently missing.
        """
        if self.count <= 1:
            if error is not None:
                raise error
            return int(wrote)
        row = torch.zeros(_ROW, dtype=torch.uint8)
        row[0] = 2 if wrote else 0
        if error is not None:
            text = f"{type(error).__name__}\n{error}".encode(errors="replace")[: _ROW - 1]
            row[0] = 1
            row[1 : 1 + len(text)] = torch.frombuffer(bytearray(text), dtype=torch.uint8)
        try:
            rows = self.strategy.extended.gather_across_workers(row.reshape(1, _ROW), 0)
        except errors.NbdistError as lost:  # a worker that never came, died or did otherwise
            if error is not None:
                raise error from lost
            missing = list(getattr(lost, "missing", ()))
            who = f"worker(s) {missing}" if missing else "another worker"
            raise CheckpointError(
                f"{what} on worker {self.index} of {self.count} failed: {who} did not take "
                f"part. Call nd.checkpoint.save and restore on every worker, not only where "
                f"strategy.extended.should_checkpoint is True: one worker writes, the others "
                f"wait until the file is complete.{done} ({type(lost).__name__}: {lost})"
            ) from lost
        failed = [w for w in range(self.count) if int(rows[w, 0]) == 1]
        if not failed:
            return sum(1 for w in range(self.count) if int(rows[w, 0]) == 2)
        if error is not None:
            raise error
        first = failed[0]
        raw = bytes(rows[first, 1:].tolist()).rstrip(b"\0").decode(errors="replace")
        name, _, message = raw.partition("\n")
        kind = getattr(errors, name, None)
        if not (isinstance(kind, type) and issubclass(kind, CheckpointError)):
            kind = CheckpointError
        others = "" if len(failed) == 1 else f" (and on worker(s) {failed[1:]})"
        raise kind(f"{what} failed on worker {first}{others}: {message}")
