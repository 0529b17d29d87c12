"""`nd.log(step=None, **scalars)`: training metrics per replica, for the dashboard's curves;
`nd.progress(iterable)`: one progress bar, driven by replica 0.

Metrics go to one bounded, process-wide log (`metric_log()`), whatever the strategy, so that a
`%%distribute` cell logs on each engine without entering a scope: the replica is the calling
replica context's id, else this process's home replica (the engine's rank on engines, 0 in a
notebook or script). Imports nothing from Jupyter.

Example:
    >>> import nbdist as nd
    >>> nd.log(step=3, loss=0.5)
    >>> metric_log().last("loss")
    (0, 3, 0.5)
"""

from __future__ import annotations

import collections
import itertools
import numbers
import threading
import time
from collections.abc import Iterable
from typing import Any, NamedTuple

from nbdist.core.context import current_replica_context
from nbdist.errors import ArgumentTypeError

__all__ = ["MetricLog", "MetricRecord", "log", "metric_log", "progress", "set_home_replica"]

_CAPACITY = 100_000


# Note [Logging device tensors]: `nd.log(loss=loss)` runs every step, and `loss.item()` on a
# GPU waits for every kernel queued so far: one device sync per step, which would undo the
# overlap of compute and communication. So a 0-d tensor on an accelerator is kept as it is
# (detached, in a `_Deferred`) and read as a number only when someone reads the log (the
# dashboard's feed, twice a second, from its own thread) or when `_DEFERRED_LIMIT` of them
# are waiting (which bounds the device memory they hold: one sync per that many values).
_DEFERRED_LIMIT = 1024


class MetricRecord(NamedTuple):
    """One logged value: which replica logged it, at which step, under which name, and when
    (wall-clock seconds)."""

    replica: int
    step: int
    name: str
    value: float
    wall: float


class _Deferred:
    """A logged 0-d device tensor, read as a float the first time it is asked for."""

    __slots__ = ("_tensor", "_value")

    def __init__(self, tensor: Any):
        self._tensor = tensor
        self._value: float | None = None

    def value(self) -> float:
        if self._value is None:
            self._value = float(self._tensor.item())
            self._tensor = None  # the device memory goes back
        return self._value


def _plain(entry: tuple) -> MetricRecord:
    """`entry` as a record, a deferred value read as its float."""
    value = entry[3]
    if type(value) is _Deferred:
        value = value.value()
    return MetricRecord(entry[0], entry[1], entry[2], value, entry[4])


class MetricLog:
    """A bounded log of `MetricRecord`s, `(replica, step, name, value, wall)` (oldest dropped).

    Steps left out are counted per replica and name. Values may be 0-d device tensors, read
    as floats on first read (Note [Logging device tensors]).

    Example:
        >>> import torch
        >>> log = MetricLog()
        >>> log.add(0, None, {"loss": 0.5, "accuracy": torch.tensor(0.75)})
        >>> [(r.name, r.value) for r in log.records()]
        [('loss', 0.5), ('accuracy', 0.75)]
    """

    def __init__(self, capacity: int = _CAPACITY):
        self._log: collections.deque[tuple] = collections.deque(maxlen=capacity)
        self._next_step: dict[tuple[int, str], int] = {}
        self._lock = threading.Lock()
        self.version = 0
        """Grows with every record (readers redraw only when it changed)."""
        self.appended = 0
        """Records ever appended (to send only the new ones)."""
        self._deferred: list[_Deferred] = []

    def add(self, replica: int, step: int | None, scalars: dict[str, Any]) -> None:
        """Record `scalars` for `replica` at `step` (the name's next step when None); each
        value a float or a 0-d tensor (read when the log is read)."""
        wall = time.time()
        with self._lock:
            for name, value in scalars.items():
                key = (replica, name)
                at = self._next_step.get(key, 0) if step is None else step
                self._next_step[key] = at + 1
                if hasattr(value, "detach"):
                    value = _Deferred(value.detach())
                    self._deferred.append(value)
                elif type(value) is not float:
                    value = float(value)
                self._log.append((replica, at, name, value, wall))
                self.appended += 1
            self.version += 1
            waiting = self._deferred if len(self._deferred) >= _DEFERRED_LIMIT else []
            if waiting:
                self._deferred = []
        for value in waiting:  # outside the lock: readers need not wait for the device
            value.value()

    def records(self) -> list[MetricRecord]:
        """Every record kept, oldest first."""
        with self._lock:
            entries = list(self._log)
        return [_plain(entry) for entry in entries]

    def tail(self, n: int) -> list[MetricRecord]:
        """The newest `n` records, oldest first."""
        with self._lock:
            n = min(n, len(self._log))
            entries = list(itertools.islice(reversed(self._log), n))[::-1] if n else []
        return [_plain(entry) for entry in entries]

    def last(self, name: str) -> tuple[int, int, float] | None:
        """The newest `(replica, step, value)` logged under `name`, or None."""
        with self._lock:
            found = next((entry for entry in reversed(self._log) if entry[2] == name), None)
        if found is None:
            return None
        replica, step, _, value, _ = _plain(found)
        return replica, step, value

    def clear(self) -> None:
        """Forget every record."""
        with self._lock:
            self._log.clear()
            self._next_step.clear()
            self._deferred = []
            self.version += 1

    def __len__(self) -> int:
        return len(self._log)


_LOG = MetricLog()
_home: dict[str, Any] = {"replica": 0, "engine": False, "bar": None}


def metric_log() -> MetricLog:
    """This process's metric log (read by dashboards, pulled from engines)."""
    return _LOG


def set_home_replica(replica: int, *, engine: bool = False, bar: Any = None) -> None:
    """Set the replica that `nd.log` outside any replica context logs for (engines: rank),
    and on engines the tqdm class `nd.progress` uses (one that sends its state to the
    notebook: `nbdist.cluster.engine_side.progress.EngineBar`)."""
    _home["replica"] = int(replica)
    _home["engine"] = engine
    _home["bar"] = bar


def _current_replica() -> int:
    # the replica context `run` entered, read from the core's context variables (not through
    # `nd.get_replica_context()`, whose default context answers replica 0 of the default
    # strategy): metrics sit below the strategies. Several replicas in this process: each has
    # its own id; else the engine's replica.
    ctx = current_replica_context()
    if ctx is not None and len(ctx.strategy.extended.worker_devices) > 1:
        return ctx.replica_id_in_sync_group
    return _home["replica"]


def _scalar(name: Any, value: Any) -> Any:
    """`value` as a float, or a 0-d accelerator tensor kept as it is (Note [Logging device
    tensors])."""
    if not isinstance(name, str):
        raise ArgumentTypeError(f"nd.log needs string metric names; got {name!r}.")
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        numel = getattr(value, "numel", None)
        if callable(numel) and getattr(value, "dim", lambda: 1)() == 0:
            if getattr(getattr(value, "device", None), "type", "cpu") != "cpu":
                return value
            return float(value.item())
        raise ArgumentTypeError(
            f"nd.log: metric {name!r} must be a Python number or a 0-d tensor, got "
            f"{type(value).__name__} {value!r:.80}. Log one number per name, e.g. "
            f"nd.log({name}=loss.item())."
        )
    return float(value)


def log(step: int | None = None, **scalars: Any) -> None:
    """Record scalar metrics for the calling replica (replica 0 outside any strategy).

    Args:
        step: The training step; None continues from the last step logged under each name.
        **scalars: Python numbers or 0-d tensors, by name.

    Raises:
        TypeError: A value that is not one number, naming its key.

    Example:
        >>> import nbdist as nd
        >>> nd.log(step=0, accuracy=0.25)
    """
    if step is not None and (isinstance(step, bool) or not isinstance(step, numbers.Integral)):
        raise ArgumentTypeError(f"nd.log: step must be an int or None, got {step!r}.")
    values = {name: _scalar(name, value) for name, value in scalars.items()}
    if values:
        _LOG.add(_current_replica(), None if step is None else int(step), values)


def progress(iterable: Iterable, **tqdm_kwargs: Any) -> Iterable:
    """Iterate with one tqdm bar, driven by replica 0 (other replicas' iterations are not
    counted).

    In a notebook it is tqdm's widget; in a script or terminal, text on stderr. In a
    `%%distribute` cell every engine sends its bar's state to the notebook (no text on the
    engines' stderr), and the notebook draws the first target replica's bar: a widget in
    JupyterLab, a text bar in a terminal, also with `--output first` or `none`.

    Example:
        >>> import nbdist as nd
        >>> sum(nd.progress(range(3), disable=True))
        3
    """
    if _home["engine"] and _home["bar"] is not None:
        return _home["bar"](iterable, **tqdm_kwargs)
    if _current_replica() != 0:
        tqdm_kwargs["disable"] = True
    if _home["engine"]:
        from tqdm.std import tqdm
    else:
        from tqdm.auto import tqdm
    return tqdm(iterable, **tqdm_kwargs)
