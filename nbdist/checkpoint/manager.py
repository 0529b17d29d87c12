"""`CheckpointManager`: numbered checkpoints in one directory, the newest few kept (TF's).

Note [Checkpoint manager]: as `tf.train.CheckpointManager`, `save()` writes
`DIRECTORY/ckpt-N` (N: the manager's save counter, counted up by every `save`, or
`checkpoint_number`), records it in the `checkpoint` state file (Note [Checkpoint state
file]) and deletes the oldest checkpoints beyond `max_to_keep`. TF's `tf.train.Checkpoint`
holds a `save_counter` that is saved in every checkpoint and restored with it; nbdist has no
Checkpoint object (the manager is given the objects), so the manager holds the counter,
writes it into each checkpoint's header and puts it back in `restore_or_initialize()`. A new
manager in a directory that already holds checkpoints therefore numbers from 1 until it
restores, as a new `tf.train.Checkpoint` does.

With several workers every worker calls `save` (as with `nd.checkpoint.save`): the writer
(`strategy.extended.should_checkpoint`) writes the checkpoint, the state file and deletes old
checkpoints before any worker returns; every worker keeps the same list in memory. Inside
`strategy.run` of an in-process strategy the replicas wait while it runs once.

Imports the other nbdist.checkpoint modules, nbdist.core.context and nbdist.errors.

Example:
    >>> import os, tempfile, torch
    >>> model = torch.nn.Linear(2, 1)
    >>> manager = CheckpointManager(os.path.join(tempfile.mkdtemp(), "run"), max_to_keep=2,
    ...                             model=model)
    >>> [os.path.basename(manager.save()) for _ in range(3)]
    ['ckpt-1', 'ckpt-2', 'ckpt-3']
    >>> [os.path.basename(p) for p in manager.checkpoints]
    ['ckpt-2', 'ckpt-3']
"""

from __future__ import annotations

import collections
import contextlib
import os
import shutil
import time
import warnings
from collections.abc import Callable
from typing import Any

from nbdist.checkpoint.fileformat import file_in_the_way
from nbdist.checkpoint.save_restore import (
    _in_replica_threads,
    _named,
    _public,
    restore_objects,
    save_objects,
)
from nbdist.checkpoint.state_file import CheckpointState, read_state, write_state
from nbdist.checkpoint.workers import Workers
from nbdist.core import context
from nbdist.errors import (
    ArgumentTypeError,
    CheckpointError,
    CheckpointStateWarning,
    InvalidArgumentError,
)

__all__ = ["CheckpointManager", "latest_checkpoint"]

_COUNTER = "save_counter"  # the header key holding the manager's counter in each checkpoint


class CheckpointManager:
    """Numbered checkpoints of named objects in `directory`, keeping the newest `max_to_keep`.

    TensorFlow's `tf.train.CheckpointManager(checkpoint, directory, max_to_keep, ...)` with
    the objects given by name instead of a `tf.train.Checkpoint` (as `nd.checkpoint.save`
    takes them). `save()` writes `directory/ckpt-1`, `ckpt-2`, ... (one file each, the format
    of `nd.checkpoint.save`), creating the directory; a text file `directory/checkpoint`
    records the managed checkpoints in TF's format, so a manager made later in the same
    directory (after a restart) knows them. Call every method on every worker.

    Args:
        directory: Where the checkpoints and the `checkpoint` state file go (created by the
            first `save`).
        max_to_keep: How many checkpoints to keep (oldest deleted first); None keeps all.
        checkpoint_name: The files' prefix (`ckpt` → `ckpt-3`).
        keep_checkpoint_every_n_hours: A checkpoint leaving the kept set is preserved (not
            deleted, no longer listed) when this many hours passed since the last preserved
            one; None preserves none (TF's).
        init_fn: Called by `restore_or_initialize()` when there is no checkpoint yet.
        step_counter: With `checkpoint_interval`: a step count (an int-valued tensor,
            `nd.Variable` or anything `int()` accepts) read at each `save`.
        checkpoint_interval: `save()` writes only when `step_counter` advanced this many steps
            since the last checkpoint (TF's).
        **objects: The objects to checkpoint, by name (modules, optimizers, `nd.Variable`s,
            distributed iterators, tensors, dicts; see `nd.checkpoint.save`).

    Raises:
        InvalidArgumentError: `max_to_keep` not positive; `checkpoint_interval` without
            `step_counter`; an empty `checkpoint_name` or one with a path separator.
        CheckpointError: `directory` can never be a directory (a file is in the way).
        CheckpointTypeError: no objects.

    Example:
        >>> import os, tempfile, torch, nbdist as nd
        >>> folder = os.path.join(tempfile.mkdtemp(), "ckpts")
        >>> model = torch.nn.Linear(2, 1)
        >>> manager = nd.checkpoint.CheckpointManager(folder, max_to_keep=3, model=model)
        >>> manager.restore_or_initialize() is None      # nothing saved yet
        True
        >>> os.path.basename(manager.save())
        'ckpt-1'
        >>> again = nd.checkpoint.CheckpointManager(folder, model=model)   # after a restart
        >>> again.restore_or_initialize() == manager.latest_checkpoint
        True
        >>> os.path.basename(again.save())
        'ckpt-2'
    """

    def __init__(
        self,
        directory: str | os.PathLike[str],
        max_to_keep: int | None = 5,
        checkpoint_name: str = "ckpt",
        *,
        keep_checkpoint_every_n_hours: float | None = None,
        init_fn: Callable[[], Any] | None = None,
        step_counter: Any = None,
        checkpoint_interval: int | None = None,
        **objects: Any,
    ):
        if not isinstance(directory, (str, os.PathLike)):
            raise ArgumentTypeError(
                f"CheckpointManager takes the checkpoints' directory first (a str or "
                f"os.PathLike), got {type(directory).__name__}; e.g. "
                f"nd.checkpoint.CheckpointManager('checkpoints', model=model)."
            )
        _named(objects, "CheckpointManager", "nd.checkpoint.CheckpointManager(directory, "
               "model=model, optimizer=optimizer)")  # fmt: skip
        self._max_to_keep = _count("max_to_keep", max_to_keep, "max_to_keep=5 (None keeps all)")
        if (
            not isinstance(checkpoint_name, str)
            or not checkpoint_name
            or os.sep in (checkpoint_name)
        ):
            raise InvalidArgumentError(
                f"checkpoint_name must be a file name prefix such as 'ckpt' (no directory), "
                f"got {checkpoint_name!r}; put directories in `directory`."
            )
        if keep_checkpoint_every_n_hours is not None and (
            isinstance(keep_checkpoint_every_n_hours, bool)
            or not isinstance(keep_checkpoint_every_n_hours, (int, float))
            or not keep_checkpoint_every_n_hours > 0
        ):
            raise InvalidArgumentError(
                f"keep_checkpoint_every_n_hours must be a positive number of hours or None, "
                f"got {keep_checkpoint_every_n_hours!r}."
            )
        if init_fn is not None and not callable(init_fn):
            raise ArgumentTypeError(f"init_fn must be callable or None, got {init_fn!r}.")
        self._checkpoint_interval = _count(
            "checkpoint_interval", checkpoint_interval, "checkpoint_interval=100"
        )
        if self._checkpoint_interval is not None and step_counter is None:
            raise InvalidArgumentError(
                "checkpoint_interval needs step_counter (the step count it is measured in); "
                "pass e.g. step_counter=step, an int-valued nd.Variable you count up."
            )
        self._directory = os.fspath(directory)
        _refuse_file_in_the_way(self._directory)
        self._objects = objects
        self._keep_hours = keep_checkpoint_every_n_hours
        self._init_fn = init_fn
        self._step_counter = step_counter
        self._last_checkpoint_step: int | None = None
        self._prefix = os.path.join(self._directory, checkpoint_name)
        self._save_counter = 0
        now = time.time()
        self._maybe_delete: collections.OrderedDict[str, float] = collections.OrderedDict()
        recovered = read_state(self._directory)
        if recovered is None:
            self._latest: str | None = None
            self._last_preserved = now - 1.0  # TF's: a manager made at once again still sweeps
            return
        self._latest = recovered.model_checkpoint_path
        self._last_preserved = min(recovered.last_preserved_timestamp, now)
        stamps = recovered.all_model_checkpoint_timestamps or [self._last_preserved] * len(
            recovered.all_model_checkpoint_paths
        )
        for path, stamp in zip(recovered.all_model_checkpoint_paths, stamps):
            stamp = min(stamp, now)
            if stamp > self._last_preserved:
                self._maybe_delete[path] = stamp

    # -- what TF's manager tells ------------------------------------------------------------
    @property
    def directory(self) -> str:
        """The directory given to the constructor."""
        return self._directory

    @property
    def latest_checkpoint(self) -> str | None:
        """The path of the newest checkpoint (`directory/ckpt-N`), or None before any.

        Pass it to `nd.checkpoint.restore(path, **objects)`, or call `restore_or_initialize()`.
        """
        return self._latest

    @property
    def checkpoints(self) -> list[str]:
        """The managed checkpoints' paths, oldest first (those preserved by
        `keep_checkpoint_every_n_hours` are no longer listed, as in TF)."""
        return list(self._maybe_delete)

    @property
    def checkpoint_interval(self) -> int | None:
        """The minimum number of steps between checkpoints, or None."""
        return self._checkpoint_interval

    @property
    def save_counter(self) -> int:
        """How many times `save` wrote (TF's `Checkpoint.save_counter`): numbers the next
        checkpoint when `save` gets no `checkpoint_number`; restored by
        `restore_or_initialize()`."""
        return self._save_counter

    # -- saving and restoring ---------------------------------------------------------------
    @_public
    def save(self, checkpoint_number: Any = None, check_interval: bool = True) -> str | None:
        """Write a new checkpoint, record it and delete the oldest beyond `max_to_keep`.

        Args:
            checkpoint_number: The checkpoint's number (an int, or an int-valued tensor or
                `nd.Variable` such as a step count); default: the save counter, which counts
                up with every save either way.
            check_interval: With `checkpoint_interval`: False saves even before the interval
                has passed (never twice at one step).

        Returns:
            The new checkpoint's path, or None when `checkpoint_interval` skipped it.

        Raises:
            CheckpointError: the directory cannot be created or written (named, with the fix),
                on every worker; the manager's list is unchanged.
        """
        if _in_replica_threads():
            replica = context.current_replica_context()
            assert replica is not None
            return replica.merge_call(  # once, while the local replicas wait
                lambda strategy: self._save(checkpoint_number, check_interval)
            )
        return self._save(checkpoint_number, check_interval)

    def _save(self, checkpoint_number: Any, check_interval: bool) -> str | None:
        step = None
        if self._checkpoint_interval is not None:
            step = _as_int("step_counter", self._step_counter)
            last = self._last_checkpoint_step
            if last is not None and (
                step == last or (check_interval and step < last + self._checkpoint_interval)
            ):
                return None
        counter = self._save_counter + 1
        number = (
            counter
            if checkpoint_number is None
            else _as_int("checkpoint_number", checkpoint_number)
        )
        path = f"{self._prefix}-{number}"
        kept = collections.OrderedDict(self._maybe_delete)
        kept.pop(path, None)  # saved again: it becomes the newest
        kept[path] = time.time()
        doomed, preserved = self._sweep(kept)

        def record(workers: Workers) -> None:  # the writer only, once the file is complete
            self._record(path, kept, preserved)  # first with the new one: a crash keeps it
            for old in doomed:
                if os.path.isdir(old):  # a sharded checkpoint (nbdist.checkpoint.sharded)
                    shutil.rmtree(old, ignore_errors=True)
                with contextlib.suppress(FileNotFoundError, IsADirectoryError):
                    os.unlink(old)
            self._record(path, kept, preserved)

        save_objects(path, self._objects, metadata={_COUNTER: counter}, after_write=record)
        self._save_counter = counter
        self._maybe_delete, self._last_preserved, self._latest = kept, preserved, path
        if step is not None:
            self._last_checkpoint_step = step
        return path

    def _sweep(self, kept: collections.OrderedDict[str, float]) -> tuple[list[str], float]:
        """Pop the oldest beyond `max_to_keep` from `kept`: those to delete, and the new
        last-preserved time (TF's `_sweep`)."""
        doomed: list[str] = []
        preserved = self._last_preserved
        if not self._max_to_keep:
            return doomed, preserved
        while len(kept) > self._max_to_keep:
            path, stamp = kept.popitem(last=False)
            if self._keep_hours and stamp - self._keep_hours * 3600.0 >= preserved:
                preserved = stamp  # kept on disk for good, no longer managed
                continue
            doomed.append(path)
        return doomed, preserved

    def _record(
        self, latest: str, kept: collections.OrderedDict[str, float], preserved: float
    ) -> None:
        write_state(
            self._directory,
            CheckpointState(latest, list(kept), list(kept.values()), preserved),
        )

    @_public
    def restore_or_initialize(self) -> str | None:
        """Restore the objects from the newest checkpoint, or initialise them.

        With a checkpoint, restores every object and the save counter from it (so the next
        `save` continues the numbering) and returns its path; without one calls `init_fn`
        (if given) and returns None. Call it on every worker.

        Raises:
            CheckpointError, CheckpointMismatchError: as `nd.checkpoint.restore` (a missing or
                foreign file, another model), on every worker; nothing is changed.
        """
        if _in_replica_threads():
            replica = context.current_replica_context()
            assert replica is not None
            return replica.merge_call(lambda strategy: self._restore_or_initialize())
        return self._restore_or_initialize()

    def _restore_or_initialize(self) -> str | None:
        if self._latest is not None:
            header = restore_objects(self._latest, self._objects)
            counter = header.get(_COUNTER)
            if isinstance(counter, int):
                self._save_counter = counter
            if self._checkpoint_interval is not None:
                self._last_checkpoint_step = _as_int("step_counter", self._step_counter)
            return self._latest
        if self._init_fn is not None:
            self._init_fn()
        return None

    def __repr__(self) -> str:
        return (
            f"CheckpointManager({self._directory!r}, max_to_keep={self._max_to_keep}, "
            f"objects={sorted(self._objects)}, latest={self._latest!r})"
        )


@_public
def latest_checkpoint(checkpoint_dir: str | os.PathLike[str]) -> str | None:
    """The newest checkpoint a `CheckpointManager` recorded in `checkpoint_dir`, or None
    (no state file, or its newest file is gone), as `tf.train.latest_checkpoint`.

    Example:
        >>> import tempfile, nbdist as nd
        >>> nd.checkpoint.latest_checkpoint(tempfile.mkdtemp()) is None
        True
    """
    directory = os.fspath(checkpoint_dir)
    state = read_state(directory)
    if state is None:
        return None
    if not os.path.isfile(state.model_checkpoint_path):
        warnings.warn(
            f"The state file in {directory!r} names {state.model_checkpoint_path!r}, which does "
            f"not exist; no checkpoint is returned.",
            CheckpointStateWarning,
            stacklevel=3,
        )
        return None
    return state.model_checkpoint_path


def _count(name: str, value: Any, example: str) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise ArgumentTypeError(f"{name} must be a whole number or None, got {value!r}; e.g. "
                                f"{example}.")  # fmt: skip
    if value <= 0:
        raise InvalidArgumentError(
            f"Expected a positive integer or None for {name}, got {value}; e.g. {example}."
        )
    return value


def _as_int(name: str, value: Any) -> int:
    """`value` (an int, or an int-valued tensor or `nd.Variable`) as an int."""
    refused = ArgumentTypeError(
        f"{name} must be a whole number (an int, or an int-valued tensor or nd.Variable), "
        f"got {value!r}."
    )
    if isinstance(value, bool):
        raise refused
    try:
        whole = int(value)
        exact = float(value) == whole
    except (TypeError, ValueError, RuntimeError) as error:
        raise refused from error
    if not exact:
        raise InvalidArgumentError(f"{name} must be a whole number, got {value!r}.")
    return whole


def _refuse_file_in_the_way(directory: str) -> None:
    """A directory below an existing file can never hold checkpoints: say so now, not as an
    empty directory that `restore_or_initialize` silently initialises from."""
    path = file_in_the_way(directory)
    if path is not None:
        raise CheckpointError(
            f"CheckpointManager cannot use {directory!r}: {path!r} is a file, not a directory, "
            f"so no checkpoint can be written there or found. Give a directory path (e.g. "
            f"{os.path.join(os.path.dirname(path), 'checkpoints')!r}) or move that file away."
        )
