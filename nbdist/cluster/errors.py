"""Errors of the engine layer: each is an `NbdistError` and a Python builtin.

(They will move to `nbdist/errors.py` with the other public errors; the names stay.)
Imports nothing from nbdist but `nbdist.errors`.
"""

from __future__ import annotations

import dataclasses
import re

from nbdist.errors import InvalidArgumentError, NbdistError, show_internal_frames

__all__ = [
    "ClusterInterrupted",
    "ClusterStartError",
    "ClusterStoppedError",
    "ClusterUnusableError",
    "EngineTimeoutError",
    "HostUnreachableError",
    "RemoteError",
    "RemoteFailure",
    "RemoteNameError",
    "ScaleFailedError",
    "ScaleRefusedError",
    "SerializationError",
]

SEE_DETAILS = "All frames, nbdist's and torch's too: `%dist traceback` (or the error's .details)."
"""The last line of a `RemoteError` in a notebook: how to see what it leaves out."""

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
        traceback: The formatted traceback, as the engine printed it (every frame, every
            chained exception).
        secondary: True when the failure is a consequence of another replica's (released from
            a collective, a peer that died or never arrived).
        short: The user's frames of the traceback only (no frame of nbdist, torch or
            ipyparallel, no chained library error), without the error's line: what a notebook
            shows above it. `""`: no frame is the user's; None: not known (use `traceback`).
        collective: For a secondary failure, the collective it was released from, e.g.
            `"all_reduce:SUM #12"` or `"torch.distributed.all_reduce"` (empty when unknown).
    """

    replica: int
    engine_id: int
    host: str
    pid: int
    ename: str
    evalue: str
    traceback: str
    secondary: bool = False
    short: str | None = None
    collective: str = ""

    def summary(self) -> str:
        """One line: `replica 1 (engine 1, host h, pid 123): ValueError: boom`."""
        text = self.evalue.strip().splitlines()[0] if self.evalue.strip() else ""
        if len(text) > 300:
            text = text[:297] + "..."
        where = f"engine {self.engine_id}, host {self.host}, pid {self.pid}"
        return f"replica {self.replica} ({where}): {self.ename}: {text}".rstrip(": ")


class RemoteError(NbdistError, RuntimeError):
    """One or more engines raised while running a function or a cell.

    Note [The cause first]: when replica 1 raises while replica 0 waits for it in a
    collective, replica 0 is released with an error of its own (a `WorkerLostError`, or
    gloo's "Connection closed by peer"). That error is a consequence (`secondary`), not the
    cause. A notebook shows the replicas that raised first, with their own frames only
    (`RemoteFailure.short`), and each released replica as one line ("replica 0: released
    from all_reduce:SUM #3 because replica 1 failed"); every frame and every chained error,
    nbdist's, torch's and gloo's included, stays in `details` (`%dist traceback` prints it).
    The message (`str(error)`, what a script prints) names the causes first too, then the
    first cause's whole traceback (below the user's line, the frames of an nbdist call it
    made), then the released replicas' lines.

    Attributes:
        failures: `RemoteFailure` per failed replica, in replica order.
        replicas: The failed replica ids (causes and consequences).
        causes: The failures that are not merely consequences of another's (all of them
            when every failure is a consequence).
        consequences: The other failures (replicas released because a peer failed).
        first: The first cause, whose traceback the message shows.
        num_replicas: How many replicas ran.
        details: Every failed replica's full traceback, as its engine printed it.

    Example:
        >>> failure = RemoteFailure(1, 1, "h", 7, "ZeroDivisionError", "division by zero", "")
        >>> RemoteError("a %%distribute cell", [failure], 2).headline
        '1 of 2 replica(s) failed in a %%distribute cell: replica(s) [1] raised ZeroDivisionError.'
    """

    def __init__(self, what: str, failures: list[RemoteFailure], num_replicas: int, notes=()):
        ordered = sorted(failures, key=lambda f: f.replica)
        if not ordered:
            raise InvalidArgumentError(
                "RemoteError needs at least one failure; pass the RemoteFailure of each replica "
                "that failed."
            )
        primary = [f for f in ordered if not f.secondary] or ordered
        self.failures: tuple[RemoteFailure, ...] = tuple(ordered)
        self.replicas: tuple[int, ...] = tuple(f.replica for f in ordered)
        self.causes: tuple[RemoteFailure, ...] = tuple(primary)
        self.consequences: tuple[RemoteFailure, ...] = tuple(f for f in ordered if f not in primary)
        self.first: RemoteFailure = primary[0]
        self.num_replicas = num_replicas
        self.notes: tuple[str, ...] = tuple(notes)
        names = sorted({f.ename for f in primary})
        self.headline = (
            f"{len(primary)} of {num_replicas} replica(s) failed in {what}: replica(s) "
            f"{[f.replica for f in primary]} raised {', '.join(names)}."
        )
        lines = [
            self.headline,
            *(f"  {failure.summary()}" for failure in primary),
            f"Traceback of replica {self.first.replica} (engine {self.first.engine_id}):",
            self.first.traceback.rstrip() or f"{self.first.ename}: {self.first.evalue}",
            *self._released_lines(),
            *notes,
            "Every replica's full traceback, nbdist's and torch's frames too: error.details.",
        ]
        super().__init__("\n".join(lines))

    @property
    def traceback(self) -> str:
        """The first failure's traceback text."""
        return self.first.traceback

    @property
    def details(self) -> str:
        """Every failed replica's full traceback (all frames, chained errors), replica order."""
        parts = []
        for failure in self.failures:
            role = " (a consequence)" if failure in self.consequences else ""
            parts.append(f"--- {failure.summary()}{role}")
            parts.append(failure.traceback.rstrip() or f"{failure.ename}: {failure.evalue}")
        return "\n".join(parts)

    def _released_lines(self) -> list[str]:
        """One line per consequence: `replica 0: released from X because replica 1 failed`."""
        died = [f.replica for f in self.causes if f.ename == "EngineError"]
        raised = [f.replica for f in self.causes if f.ename != "EngineError"]
        because = " and ".join(
            part
            for part in (
                _replicas(raised, "failed"),
                _replicas(died, "died"),
            )
            if part
        )
        return [
            f"replica {f.replica}: released from {f.collective or 'a collective'} because {because}"
            for f in self.consequences
        ]

    def _render_traceback_(self) -> list[str]:
        """What IPython shows in a notebook (Note [The cause first]): the headline, each
        distinct cause once with the replicas that share it (`[replicas 0, 1]
        ZeroDivisionError: ...`) and their own frames, one line per released replica, the
        notes, and how to see everything; never a frame of nbdist, torch or ipyparallel.

        With `NBDIST_SHOW_INTERNAL_FRAMES=1` (for debugging nbdist itself) each cause shows
        its whole traceback as its engine printed it instead, nbdist's frames included when
        the engine had the variable set too (engines started from this kernel inherit it)."""
        internal = show_internal_frames()
        groups: dict[tuple[str, str, str | None, str], list[RemoteFailure]] = {}
        for failure in self.causes:
            key = (
                failure.ename,
                _REPLICA_TAG.sub("", failure.evalue),
                None
                if failure.short is None or internal
                else _REPLICA_TAG.sub("", failure.short.strip()),
                ""
                if failure.short is not None and not internal
                else _REPLICA_TAG.sub("", failure.traceback),
            )
            groups.setdefault(key, []).append(failure)
        lines = [f"{type(self).__name__}: {self.headline}"]
        for (ename, evalue, short, traceback), members in groups.items():
            ids = ", ".join(str(f.replica) for f in members)
            label = "replica" if len(members) == 1 else "replicas"
            error = f"[{label} {ids}] {ename}: {evalue.strip()}".rstrip(": ")
            if short is not None:  # the user's frames, then the error once, as Python prints it
                lines.extend(short.splitlines())
                lines.extend(error.splitlines())
                continue
            lines.append(error.splitlines()[0])
            if traceback.strip():
                lines.extend(traceback.strip().splitlines())
        lines.extend(self._released_lines())
        lines.extend(self.notes)
        lines.append(SEE_DETAILS)
        return lines


def _replicas(ids: list[int], verb: str) -> str:
    if not ids:
        return ""
    if len(ids) == 1:
        return f"replica {ids[0]} {verb}"
    return f"replicas {', '.join(map(str, ids))} {verb}"


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


class HostUnreachableError(NbdistError, ConnectionError):
    """`nd.Cluster(hosts=..., launcher="ssh")` could not log in to every host over ssh before
    starting engines there; the message names each host, what ssh said and the fix."""


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


class ScaleRefusedError(NbdistError, RuntimeError):
    """`cluster.scale(...)` / `%dist scale` was refused before anything changed: a call or
    cell is running, the machine has no room for that many engines, the cluster's kind cannot
    be resized, or some state cannot follow. The message names why and the fix; `reason`
    holds why in a few words (`"busy"`, `"capacity"`, `"strategy"`, `"launcher"`, `"state"`,
    `"dead engines"`, `"one engine"`).
    """

    def __init__(self, message: str, *, reason: str = ""):
        super().__init__(message)
        self.reason = reason


class ScaleFailedError(NbdistError, RuntimeError):
    """A resize failed part-way (an engine did not start or join, or the state could not
    follow); the cluster is marked unusable, and the message names what failed and the fix
    (`%dist restart`)."""


class ClusterInterrupted(NbdistError, KeyboardInterrupt):
    """Ctrl-C (or the notebook's stop button) interrupted a cell or call on the engines.

    A `KeyboardInterrupt`, so it stops a script as Ctrl-C does. Its message is one line: what
    each replica was doing and whether the cluster is still usable; a notebook shows only that
    line.
    """

    def _render_traceback_(self) -> list[str]:
        return [f"{type(self).__name__}: {self}"]
