"""Errors of the engine layer: each is an `NbdistError` and a Python builtin.

(They will move to `nbdist/errors.py` with the other public errors; the names stay.)
Imports nothing from nbdist but `nbdist.errors`.
"""

from __future__ import annotations

import dataclasses
import re

from nbdist.errors import NbdistError

__all__ = [
    "ClusterInterrupted",
    "ClusterStartError",
    "ClusterStoppedError",
    "ClusterUnusableError",
    "EngineTimeoutError",
    "RemoteError",
    "RemoteFailure",
    "RemoteNameError",
    "SerializationError",
]

_REPLICA_TAG = re.compile(r"\[replica \d+ of \d+\] ")
"""The tag strategy.run puts before a replica's message; left out when grouping errors."""


@dataclasses.dataclass(frozen=True)
class RemoteFailure:
    """What went wrong on one engine.

    Attributes:
        replica: The replica id (the engine's rank).
        engine_id: ipyparallel's id of the engine.
        host: The engine's host name.
        pid: The engine's process id.
        ename: The exception's type name, e.g. `"ValueError"`.
        evalue: The exception's message.
        traceback: The formatted traceback, as the engine printed it.
        secondary: True when the failure is a consequence of another replica's (released from
            a collective, a peer that died or never arrived).
    """

    replica: int
    engine_id: int
    host: str
    pid: int
    ename: str
    evalue: str
    traceback: str
    secondary: bool = False

    def summary(self) -> str:
        """One line: `replica 1 (engine 1, host h, pid 123): ValueError: boom`."""
        text = self.evalue.strip().splitlines()[0] if self.evalue.strip() else ""
        if len(text) > 300:
            text = text[:297] + "..."
        where = f"engine {self.engine_id}, host {self.host}, pid {self.pid}"
        return f"replica {self.replica} ({where}): {self.ename}: {text}".rstrip(": ")


class RemoteError(NbdistError, RuntimeError):
    """One or more engines raised while running a function or a cell.

    The message lists every failed replica and shows the first traceback: the failure that is
    not merely a consequence of another's (a replica released from a collective because a peer
    failed is secondary), else the lowest replica's.

    In a notebook (IPython's `_render_traceback_`) it shows only the remote tracebacks, one
    per distinct error with the replicas that share it.

    Attributes:
        failures: `RemoteFailure` per failed replica, in replica order.
        replicas: The failed replica ids.
        first: The failure whose traceback the message shows.
        num_replicas: How many replicas ran.
    """

    def __init__(self, what: str, failures: list[RemoteFailure], num_replicas: int, notes=()):
        ordered = sorted(failures, key=lambda f: f.replica)
        if not ordered:
            raise ValueError("RemoteError needs at least one failure.")
        primary = [f for f in ordered if not f.secondary]
        self.failures: tuple[RemoteFailure, ...] = tuple(ordered)
        self.replicas: tuple[int, ...] = tuple(f.replica for f in ordered)
        self.first: RemoteFailure = (primary or ordered)[0]
        self.num_replicas = num_replicas
        self.notes: tuple[str, ...] = tuple(notes)
        self.headline = (
            f"{len(ordered)} of {num_replicas} replica(s) failed in {what}: replica(s) "
            f"{list(self.replicas)}."
        )
        lines = [
            f"{len(ordered)} of {num_replicas} replica(s) failed in {what}: replica(s) "
            f"{list(self.replicas)}.",
            *(f"  {failure.summary()}" for failure in ordered),
            *notes,
            f"Traceback of replica {self.first.replica} (engine {self.first.engine_id}):",
            self.first.traceback.rstrip() or f"{self.first.ename}: {self.first.evalue}",
        ]
        super().__init__("\n".join(lines))

    @property
    def traceback(self) -> str:
        """The first failure's traceback text."""
        return self.first.traceback

    def _render_traceback_(self) -> list[str]:
        """What IPython shows in a notebook: the remote tracebacks only, one per distinct error
        with the replicas that share it (`[replicas 0, 1] ZeroDivisionError: ...`), then the
        notes; never the notebook-side frames of nbdist that raised this error."""
        groups: dict[tuple[str, str, str], list[RemoteFailure]] = {}
        for failure in self.failures:
            key = (
                failure.ename,
                _REPLICA_TAG.sub("", failure.evalue),
                _REPLICA_TAG.sub("", failure.traceback.strip()),
            )
            groups.setdefault(key, []).append(failure)
        lines = [f"{type(self).__name__}: {self.headline}"]
        for (ename, evalue, traceback), members in groups.items():
            ids = ", ".join(str(f.replica) for f in members)
            label = "replica" if len(members) == 1 else "replicas"
            first_line = evalue.strip().splitlines()[0] if evalue.strip() else ""
            lines.append("")
            lines.append(f"[{label} {ids}] {ename}: {first_line}".rstrip(": "))
            if traceback:
                lines.extend(traceback.splitlines())
        if self.notes:
            lines.append("")
            lines.extend(self.notes)
        return lines


class RemoteNameError(NbdistError, NameError):
    """`nd.remote("name")` named a variable the engine does not have (raised on the engine)."""


class SerializationError(NbdistError, TypeError):
    """A function, argument or value could not be pickled to travel to or from the engines."""


class EngineTimeoutError(NbdistError, TimeoutError):
    """Engines did not start, answer or finish within the timeout.

    `pending` holds the replica ids (or, while starting, the engine counts) still missing.
    """

    def __init__(self, message: str, *, pending: tuple[int, ...] = ()):
        super().__init__(message)
        self.pending = pending


class ClusterStartError(NbdistError, RuntimeError):
    """The engines or the controller failed to start, or an engine failed to join the group."""


class ClusterStoppedError(NbdistError, RuntimeError):
    """The cluster is not running (never started, or stopped), so a call that needs its
    engines (`cluster.strategy`, `cluster.client`, `push`, `pull`) cannot work; the message
    names `cluster.start()` / `%dist start`."""


class ClusterUnusableError(NbdistError, RuntimeError):
    """The engines' process group is unusable (a timeout, an interrupt that did not finish, a
    failed collective or a dead engine left it so), so nothing that needs it was run.

    The message names what happened and the fix (`%dist restart` / `cluster.restart()`);
    `reason` holds what happened.
    """

    def __init__(self, message: str, *, reason: str = ""):
        super().__init__(message)
        self.reason = reason


class ClusterInterrupted(NbdistError, KeyboardInterrupt):
    """Ctrl-C (or the notebook's stop button) interrupted a cell or call on the engines.

    A `KeyboardInterrupt`, so it stops a script as Ctrl-C does. Its message is one line: what
    each replica was doing and whether the cluster is still usable; a notebook shows only that
    line.
    """

    def _render_traceback_(self) -> list[str]:
        return [f"{type(self).__name__}: {self}"]
