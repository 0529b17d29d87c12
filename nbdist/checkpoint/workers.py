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

Imports nbdist.core.context, nbdist.errors and nbdist.strategies.

Example:
    >>> workers = Workers.for_objects({})
    >>> workers.count, workers.is_writer
    (1, True)
"""

from __future__ import annotations

from typing import Any

import torch

from nbdist import errors
from nbdist.core import context
from nbdist.core.variables import DistributedVariable
from nbdist.errors import CheckpointError
from nbdist.strategies.multi_worker import live_multi_worker_strategy

__all__ = ["Workers", "position_disagreement"]

_ROW = 2048  # bytes per worker's outcome: the error's class name and message
_POSITIONS = 32  # distributed iterators per save whose positions are compared across workers


class Workers:
    """The workers taking part in one checkpoint save or restore."""

    def __init__(self, strategy: Any | None):
        self.strategy = strategy
        # Strategies that are no `Strategy` (a parameter-server worker's) have one worker.
        placement = getattr(getattr(strategy, "extended", None), "placement", None)
        self.count = placement.num_workers if placement is not None else 1
        self.index = placement.worker_index if placement is not None else 0

    @classmethod
    def for_objects(cls, objects: dict[str, Any]) -> Workers:
        """The workers of the current strategy (of `run` or `scope()`), else of the objects'
        strategy, else of this process's multi-worker strategy (a `%%distribute` cell outside
        `scope()`)."""
        replica = context.current_replica_context()
        strategy = replica.strategy if replica is not None else context.current_scope_strategy()
        if strategy is None:
            owners = [
                o.distribute_strategy
                for o in objects.values()
                if isinstance(o, DistributedVariable)
            ]  # fmt: skip
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
            raise self._absent(what, lost, every="", after=done) from lost
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

    def _absent(self, what: str, lost: BaseException, *, every: str, after: str) -> CheckpointError:
        """The error for a gather that another worker did not join (`lost`: it never came,
        died, or did something else); `every` and `after` finish the fix it names."""
        missing = list(getattr(lost, "missing", ()))
        who = f"worker(s) {missing}" if missing else "another worker"
        return CheckpointError(
            f"{what} on worker {self.index} of {self.count} failed: {who} did not take "
            f"part. Call nd.checkpoint.save and restore on every worker{every}, not only where "
            f"strategy.extended.should_checkpoint is True: one worker writes, the others "
            f"wait until the file is complete.{after} ({type(lost).__name__}: {lost})"
        )

    def check_positions(self, positions: dict[str, tuple[int, int | None]], what: str) -> None:
        """Raise `CheckpointError` on every worker when a distributed iterator of this save
        has given different numbers of batches on different workers.

        Why: a checkpoint holds one position per iterator (Note [Checkpoint file]); saved
        while worker 1 is a batch behind worker 0, worker 1 would skip its share of that batch
        after a restore. Every worker must call it (one small all-gather of the positions).
        `positions`: `{name: (batches, examples or None)}` of this worker's iterators; none
        (a save without iterators, the same on every worker): nothing to compare, no gather.
        """
        if self.count <= 1 or not positions:
            return
        names = sorted(positions)[:_POSITIONS]
        row = torch.full((1, 2 * _POSITIONS), -2, dtype=torch.int64)
        for slot, name in enumerate(names):
            batches, examples = positions[name]
            row[0, 2 * slot] = batches
            row[0, 2 * slot + 1] = -1 if examples is None else examples
        try:
            rows = self.strategy.extended.gather_across_workers(row, 0)
        except errors.NbdistError as lost:
            raise self._absent(
                what, lost, every=" with the same objects", after=" Nothing was written."
            ) from lost
        message = position_disagreement(names, rows.tolist())
        if message is not None:
            raise CheckpointError(f"{what} was refused: {message}")


def position_disagreement(names: list[str], rows: list[list[int]]) -> str | None:
    """What is wrong when the workers' iterator positions differ, else None.

    `rows[w]` is worker `w`'s row of `check_positions`: per iterator (in the order of
    `names`), the batches it has given and the examples in them (-1: unknown).

    Example:
        >>> print(position_disagreement(["it"], [[3, 24], [3, 24]]))
        None
        >>> position_disagreement(["it"], [[3, 24], [2, 16]])[:59]
        "the distributed iterator 'it' is at different positions on "
    """
    for slot, name in enumerate(names):
        taken = [row[2 * slot] for row in rows]
        if len(set(taken)) <= 1:
            continue
        where = ", ".join(
            f"worker {w}: {row[2 * slot]} batches"
            + (f" ({row[2 * slot + 1]} examples)" if row[2 * slot + 1] >= 0 else "")
            for w, row in enumerate(rows)
        )
        behind = [w for w, batches in enumerate(taken) if batches < max(taken)]
        return (
            f"the distributed iterator {name!r} is at different positions on the workers "
            f"({where}). A checkpoint holds one position, so after a restore worker(s) "
            f"{behind} would skip their share of the batches they have not taken. Save at a "
            f"step boundary where every worker has taken the same number of batches from "
            f"{name!r} (call next() on it the same number of times on every worker)."
        )
    return None
