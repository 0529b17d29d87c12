"""Errors raised by nbdist: each is an `NbdistError` and a Python builtin.

Every message says what happened, the value seen and the fix, in public-API terms.
Imports nothing from nbdist.
"""

from __future__ import annotations

import os
import sys
import traceback as _traceback

__all__ = [
    "SHOW_INTERNAL_FRAMES",
    "ArgumentTypeError",
    "BusyError",
    "CancelledError",
    "CheckpointError",
    "CheckpointKeyError",
    "CheckpointMismatchError",
    "CheckpointStateWarning",
    "CheckpointTypeError",
    "ClusterConfigError",
    "CollectiveMismatchError",
    "CollectiveTimeoutError",
    "CompiledCollectiveError",
    "ContextError",
    "FileWriteError",
    "InvalidArgumentError",
    "NbdistError",
    "NbdistWarning",
    "NotShardedError",
    "PSUnavailableError",
    "ParameterInRunError",
    "RedundantDDPError",
    "RendezvousError",
    "ReplicaReleasedError",
    "ReplicasDivergedError",
    "StrategyMixingError",
    "UnknownArgumentError",
    "UnsupportedOptionError",
    "WorkerLostError",
    "show_internal_frames",
]


class NbdistError(Exception):
    """Base class of every error nbdist raises on purpose.

    Example:
        >>> try:
        ...     raise CollectiveTimeoutError("replica 1 did not arrive")
        ... except NbdistError as err:
        ...     isinstance(err, TimeoutError)
        True
    """

    def _render_traceback_(self) -> list[str]:
        """What IPython shows for this error in a notebook: the user's frames and the message,
        without nbdist's own frames (they say nothing the message does not)."""
        return user_traceback(self)


_NBDIST_DIR = os.path.dirname(os.path.abspath(__file__))

SHOW_INTERNAL_FRAMES = "NBDIST_SHOW_INTERNAL_FRAMES"
"""The environment variable that keeps nbdist's own frames in the tracebacks users see."""


def show_internal_frames() -> bool:
    """True when `NBDIST_SHOW_INTERNAL_FRAMES` is set to anything but `""` or `"0"`: for
    debugging nbdist itself, tracebacks (an `NbdistError` in a notebook, a `RemoteError`, a
    worker's error) then keep nbdist's frames instead of leaving them out. Read at each
    error, so setting it in a running kernel (or on the engines) takes effect at once.

    Example:
        >>> os.environ[SHOW_INTERNAL_FRAMES] = "1"
        >>> show_internal_frames()
        True
        >>> del os.environ[SHOW_INTERNAL_FRAMES]
        >>> show_internal_frames()
        False
    """
    return os.environ.get(SHOW_INTERNAL_FRAMES, "") not in ("", "0")


def is_nbdist_file(filename: str) -> bool:
    """True for a source file of the nbdist package (its frames are hidden from users)."""
    return os.path.abspath(filename).startswith(_NBDIST_DIR + os.sep)


_MAGIC_CALLS = ("get_ipython().run_cell_magic(", "get_ipython().run_line_magic(")


def _is_magic_machinery(frame: _traceback.FrameSummary) -> bool:
    """True for a frame of IPython's own code running a cell or a magic, or for a cell's line
    that only calls a magic (IPython's rewrite of `%%distribute` / `%dist`): an error an nbdist
    magic raises would otherwise show IPython's frames and a rewritten line the user never
    wrote. Reads no module that is not already imported (the core imports no Jupyter code)."""
    if (frame.line or "").lstrip().startswith(_MAGIC_CALLS):
        return True
    for name in ("IPython", "ipykernel"):
        module = sys.modules.get(name)
        location = getattr(module, "__file__", None)
        if location and os.path.abspath(frame.filename).startswith(
            os.path.dirname(os.path.abspath(location)) + os.sep
        ):
            return True
    return False


def user_traceback(error: BaseException) -> list[str]:
    """`error`'s traceback as lines, with every frame in nbdist's own modules left out
    (kept when `NBDIST_SHOW_INTERNAL_FRAMES=1`, see `show_internal_frames`).

    Example:
        >>> user_traceback(ValueError("bad"))
        ['ValueError: bad']
    """
    internal = show_internal_frames()
    frames = [
        frame
        for frame in _traceback.extract_tb(error.__traceback__)
        if (internal or not is_nbdist_file(frame.filename)) and not _is_magic_machinery(frame)
    ]
    parts = (
        ["Traceback (most recent call last):\n", *_traceback.format_list(frames)] if frames else []
    )
    parts += _traceback.format_exception_only(type(error), error)
    return "".join(parts).rstrip("\n").split("\n")


class StrategyMixingError(NbdistError, RuntimeError):
    """A second, different strategy was entered while one is active."""


class ReplicaReleasedError(NbdistError, RuntimeError):
    """A replica waiting in a collective was released because another replica failed or left."""


class CollectiveTimeoutError(NbdistError, TimeoutError):
    """A collective did not complete in time; the message names the replicas that never arrived."""

    def __init__(self, message: str, *, missing: tuple[int, ...] = ()):
        super().__init__(message)
        self.missing = missing


class BusyError(NbdistError, TimeoutError):
    """A call into a strategy or a cluster waited, past its timeout, for another thread's call
    into the same strategy or cluster to finish, and was not run (calls from several threads
    run one at a time); the message names the other call's thread and the fix."""


class CollectiveMismatchError(NbdistError, ValueError):
    """Replicas called different collectives, or with different shapes or dtypes, at one step."""


class ClusterConfigError(NbdistError, ValueError):
    """A cluster description (TF_CONFIG, torchrun or Slurm variables, ClusterSpec) is malformed."""


class WorkerLostError(NbdistError, RuntimeError):
    """A worker process died, failed or stopped answering during a collective.

    `missing` holds the ranks that did not take part; the message says what is known of each.
    """

    def __init__(self, message: str, *, missing: tuple[int, ...] = ()):
        super().__init__(message)
        self.missing = missing


class RendezvousError(NbdistError, RuntimeError):
    """The workers could not meet to form their process group (port in use, a worker missing)."""


class CheckpointError(NbdistError, RuntimeError):
    """A checkpoint could not be written or read: an unwritable path, a missing, truncated or
    foreign file, or another worker that failed at the same save or restore."""


class CheckpointMismatchError(CheckpointError, ValueError):
    """A checkpoint does not fit the objects given to `restore`: another model's parameters,
    a name it does not hold, or an object of another kind."""


class CheckpointKeyError(CheckpointMismatchError, KeyError):
    """A state dict given to a `load_state_dict` of nbdist lacks the key it needs (one not made
    by the matching `state_dict()`); a `KeyError` too, as for a missing key of a dict."""


class CheckpointTypeError(CheckpointError, TypeError):
    """An object given to `nd.checkpoint.save` or `restore` that cannot be checkpointed."""


class UnsupportedOptionError(NbdistError, ValueError):
    """An option nbdist does not implement was passed (refused by name, never ignored).

    Example:
        >>> import nbdist as nd
        >>> try:
        ...     nd.OneDeviceStrategy("cpu").run(lambda: 1, options={"xla": True})
        ... except UnsupportedOptionError as err:
        ...     isinstance(err, ValueError)
        True
    """


class UnknownArgumentError(NbdistError, TypeError):
    """A keyword argument nbdist does not know (a typo, or another library's), named with the
    arguments that are accepted."""


class InvalidArgumentError(NbdistError, ValueError):
    """An argument with the right type but a value nbdist cannot use (a shape, an axis, a
    device, a count); the message names the value and the fix."""


class FileWriteError(NbdistError, OSError):
    """A file nbdist was asked to write (e.g. `dashboard.save(path)`) could not be written:
    a folder that does not exist or cannot be written to; the message names the path."""


class ArgumentTypeError(NbdistError, TypeError):
    """An argument of a type nbdist does not accept; the message names what is accepted."""


class ContextError(NbdistError, RuntimeError):
    """A call made where it cannot work: inside `strategy.run` where cross-replica context is
    needed, a nested `run`, a variable created inside `run`; the message says where to call it."""


class CompiledCollectiveError(ContextError):
    """A replica-context collective (`all_reduce`, `all_gather`, `merge_call`), or a context
    lookup (`get_replica_context`, `get_strategy`...), inside a `torch.compile` region that may
    not break the graph (`fullgraph=True`). Raised by every replica before any of them waits,
    so nothing hangs (docs/compile.md)."""


class ParameterInRunError(ContextError):
    """A module parameter created inside `strategy.run` of a strategy with several replicas
    (compiled or not): each replica would get its own, never synchronised, parameter."""


class NotShardedError(ContextError):
    """A module, or parameters, created outside `FullyShardedStrategy.scope()` passed to or
    stepped in `strategy.run`: not sharded, so their gradients are not reduced across the
    workers. Create the model and its optimizer in `scope()`."""


class ReplicasDivergedError(NbdistError, RuntimeError):
    """The replicas' copies of parameters created in `strategy.scope()` are no longer
    identical (found by the replica check: at the end of a `%%distribute` cell and every
    `strategy.replica_check_every` optimizer steps). The message names the parameters
    and the usual causes; bring the replicas back together by restoring a checkpoint on every
    replica."""


class RedundantDDPError(NbdistError, TypeError):
    """`torch.nn.parallel.DistributedDataParallel` wrapping a model created in
    `strategy.scope()` of a `MultiWorkerMirroredStrategy`: nbdist already averages that
    model's gradients in every backward, so DDP would synchronise them a second time. Use the
    model without the wrapper."""


class PSUnavailableError(NbdistError, RuntimeError):
    """A parameter-server task of a `ParameterServerStrategy` died or stopped answering.

    `ps` is the index of the ps task (`/job:ps/task:<ps>`), `address` where it listened. The
    variables it held are gone with it: restart the ps task, then restore the variables from a
    checkpoint (docs/parameter-server.md).
    """

    def __init__(self, message: str, *, ps: int | None = None, address: str | None = None):
        super().__init__(message)
        self.ps = ps
        self.address = address

    def __reduce__(self) -> tuple:
        return (_rebuild_ps_error, (str(self), self.ps, self.address))


def _rebuild_ps_error(message: str, ps: int | None, address: str | None) -> PSUnavailableError:
    return PSUnavailableError(message, ps=ps, address=address)


class CancelledError(NbdistError, RuntimeError):
    """A function scheduled on a `ClusterCoordinator` was cancelled, not run, because an earlier
    function failed; schedule it again."""


class NbdistWarning(UserWarning):
    """Base class of every warning nbdist gives (nbdist's own tests turn them into errors
    unless a test expects one: pyproject.toml's `filterwarnings`).

    Example:
        >>> import warnings
        >>> with warnings.catch_warnings(record=True) as seen:
        ...     warnings.simplefilter("always")
        ...     warnings.warn("careful", NbdistWarning)
        >>> issubclass(seen[0].category, UserWarning)
        True
    """


class MovedModuleWarning(NbdistWarning, DeprecationWarning):
    """An old import path of a module that moved in the package's re-layout: it still works for
    one release; import from the new path it names (docs/architecture.md lists them)."""


class CheckpointStateWarning(NbdistWarning, RuntimeWarning):
    """A checkpoint directory's state file cannot be read, or names a checkpoint that does not
    exist: it is ignored (as TensorFlow ignores it) and no earlier checkpoint is known."""
