"""Where a distributed iterator is in its epoch, saved and restored by checkpoints.

Note [Iterator position]: an iterator over `experimental_distribute_dataset` counts the
*global* batches it has given and the examples (rows) in them. Global batches are the same
whatever the number of replicas (only their split differs), so a position saved on 2 replicas
resumes on 3 by skipping that many global batches of the same input; the example count checks
that the input (and its global batch size) is the one the position was saved with. Pipelines
of `distribute_datasets_from_function` are built per worker or per replica by the user, so
their position (steps taken) only resumes with the same workers and replicas.

Imports nbdist.errors and nbdist.input.errors only.

Example:
    >>> position = Position("global_batches", num_replicas_in_sync=2, num_workers=1)
    >>> position.produced(8); position.delivered()
    >>> position.state_dict()["batches"], position.state_dict()["examples"]
    (1, 8)
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from nbdist.errors import CheckpointMismatchError

__all__ = ["GLOBAL_BATCHES", "Position", "Resume", "skip_global_batches"]

GLOBAL_BATCHES = "global_batches"
"""The kind of position of `experimental_distribute_dataset` (any number of replicas)."""

_VERSION = 1


@dataclass(frozen=True)
class Resume:
    """Where a restored iterator starts: after `batches` global batches holding `examples`."""

    batches: int
    examples: int | None


class Position:
    """Global batches and examples an iterator has given so far (Note [Iterator position]).

    The step generators call `produced(rows)` for each step they make (read ahead of the
    user); the iterator calls `delivered()` for each step it gives.
    """

    def __init__(self, kind: str, *, num_replicas_in_sync: int, num_workers: int):
        self.kind = kind
        self.num_replicas_in_sync = num_replicas_in_sync
        self.num_workers = num_workers
        self.batches = 0
        self.examples: int | None = 0
        self._pending: deque[int | None] = deque()

    def produced(self, rows: int | None) -> None:
        """A step holding `rows` global examples (None: unknown) was read."""
        self._pending.append(rows)

    def delivered(self) -> None:
        """The oldest step read was given to the user."""
        rows = self._pending.popleft() if self._pending else None
        self.batches += 1
        if rows is None or self.examples is None:
            self.examples = None
        else:
            self.examples += rows

    def skipped(self, resume: Resume) -> None:
        """Start counting after a restored position."""
        self.batches, self.examples = resume.batches, resume.examples

    def state_dict(self) -> dict[str, Any]:
        """The position as plain numbers (what checkpoints save)."""
        return {
            "version": _VERSION,
            "kind": self.kind,
            "batches": self.batches,
            "examples": self.examples,
            "num_replicas_in_sync": self.num_replicas_in_sync,
            "num_workers": self.num_workers,
        }

    def resume_from(self, state: Any) -> Resume:
        """Check a saved position against this iterator's kind and topology.

        Raises:
            CheckpointMismatchError: not a position, another kind of dataset, or (for
                `distribute_datasets_from_function`) other numbers of replicas or workers.
        """
        keys = {"version", "kind", "batches", "examples", "num_replicas_in_sync", "num_workers"}
        if not isinstance(state, dict) or not keys <= set(state):
            raise CheckpointMismatchError(
                f"This is not a distributed iterator's state (expected a dict with keys "
                f"{sorted(keys)}, got {_describe(state)}); pass what "
                f"DistributedIterator.state_dict() returned."
            )
        if state["kind"] != self.kind:
            saved = _KINDS.get(state["kind"], state["kind"])
            raise CheckpointMismatchError(
                f"The saved position is of an iterator over {saved}, but this iterator is over "
                f"{_KINDS.get(self.kind, self.kind)}; restore it into an iterator of the same "
                f"kind of distributed dataset."
            )
        same = (state["num_replicas_in_sync"], state["num_workers"]) == (
            self.num_replicas_in_sync,
            self.num_workers,
        )
        if self.kind != GLOBAL_BATCHES and not same:
            raise CheckpointMismatchError(
                f"The saved position of a distribute_datasets_from_function iterator was taken "
                f"with {state['num_replicas_in_sync']} replicas on {state['num_workers']} "
                f"worker(s), this one has {self.num_replicas_in_sync} on {self.num_workers}: "
                f"its pipelines are built per worker or replica, so the position only resumes "
                f"on the same topology. Use experimental_distribute_dataset (global batches) to "
                f"resume on another number of replicas."
            )
        return Resume(int(state["batches"]), state["examples"])


_KINDS = {
    GLOBAL_BATCHES: "global batches (experimental_distribute_dataset)",
    "per_worker": "per-worker pipelines (distribute_datasets_from_function)",
    "per_replica": "per-replica pipelines (distribute_datasets_from_function, PER_REPLICA)",
}


def _describe(value: Any) -> str:
    if isinstance(value, dict):
        return f"a dict with keys {sorted(map(str, value))}"
    return type(value).__name__


def skip_global_batches(batches: Iterator[Any], resume: Resume, rows_of: Any) -> None:
    """Consume the `resume.batches` global batches a restored iterator has already given.

    `rows_of(batch)` is a batch's number of examples (None when it has no batch dimension).

    Raises:
        CheckpointMismatchError: the input ends first, or those batches hold another number
            of examples than the saved run's (another input or global batch size).
    """
    examples: int | None = 0
    for index in range(resume.batches):
        try:
            batch = next(batches)
        except StopIteration:
            raise CheckpointMismatchError(
                f"The restored iterator position is after global batch {resume.batches}, but "
                f"this dataset has only {index} batches in an epoch; restore into an iterator "
                f"over the same dataset the checkpoint was saved with."
            ) from None
        rows = rows_of(batch)
        examples = None if rows is None or examples is None else examples + rows
    check_examples(resume, examples)


def check_examples(resume: Resume, examples: int | None) -> None:
    """Raise when the skipped batches held another number of examples than the saved run's."""
    if resume.examples is not None and examples is not None and examples != resume.examples:
        raise CheckpointMismatchError(
            f"The restored iterator position is after {resume.batches} global batches holding "
            f"{resume.examples} examples, but the first {resume.batches} batches of this "
            f"dataset hold {examples}: the dataset or its global batch size differs from the "
            f"saved run's. Keep the same input and GLOBAL batch size when resuming (on another "
            f"number of replicas each replica then takes a different share of each batch)."
        )
