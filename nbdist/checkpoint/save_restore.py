"""`save`, `restore` and `read`: named objects to one checkpoint file and back.

Every worker calls `save` and `restore` with the same names; one writes (Note [One writer,
every worker told] in nbdist.checkpoint.workers), each reads. A restore checks every object
against the checkpoint before it changes any, so a checkpoint that does not fit leaves every
object as it was. Imports the other nbdist.checkpoint modules and nbdist.core.context.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable
from typing import Any, TypeVar

from nbdist.checkpoint import sharded
from nbdist.checkpoint.fileformat import load, payload, write_atomic
from nbdist.checkpoint.objects import apply, capture, check
from nbdist.checkpoint.workers import Workers
from nbdist.core import context
from nbdist.errors import CheckpointError, CheckpointMismatchError, CheckpointTypeError
from nbdist.input import DistributedIterator

__all__ = ["read", "restore", "save"]

_F = TypeVar("_F", bound=Callable[..., Any])


def _public(fn: _F) -> _F:
    """Raise checkpoint errors from the public function itself: the user's traceback shows
    their call and this one line, not the checks inside nbdist (the cause stays chained)."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except CheckpointError as error:
            raise error.with_traceback(None) from error.__cause__

    return wrapper  # type: ignore[return-value]


@_public
def save(path: str | os.PathLike[str], /, **objects: Any) -> str:
    """Save named objects to one checkpoint file, written once and atomically.

    Modules and optimizers save their `state_dict()`; an `nd.Variable` its cross-replica
    value (a sync-on-read variable's aggregate: SUM, MEAN or the first replica's, docs/api.md §5);
    a distributed iterator its position in global batches and examples, so the run can resume
    on another number of replicas; tensors, `torch.Generator`s, dicts of plain values (e.g.
    `progress={"epoch": 3}`) and any object with `state_dict`/`load_state_dict` (LR
    schedulers) are saved too. Call it outside `strategy.run`, or inside it on every replica
    (the replicas then wait while it runs once: one consistent checkpoint). With several
    workers (a script under torchrun, `%%distribute` engines) call it on every worker: the
    worker whose `strategy.extended.should_checkpoint` is True writes, and every worker
    returns only once the file is complete, or raises the same error.

    Args:
        path: The file to write. It is replaced atomically: a reader sees the previous
            checkpoint or this one, never part of one. A missing directory is created (by the
            writing worker), as TensorFlow's `Checkpoint.write` does.
        **objects: The objects to save, each under the name you will restore it by.

    Returns:
        `path`, as a string.

    Raises:
        CheckpointError: the path cannot be written (a directory that cannot be created, a
            read-only directory, a file in the way, a full disk), named with the fix; any
            earlier file there is kept.
        CheckpointTypeError: an object that cannot be checkpointed, or nothing to save.

    Example:
        >>> import os, tempfile, torch, nbdist as nd
        >>> model = torch.nn.Linear(2, 1)
        >>> path = nd.checkpoint.save(os.path.join(tempfile.mkdtemp(), "ckpt.pt"), model=model)
        >>> sorted(nd.checkpoint.read(path)["model"])
        ['bias', 'weight']
    """
    where = _path(path, "save")
    _named(objects, "save", "nd.checkpoint.save(path, model=model, optimizer=optimizer)")
    if _in_replica_threads():
        return _once_for_the_replicas("save", _save, where, objects)
    return _save(where, **objects)


def _save(where: str, **objects: Any) -> str:
    return save_objects(where, objects)


def save_objects(
    where: str,
    objects: dict[str, Any],
    *,
    metadata: dict[str, Any] | None = None,
    after_write: Callable[[Workers], None] | None = None,
) -> str:
    """Save `objects` to `where` on every worker (one writes); `metadata` joins the file's
    header; the writer calls `after_write(workers)` once the file is complete, before any
    worker returns (a `CheckpointManager` records its state and deletes old files there), and
    its error is every worker's error."""
    workers = Workers.for_objects(objects)
    sharded.point_at_shards(objects)
    if any(sharded.is_sharded_object(obj) for obj in objects.values()):
        workers.check_positions(_positions(objects), f"Saving checkpoint {where!r}")
        return sharded.save_sharded(  # Note [Sharded checkpoints]
            where, objects, workers, metadata=metadata, after_write=after_write
        )
    error: BaseException | None = None
    try:
        workers.check_positions(_positions(objects), f"Saving checkpoint {where!r}")
        entries = {name: capture(name, obj) for name, obj in objects.items()}
        if workers.is_writer:
            replicas = getattr(workers.strategy, "num_replicas_in_sync", 1)
            write_atomic(
                where,
                payload(
                    entries,
                    num_replicas_in_sync=replicas,
                    num_workers=workers.count,
                    **(metadata or {}),
                ),
            )
            if after_write is not None:
                after_write(workers)
    except Exception as caught:
        error = caught
    wrote = workers.is_writer and error is None
    written = " This worker wrote the file completely." if wrote else ""
    writers = workers.settle(error, f"Saving checkpoint {where!r}", done=written, wrote=wrote)
    if writers == 0:  # every worker thought another one writes: say so, never lose it silently
        raise CheckpointError(
            f"Saving checkpoint {where!r} wrote nothing: no worker of the {workers.count} has "
            f"strategy.extended.should_checkpoint True (this is worker {workers.index}). Save "
            f"with the strategy the workers train with (inside strategy.scope() or run), or "
            f"report this as an nbdist bug."
        )
    return where


@_public
def restore(path: str | os.PathLike[str], /, **objects: Any) -> None:
    """Restore named objects, in place, from a checkpoint written by `save`.

    Give each object under the name it was saved with; names saved but not given are left
    alone. Every object is checked first (another model's parameters, another optimizer, an
    iterator over another dataset), so on error nothing is changed. Mirrored parameters and
    variables get the saved value on every replica; a sync-on-read variable's value is
    written back by its aggregation (SUM: value / replicas on each of them), so it may be
    restored into another number of replicas. A distributed iterator must be fresh
    (`iter(dataset)`, nothing taken yet): it skips the global batches already trained on.
    Call it on every worker, outside `strategy.run` or inside it on every replica.

    Raises:
        CheckpointError: the file is missing, unreadable, truncated ("was not completely
            written") or was not written by `nd.checkpoint.save`; or another worker failed.
        CheckpointMismatchError: the checkpoint does not fit an object, or holds no such name.
        CheckpointTypeError: an object that cannot be restored in place, or nothing given.

    Example:
        >>> import os, tempfile, torch, nbdist as nd
        >>> path = os.path.join(tempfile.mkdtemp(), "ckpt.pt")
        >>> _ = nd.checkpoint.save(path, w=torch.ones(2))
        >>> w = torch.zeros(2); nd.checkpoint.restore(path, w=w); w
        tensor([1., 1.])
    """
    where = _path(path, "restore")
    _named(objects, "restore", "nd.checkpoint.restore(path, model=model, optimizer=optimizer)")
    if _in_replica_threads():
        _once_for_the_replicas("restore", _restore, where, objects)
        return
    _restore(where, **objects)


def _restore(where: str, **objects: Any) -> None:
    restore_objects(where, objects)


def restore_objects(where: str, objects: dict[str, Any]) -> dict[str, Any]:
    """Restore `objects` from `where` on every worker; returns the file's header (its
    metadata, without the objects)."""
    workers = Workers.for_objects(objects)
    sharded.point_at_shards(objects)
    if sharded.is_sharded_checkpoint(where):  # Note [Sharded checkpoints]
        return sharded.restore_sharded(where, objects, workers)
    error: BaseException | None = None
    entries: dict[str, Any] = {}
    header: dict[str, Any] = {}
    try:
        data = load(where)
        entries = data["objects"]
        header = {key: value for key, value in data.items() if key != "objects"}
        absent = [name for name in objects if name not in entries]
        if absent:
            raise CheckpointMismatchError(
                f"Checkpoint {where!r} holds no {', '.join(map(repr, absent))}; it holds "
                f"{', '.join(map(repr, entries)) or 'nothing'}. Restore each object under the "
                f"name it was saved with (the keyword given to nd.checkpoint.save)."
            )
        for name, obj in objects.items():
            check(name, obj, entries[name], where)
    except Exception as caught:
        error = caught
    workers.settle(error, f"Restoring checkpoint {where!r}")
    error = None
    iterators = [name for name in objects if entries[name]["kind"] == "iterator"]
    try:  # iterators last: skipping reads data, after every cheap state is in place
        for name in [n for n in objects if n not in iterators] + iterators:
            if sharded.is_sharded_object(objects[name]):  # saved whole, restored as shards
                sharded.apply_whole(objects[name], entries[name], objects)
            else:
                apply(objects[name], entries[name])
    except Exception as caught:
        error = caught
    if iterators:  # only an iterator's data can still disagree with its checked position
        workers.settle(error, f"Restoring checkpoint {where!r}")
    elif error is not None:
        raise error
    return header


@_public
def read(path: str | os.PathLike[str]) -> dict[str, Any]:
    """The saved states by name, without restoring them: `{name: state}`.

    A module's or optimizer's state is its `state_dict()`, a variable's `{"value": tensor}`,
    an iterator's position (`batches`, `examples`, ...). Useful to inspect a checkpoint or to
    load one part into a new object (`model.load_state_dict(read(path)["model"])`).

    Raises:
        CheckpointError: as `restore` does for the file.

    Example:
        >>> import os, tempfile, torch, nbdist as nd
        >>> path = nd.checkpoint.save(os.path.join(tempfile.mkdtemp(), "c.pt"), step={"n": 7})
        >>> nd.checkpoint.read(path)
        {'step': {'n': 7}}
    """
    where = _path(path, "read")
    if sharded.is_sharded_checkpoint(where):
        raise sharded.unsupported_read(where)
    return {name: entry["state"] for name, entry in load(where)["objects"].items()}


def _path(path: Any, verb: str) -> str:
    if not isinstance(path, (str, os.PathLike)):
        raise CheckpointTypeError(
            f"nd.checkpoint.{verb} takes the checkpoint's file path first (a str or "
            f"os.PathLike), got {type(path).__name__}; e.g. nd.checkpoint.{verb}("
            f"'checkpoints/step-100.pt', model=model)."
        )
    return os.fspath(path)


def _positions(objects: dict[str, Any]) -> dict[str, tuple[int, int | None]]:
    """`{name: (batches, examples)}` of the distributed iterators among `objects`."""
    return {
        name: (obj.position.batches, obj.position.examples)
        for name, obj in objects.items()
        if isinstance(obj, DistributedIterator) and obj.position is not None
    }


def _in_replica_threads() -> bool:
    """True inside `strategy.run` of an in-process strategy with several local replicas."""
    replica = context.current_replica_context()
    return replica is not None and len(replica.strategy.extended.worker_devices) > 1


class _Call:
    """One replica's arguments, kept whole through `merge_call` (not split into leaves)."""

    def __init__(self, where: str, objects: dict[str, Any]):
        self.where, self.objects = where, objects


def _once_for_the_replicas(
    verb: str, fn: Callable[..., Any], where: str, objects: dict[str, Any]
) -> Any:
    """Run `fn(where, **objects)` once, in cross-replica context, while the local replicas
    wait (`merge_call`); every replica gets its result or its error. The replicas hold the
    same state, so they must pass the same path and the same objects."""

    def merged(strategy: Any, calls: Any) -> Any:
        calls = tuple(getattr(calls, "values", (calls,)))
        first = calls[0]
        for other in calls[1:]:
            if (
                other.where != first.where
                or other.objects.keys() != first.objects.keys()
                or any(other.objects[name] is not first.objects[name] for name in first.objects)
            ):
                raise CheckpointError(
                    f"nd.checkpoint.{verb} was called inside strategy.run with different paths "
                    f"or objects on different replicas ({first.where!r} with "
                    f"{sorted(first.objects)} vs {other.where!r} with {sorted(other.objects)}). "
                    f"The replicas hold the same state: pass the same path and objects on every "
                    f"replica, or call it once outside strategy.run."
                )
        result = fn(first.where, **first.objects)
        replicas = strategy.extended.replicas
        if verb == "restore" and replicas is not None:
            replicas.synchronize()  # the other replicas' copies, before they go on in this run
        return result

    replica = context.current_replica_context()
    assert replica is not None
    return replica.merge_call(merged, args=(_Call(where, objects),))


def _named(objects: dict[str, Any], verb: str, example: str) -> None:
    if not objects:
        raise CheckpointTypeError(
            f"nd.checkpoint.{verb} was given no objects; name each one as a keyword argument, "
            f"e.g. {example}."
        )
