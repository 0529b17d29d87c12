"""`Stopping`: a cluster's teardown, which leaves no process behind, and the stop at exit.

A mixin of `Cluster` (its methods are the cluster's). `_teardown` wakes engines blocked in a
collective, asks engines on other hosts to leave through the controller, stops ipyparallel's
engines and then its controller, writes what they printed to `cluster.log_file`, and reaps
whatever is left (the controller's schedulers, the engines' nannies) under a deadline, killing
what ignores the stop. `live_clusters` holds the running clusters; `stop_at_exit()` makes the
interpreter's exit stop them.

Example (starts processes, so not run here)::

    cluster = nd.Cluster(n=2).start()
    cluster.stop()              # returns once none of its processes is left
    cluster.log_file            # what the engines and the controller printed
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import time
import weakref
from typing import TYPE_CHECKING, Any

from nbdist._private_api import launcher_has_exited
from nbdist.cluster.launch.processes import ProcessSet
from nbdist.cluster.launch.stop_log import launchers_of, quiet_stop_log, write_log
from nbdist.cluster.status import EngineInfo

__all__ = ["REAP_GRACE_S", "SSH_SHUTDOWN_S", "Stopping", "live_clusters", "stop_at_exit"]

_LOG = logging.getLogger("nbdist.cluster.engines")  # the logger it had as part of engines.py
SSH_SHUTDOWN_S = 10.0
"""Seconds a stop waits for engines on other hosts to leave when asked through the controller."""
REAP_GRACE_S = 1.0
"""Seconds what is left of a cluster after ipyparallel's stop gets to exit before it is killed."""

live_clusters: weakref.WeakSet[Any] = weakref.WeakSet()
"""The clusters started and not stopped yet (`Cluster.start` adds, `_teardown` discards)."""
_atexit_registered = False


def _engine_launchers(ipp: Any) -> list[Any]:
    """Every engine launcher of an ipyparallel cluster's engine sets (one per ssh engine)."""
    return [
        launcher
        for engine_set in list(getattr(ipp, "engines", {}).values())
        for launcher in getattr(engine_set, "launchers", {}).values()
    ]


def _stop_all_at_exit() -> None:
    for cluster in list(live_clusters):
        with contextlib.suppress(Exception):
            cluster.stop()


def stop_at_exit() -> None:
    """Make the interpreter's exit stop every cluster in `live_clusters` (once; idempotent)."""
    global _atexit_registered
    if not _atexit_registered:
        atexit.register(_stop_all_at_exit)
        _atexit_registered = True


class Stopping:
    """The teardown of `Cluster` (see the module's docstring)."""

    _plan: Any
    _ipp: Any
    _client: Any
    _engines: tuple[EngineInfo, ...]
    _processes: ProcessSet
    _state: str
    _broken: str | None
    _repaired: str | None
    _reform_pending: str | None
    _rendezvous: tuple[str, int] | None
    _group_prefix: str | None
    _inflight: dict[int, set[Any]]
    _restarting: bool
    log_file: str | None

    if TYPE_CHECKING:  # the Cluster members used here

        def _record_processes(self) -> None: ...
        def _stop_zygote(self, keep: bool = False) -> None: ...
        def abort_group(self, reason: str) -> Any: ...

    def _teardown(self) -> None:
        self._record_processes()
        if any(self._inflight.values()):
            # Engines blocked in a collective run no Python, so they cannot take the stop
            # signal; abandoning the group wakes them within a heartbeat (Note [Waking a
            # blocked collective]) instead of ipyparallel killing them 5 s later.
            with contextlib.suppress(Exception):
                self.abort_group("the cluster is stopping")
        if self._client is not None:
            if self._plan.launcher == "ssh" and self._client.ids:
                # Engines on other hosts exit when asked through the controller; ipyparallel's
                # ssh stop then finds them gone instead of signalling each over ssh. Not
                # `block=True`: an engine whose host dropped off never replies, and that wait
                # has no end; the engines' unregistration or exit is waited for,
                # SSH_SHUTDOWN_S at most. (An engine that exits unregisters only once its
                # heartbeats are missed, up to 10 s later; its launcher sees it exit at once.)
                with contextlib.suppress(Exception):
                    engines = _engine_launchers(self._ipp)
                    self._client.shutdown(hub=False, block=False)
                    deadline = time.monotonic() + min(self._plan.timeout, SSH_SHUTDOWN_S)
                    while (
                        self._client.ids
                        and not (engines and all(map(launcher_has_exited, engines)))
                        and time.monotonic() < deadline
                    ):
                        time.sleep(0.05)  # polling (bounded by the deadline)
            with contextlib.suppress(Exception):
                self._client.close()
        if self._ipp is not None:
            # Engines first, while the controller still listens: each engine's nanny tells
            # the controller its engine left and exits at once (with the controller gone it
            # would wait 3 s for the message to go out).
            launchers = launchers_of(self._ipp)
            with quiet_stop_log(self._ipp):
                for step in (self._ipp.stop_engines_sync, self._ipp.stop_controller_sync):
                    try:
                        step()
                    except Exception as error:  # keep going: the processes are reaped below
                        _LOG.warning("ipyparallel could not stop the cluster cleanly: %s", error)
            self.log_file = write_log(launchers, self._ipp.profile_dir, self._ipp.cluster_id)
        self._stop_zygote(keep=self._restarting)
        # Left now: helpers (schedulers, nannies) whose controller and engines are gone, and
        # processes that ignored the stop; they get REAP_GRACE_S, then are killed (a stop
        # takes at most 5 s).
        self._processes.reap(min(self._plan.timeout, REAP_GRACE_S))
        self._ipp = None
        self._client = None
        self._engines = ()
        self._processes = ProcessSet()
        self._broken = None
        self._repaired = None
        self._reform_pending = None
        self._rendezvous = None
        self._group_prefix = None
        self._inflight = {}
        self._state = "stopped"
        live_clusters.discard(self)

    @property
    def processes(self) -> tuple[int, ...]:
        """Pids of the cluster's processes seen so far (controller, engines, nannies)."""
        self._record_processes()
        return self._processes.pids
