"""The `checkpoint` state file a `CheckpointManager` keeps in its directory, in TF's format.

Note [Checkpoint state file]: TensorFlow's `CheckpointManager` records which checkpoints it
manages in a text file named `checkpoint` next to them: a `CheckpointState` protocol buffer
in text format, with paths relative to the directory, e.g.

    model_checkpoint_path: "ckpt-3"
    all_model_checkpoint_paths: "ckpt-2"
    all_model_checkpoint_paths: "ckpt-3"
    all_model_checkpoint_timestamps: 1764241234.5
    all_model_checkpoint_timestamps: 1764241240.25
    last_preserved_timestamp: 1764241230.0

nbdist writes the same fields in the same format, atomically (temporary file, then rename),
so a manager made later in the directory (or a reader of the file) finds the list, and
`nd.checkpoint.latest_checkpoint(directory)` answers as `tf.train.latest_checkpoint` does. A
file that does not parse is ignored with a warning, as TensorFlow ignores it.

Imports nbdist.errors only.

Example:
    >>> import tempfile
    >>> folder = tempfile.mkdtemp()
    >>> write_state(folder, CheckpointState(os.path.join(folder, "ckpt-2"),
    ...             [os.path.join(folder, "ckpt-1"), os.path.join(folder, "ckpt-2")],
    ...             [10.0, 20.0], 5.0))
    >>> [os.path.basename(p) for p in read_state(folder).all_model_checkpoint_paths]
    ['ckpt-1', 'ckpt-2']
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import tempfile
import warnings

from nbdist.errors import CheckpointError, CheckpointStateWarning

__all__ = ["STATE_FILE", "CheckpointState", "read_state", "write_state"]

STATE_FILE = "checkpoint"
"""The state file's name in the manager's directory (TF's default `latest_filename`)."""


@dataclasses.dataclass
class CheckpointState:
    """What the state file holds (TF's `CheckpointState` fields); paths as the manager uses
    them (joined to its directory)."""

    model_checkpoint_path: str
    all_model_checkpoint_paths: list[str]
    all_model_checkpoint_timestamps: list[float]
    last_preserved_timestamp: float


def write_state(directory: str, state: CheckpointState) -> None:
    """Write `state` to `directory/checkpoint` atomically, paths relative to `directory`.

    Raises:
        CheckpointError: the file cannot be written (named, with the fix).
    """

    def quoted(path: str) -> str:
        if os.path.isabs(path) == os.path.isabs(directory):
            path = os.path.relpath(path, directory)
        return json.dumps(path, ensure_ascii=False)

    lines = [f"model_checkpoint_path: {quoted(state.model_checkpoint_path)}"]
    lines += [f"all_model_checkpoint_paths: {quoted(p)}" for p in state.all_model_checkpoint_paths]
    lines += [
        f"all_model_checkpoint_timestamps: {t!r}" for t in state.all_model_checkpoint_timestamps
    ]
    lines.append(f"last_preserved_timestamp: {state.last_preserved_timestamp!r}")
    target = os.path.join(directory, STATE_FILE)
    temporary = None
    try:
        handle, temporary = tempfile.mkstemp(dir=directory, prefix=f".{STATE_FILE}.", suffix=".tmp")
        with os.fdopen(handle, "w") as file:
            file.write("\n".join(lines) + "\n")
            file.flush()
            os.fsync(file.fileno())
        os.replace(temporary, target)
    except OSError as error:
        if temporary is not None:
            with contextlib.suppress(OSError):
                os.unlink(temporary)
        raise CheckpointError(
            f"Cannot write the checkpoint state file {target!r}: {error.strerror or error}. "
            f"Give the CheckpointManager a directory you can write to."
        ) from error


def read_state(directory: str) -> CheckpointState | None:
    """The state in `directory/checkpoint`, paths joined to `directory`; None when there is
    no such file, or (with a warning, as TensorFlow does) when it cannot be read or parsed."""
    target = os.path.join(directory, STATE_FILE)
    if not os.path.isfile(target):
        return None
    try:
        with open(target) as file:
            parsed = _parse(file.read(), directory)
    except (OSError, UnicodeDecodeError) as error:
        parsed = str(error)
    if isinstance(parsed, CheckpointState):
        return parsed
    warnings.warn(
        f"The checkpoint state file {target!r} cannot be read ({parsed}); it is ignored, as "
        f"TensorFlow ignores it: no earlier checkpoint is known in {directory!r}.",
        CheckpointStateWarning,
        stacklevel=3,
    )
    return None


def _parse(text: str, directory: str) -> CheckpointState | str:
    """The state in a state file's `text`, or why it is not one."""
    fields: dict[str, list[str]] = {}
    for line in text.splitlines():
        if not line.strip():
            continue
        key, colon, value = line.partition(":")
        if not colon:
            return f"no ':' in {line!r}"
        fields.setdefault(key.strip(), []).append(value.strip())

    def path(raw: str) -> str | None:
        try:
            value = json.loads(raw)
        except ValueError:
            return None
        if not isinstance(value, str) or not value:
            return None
        return value if os.path.isabs(value) else os.path.join(directory, value)

    latest = fields.get("model_checkpoint_path", [])
    if len(latest) != 1 or path(latest[0]) is None:
        return "it names no model_checkpoint_path"
    paths = [path(p) for p in fields.get("all_model_checkpoint_paths", [])]
    try:
        stamps = [float(t) for t in fields.get("all_model_checkpoint_timestamps", [])]
        preserved = [float(t) for t in fields.get("last_preserved_timestamp", ["0"])]
    except ValueError as error:
        return f"a timestamp is not a number: {error}"
    if any(p is None for p in paths) or (stamps and len(stamps) != len(paths)):
        return "its paths and timestamps do not match"
    return CheckpointState(str(path(latest[0])), [str(p) for p in paths], stamps, preserved[-1])
