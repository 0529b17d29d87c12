"""The checkpoint file: one `torch.save` archive with a format header, written atomically.

Note [Checkpoint file]: everything nbdist checkpoints is replicated (mirrored parameters,
optimizer state, aggregated variables, one iterator position), so one worker writes one file
with `torch.save`: `{"format": FORMAT, "version": VERSION, ..., "objects": {name: entry}}`.
It is written to a temporary file in the target's directory, flushed to disk, then renamed
over the target (`os.replace`), so a reader sees the old file or the new one, never half of
one. It is read with `torch.load(weights_only=True)`: loading a checkpoint runs no code.
`torch.distributed.checkpoint` is not used: it shards state over ranks and writes a directory
of files, which buys nothing when every rank holds the same state and makes the checkpoint
depend on the number of ranks that wrote it.

Imports nbdist.errors only.

Example:
    >>> import os, tempfile
    >>> path = os.path.join(tempfile.mkdtemp(), "ckpt.pt")
    >>> write_atomic(path, payload({"step": {"kind": "dict", "state": {"n": 3}}}))
    >>> load(path)["objects"]["step"]["state"]
    {'n': 3}
"""

from __future__ import annotations

import contextlib
import os
import pickle
import tempfile
import time
import zipfile
from typing import Any

import torch

from nbdist.errors import CheckpointError

__all__ = ["FORMAT", "VERSION", "load", "payload", "write_atomic"]

FORMAT = "nbdist.checkpoint"
"""The value of the `format` key that marks a file written by `nd.checkpoint.save`."""

VERSION = 1
"""The layout version written; a reader refuses newer ones."""

_ZIP_MAGIC = b"PK\x03\x04"


def payload(objects: dict[str, Any], **metadata: Any) -> dict[str, Any]:
    """The dict written to the file: the header, `metadata` and the objects' entries."""
    return {
        "format": FORMAT,
        "version": VERSION,
        "torch_version": str(torch.__version__),
        "created": time.time(),
        **metadata,
        "objects": objects,
    }


def write_atomic(path: str | os.PathLike[str], data: dict[str, Any]) -> None:
    """Write `data` to `path` with `torch.save`: temporary file, fsync, then `os.replace`.

    The file is readable by its owner only (as a temporary file is made). On any failure the
    temporary file is removed and an existing checkpoint at `path` is left as it was.

    A missing directory is created, parents included, as TensorFlow's `Checkpoint.write`
    creates the directory of its prefix.

    Raises:
        CheckpointError: the directory cannot be created or is not writable, `path` is a
            directory, the disk is full, or `data` cannot be pickled; the message names the fix.
    """
    target = os.path.abspath(os.path.expanduser(os.fspath(path)))
    folder = os.path.dirname(target)
    if os.path.isdir(target):
        raise CheckpointError(
            f"Cannot write checkpoint {os.fspath(path)!r}: it is a directory. Give a file path "
            f"inside it, e.g. {os.path.join(os.fspath(path), 'checkpoint.pt')!r}."
        )
    _make_directory(folder, os.fspath(path))
    try:
        handle, temporary = tempfile.mkstemp(
            dir=folder, prefix=f".{os.path.basename(target)}.", suffix=".tmp"
        )
    except OSError as error:
        raise CheckpointError(
            f"Cannot write checkpoint {os.fspath(path)!r}: the directory {folder!r} is not "
            f"writable ({error.strerror or error}). Choose a path in a directory you can write "
            f"to, or fix its permissions."
        ) from error
    try:
        with os.fdopen(handle, "wb") as file:
            torch.save(data, file)
            file.flush()
            os.fsync(file.fileno())
        os.replace(temporary, target)
    except BaseException as error:
        with contextlib.suppress(OSError):
            os.unlink(temporary)
        if isinstance(error, OSError):
            raise CheckpointError(
                f"Cannot write checkpoint {os.fspath(path)!r}: {error.strerror or error}. Free "
                f"space or choose another path; any earlier checkpoint there is unchanged."
            ) from error
        if isinstance(error, (pickle.PicklingError, TypeError, AttributeError)):
            raise CheckpointError(
                f"Cannot write checkpoint {os.fspath(path)!r}: a state could not be saved "
                f"({type(error).__name__}: {error}). Checkpoint modules, optimizers, nd.Variables, "
                f"tensors, distributed iterators and dicts of plain values."
            ) from error
        raise
    _sync_directory(folder)


def file_in_the_way(folder: str) -> str | None:
    """The nearest existing ancestor of `folder` (or `folder` itself) when it is a file, not
    a directory: then `folder` can never be created. None otherwise.

    Example:
        >>> file_in_the_way("/") is None
        True
    """
    path = os.path.abspath(folder)
    while path and not os.path.exists(path) and os.path.dirname(path) != path:
        path = os.path.dirname(path)
    return path if os.path.exists(path) and not os.path.isdir(path) else None


def _make_directory(folder: str, path: str) -> None:
    """Create `folder` (and its parents) unless it exists; refuse a file in the way."""
    if os.path.isdir(folder):
        return
    blocker = file_in_the_way(folder)
    if blocker is not None:
        raise CheckpointError(
            f"Cannot write checkpoint {path!r}: {blocker!r} is a file, not a directory, so the "
            f"directory {folder!r} cannot be created. Choose a path whose folders are "
            f"directories (or move that file away)."
        )
    try:
        os.makedirs(folder, exist_ok=True)
    except OSError as error:
        raise CheckpointError(
            f"Cannot write checkpoint {path!r}: its directory {folder!r} cannot be created "
            f"({error.strerror or error}). Choose a path in a directory you can write to, or "
            f"create the directory with the right permissions."
        ) from error


def load(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Read a checkpoint written by `write_atomic`, on the CPU.

    Raises:
        CheckpointError: the file is missing, unreadable, truncated, corrupted, not written by
            `nd.checkpoint.save` (e.g. a plain `torch.save` file), or of a newer version.
    """
    name = os.fspath(path)
    target = os.path.abspath(os.path.expanduser(name))
    if not os.path.exists(target):
        raise CheckpointError(
            f"No checkpoint at {name!r}: the file does not exist. Check the path (relative "
            f"paths start at {os.getcwd()!r}), or save one first with "
            f"nd.checkpoint.save({name!r}, model=model, ...)."
        )
    if os.path.isdir(target):
        raise CheckpointError(
            f"{name!r} is a directory, not a checkpoint file; give the path of the file "
            f"nd.checkpoint.save wrote."
        )
    try:
        with open(target, "rb") as file:
            head = file.read(len(_ZIP_MAGIC))
        size = os.path.getsize(target)
    except OSError as error:
        raise CheckpointError(
            f"Cannot read checkpoint {name!r}: {error.strerror or error}. Fix its permissions "
            f"or copy it somewhere readable."
        ) from error
    if head != _ZIP_MAGIC:
        raise CheckpointError(
            f"{name!r} is not a checkpoint written by nd.checkpoint.save"
            + (" (the file is empty)" if size == 0 else " (it is not a torch.save archive)")
            + "; give the path of a file that nd.checkpoint.save wrote."
        )
    if not zipfile.is_zipfile(target):
        raise CheckpointError(
            f"Checkpoint {name!r} is truncated: the file was not completely written (it has "
            f"{size} bytes and its end is missing). nd.checkpoint.save replaces a file only "
            f"once it is complete, so this copy was cut short elsewhere (a copy, a full disk, "
            f"another writer); restore an earlier checkpoint or save again."
        )
    try:
        data = torch.load(target, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as error:
        found = [line.strip() for line in str(error).splitlines() if "Unsupported" in line]
        raise CheckpointError(
            f"{name!r} holds objects other than tensors and plain values"
            f"{' (' + found[0][:200] + ')' if found else ''}, so it was not written by "
            f"nd.checkpoint.save and is not loaded (loading could run code). If you trust it, "
            f"read it with torch.load({name!r}, weights_only=False)."
        ) from error
    except Exception as error:
        raise CheckpointError(
            f"Checkpoint {name!r} is corrupted and cannot be read ({type(error).__name__}: "
            f"{error}); restore an earlier checkpoint or save again."
        ) from error
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise CheckpointError(
            f"{name!r} was written by torch.save, not nd.checkpoint.save, so it holds no named "
            f"objects to restore. Load it with torch.load({name!r}) and call load_state_dict "
            f"yourself, or save with nd.checkpoint.save(path, model=model, ...)."
        )
    version = data.get("version")
    if not isinstance(version, int) or version > VERSION:
        raise CheckpointError(
            f"Checkpoint {name!r} has format version {version!r}, newer than this nbdist "
            f"reads ({VERSION}); upgrade nbdist to restore it."
        )
    return data


def _sync_directory(folder: str) -> None:
    """Flush the rename to disk where the platform allows it (POSIX)."""
    if os.name != "posix":
        return
    with contextlib.suppress(OSError):
        descriptor = os.open(folder, os.O_RDONLY)
        try:
            os.fsync(descriptor)
        finally:
            os.close(descriptor)
