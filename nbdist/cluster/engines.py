"""`Cluster`: ipyparallel engines joined in one `torch.distributed` group, from a notebook.

`Cluster(n=2).start()` starts an ipyparallel controller and `n` engines on this machine (or
one engine per GPU, each pinned with `CUDA_VISIBLE_DEVICES`), then bootstraps every engine at
once (`engine_side.joining.bootstrap`): torchrun variables, torch threads, and a
`MultiWorkerMirroredStrategy` kept in the engine's namespace as `strategy`. `cluster.strategy`
is the notebook's side of it (`EngineStrategy`). `stop()` leaves no process behind: it stops
ipyparallel's controller and engines, then waits, under a deadline, for every process of the
cluster (the controller's schedulers and the engines' nannies included) and kills what is left.

The controller and the rendezvous listen on 127.0.0.1. Imports ipyparallel when a cluster
starts, not on import.

`Cluster` is this module's lifecycle (arguments, start, stop, restart) and the call path, put
together with mixins that each do one job: `turns.CallGuard` (call checks, group health),
`bringup.BringUp` (launch, join), `scaling.Scaling` (resize), `namespaces.EngineNamespaces`
(push, pull), `inspection.Inspection` (status, stacks) and `stopping.Stopping` (teardown).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, ClassVar

from nbdist.cluster.bringup import BringUp
from nbdist.cluster.engine_calls import call_engines
from nbdist.cluster.engine_strategy import EngineStrategy
from nbdist.cluster.errors import (
    ClusterInterrupted,
    ClusterStartError,
    ClusterStoppedError,
    EngineTimeoutError,
)
from nbdist.cluster.inspection import Inspection
from nbdist.cluster.launch.launchers import ipyparallel_settings
from nbdist.cluster.launch.plan import LaunchPlan, make_plan, with_communication
from nbdist.cluster.launch.processes import ProcessSet
from nbdist.cluster.launch.startup import engines_exited, output_tail, quiet
from nbdist.cluster.namespaces import EngineNamespaces
from nbdist.cluster.scaling import Scaling, SizeChange
from nbdist.cluster.sigint import interrupts_deferred
from nbdist.cluster.start_report import StartClock, StartReport
from nbdist.cluster.status import EngineInfo
from nbdist.cluster.stopping import (  # the constants: still importable from here
    REAP_GRACE_S,  # noqa: F401
    SSH_SHUTDOWN_S,  # noqa: F401
    Stopping,
    live_clusters,
    stop_at_exit,
)
from nbdist.cluster.turns import CallGuard
from nbdist.core.reduce.options import CommunicationOptions
from nbdist.errors import InvalidArgumentError

__all__ = ["Cluster"]

class Cluster(CallGuard, BringUp, Scaling, EngineNamespaces, Inspection, Stopping):
    """Engines for a notebook: one replica each, joined in one `torch.distributed` group.

    Args:
        n: Number of engines. Default: one per visible GPU, else 2 CPU engines.
        gpus: `"all"` (one engine per GPU), GPU indices (`[0, 2]` or `"0,2"`), or `"none"`
            for CPU engines on a GPU machine. Default: the GPUs if there are any.
        hosts: `"h1:2,h2:2"` (`[user@]HOST[:COUNT]`) for engines on other machines, with
            launcher ssh, mpi or slurm. The controller then listens on the address of this
            machine on the route to the first host (or `launcher_options={"controller_ip":
            ...}`), never on every interface, and the rendezvous on the first engine's address.
        launcher: `"local"` (this machine), `"ssh"` (needs hosts; ssh must log in without a
            password), `"mpi"` (`mpiexec`; needs mpi4py) or `"slurm"` (an `sbatch` job of
            `n` tasks). All are ipyparallel's engine-set launchers.
        backend: `"auto"` (NCCL on GPUs, gloo on CPUs), `"gloo"` or `"nccl"`.
        strategy: `"mirrored"` or `"multi_worker"` (both: one replica per engine in one group),
            `"fully_sharded"` (the same, with `nd.experimental.FullyShardedStrategy`: models
            created in `strategy.scope()` are sharded over the engines; docs/sharding.md),
            or `"parameter_server"`: engines as worker and ps tasks of a
            `ParameterServerStrategy` (`num_ps=1` of them ps tasks; `nbdist.cluster.ps_cluster`).
        timeout: Seconds for the engines to start and join the group (and to stop).
        collective_timeout: Seconds a collective on the engines waits for every engine before
            it fails naming the ones that did not arrive (default 300 s). Raise it when the
            engines' steps take very different times (e.g. one engine evaluates or saves while
            the others wait); lower it to learn sooner of an engine that hangs. `%dist start
            --collective-timeout S`.
        communication_options: `nd.experimental.CommunicationOptions` of the engines'
            `MultiWorkerMirroredStrategy` (`timeout_seconds`, `bytes_per_pack`,
            `compression`; `implementation` must agree with `backend`). With
            `strategy="parameter_server"` only the timeout applies (the coordinator's
            `strategy.timeout`).
        profile_dir: ipyparallel profile directory (default: `$IPYTHONDIR/profile_default`).
        heartbeat_period: Seconds between the controller's heartbeats. Registration waits
            for one, so a short period starts engines sooner; an engine is unregistered after
            missing 10 s of beats (at least 10 beats).
        launcher_options: Settings of ipyparallel's engine-set launcher, e.g.
            `{"remote_python": "/opt/venv/bin/python", "ssh_args": ["-p", "2222"]}` for ssh,
            `{"mpi_args": [...]}`, `{"account": "...", "timelimit": "1:00:00"}` for Slurm.

    Raises:
        ValueError, TypeError: invalid arguments (see `plan.make_plan` and
            `plan.with_communication`),
            or a launcher option that ipyparallel's launcher does not have.
        RuntimeError: launcher="mpi" without `mpiexec` or mpi4py.

    Example (starts processes, so not run here)::

        with nd.Cluster(n=2) as cluster:
            out = cluster.strategy.run(lambda: nd.get_replica_context().replica_id_in_sync_group)
            print(out)      # PerReplica:{0: 0, 1: 1}
    """

    # strategy name -> the subclass `Cluster(strategy=name)` creates (`__init_subclass__`)
    _by_strategy: ClassVar[dict[str, type[Cluster]]] = {}

    def __init_subclass__(cls, *, strategy: str | None = None, **kwargs: Any) -> None:
        """Register a subclass that `Cluster(strategy=<strategy>)` creates, e.g.
        `class PSCluster(Cluster, strategy="parameter_server")`: the subclass's module imports
        this one, never the reverse (no import cycle); `nbdist.cluster` imports both."""
        super().__init_subclass__(**kwargs)
        if strategy is not None:
            Cluster._by_strategy[strategy] = cls

    def __new__(
        cls,
        n: int | None = None,
        gpus: Any = None,
        hosts: Any = None,
        launcher: str = "local",
        backend: str = "auto",
        strategy: str = "mirrored",
        *args: Any,
        **kwargs: Any,
    ) -> Any:
        """The subclass registered for `strategy` (the same parameter, by name or position, as
        `__init__`'s), e.g. `PSCluster` for `strategy="parameter_server"`; else `cls`."""
        if cls is Cluster:
            name = strategy.strip().lower() if isinstance(strategy, str) else None
            if name in Cluster._by_strategy:
                return super().__new__(Cluster._by_strategy[name])
            for option in ("num_ps", "variable_partitioner"):
                if option in kwargs:
                    raise InvalidArgumentError(
                        f"{option} is for strategy='parameter_server', got strategy="
                        f"{strategy!r}; pass strategy='parameter_server' or leave {option} out."
                    )
        return super().__new__(cls)

    def __init__(
        self,
        n: int | None = None,
        gpus: Any = None,
        hosts: Any = None,
        launcher: str = "local",
        backend: str = "auto",
        strategy: str = "mirrored",
        timeout: float = 120.0,
        collective_timeout: float | None = None,
        communication_options: CommunicationOptions | None = None,
        *,
        profile_dir: str | None = None,
        heartbeat_period: float = 0.5,
        launcher_options: Mapping[str, Any] | None = None,
    ):
        self._plan: LaunchPlan = with_communication(
            make_plan(n, gpus, hosts, launcher, backend, strategy, timeout),
            collective_timeout,
            communication_options,
        )
        if isinstance(heartbeat_period, bool) or not (
            isinstance(heartbeat_period, (int, float)) and 0.05 <= heartbeat_period <= 60
        ):
            raise InvalidArgumentError(
                f"heartbeat_period must be between 0.05 and 60 seconds, got {heartbeat_period!r}"
                "; e.g. heartbeat_period=1.0 (or leave it out)."
            )
        self._heartbeat_ms = int(heartbeat_period * 1000)
        if launcher_options is not None and not isinstance(launcher_options, Mapping):
            from nbdist.errors import ArgumentTypeError

            raise ArgumentTypeError(
                f"launcher_options must be a dict of launcher settings, got {launcher_options!r}"
                "; e.g. launcher_options={'remote_python': '/opt/venv/bin/python'}."
            )
        self._settings = ipyparallel_settings(
            self._plan,
            heartbeat_ms=self._heartbeat_ms,
            profile_dir=profile_dir,
            options=launcher_options,
        )
        self._ipp: Any = None
        self._client: Any = None
        self._engines: tuple[EngineInfo, ...] = ()
        self._processes = ProcessSet()
        self._state = "stopped"
        self._broken: str | None = None
        self._repaired: str | None = None
        self._reform_pending: str | None = None  # why the group must be formed again once idle
        self._rendezvous: tuple[str, int] | None = None  # the store: rank 0's address, port
        self._group_prefix: str | None = None  # the group generation's prefix in the store
        self._generation = 0
        self._inflight: dict[int, set[Any]] = {}  # engine id -> requests not answered yet
        self._size_history: list[SizeChange] = []  # the start, then each resize (scaling)
        self._turn_lock = threading.Lock()  # Note [One call at a time]
        self._turn_holder: str | None = None
        self.last_replica_check: tuple[float, bool, str] | None = None
        """(wall time, replicas identical, message) of the newest end-of-cell replica check."""
        self._strategy = EngineStrategy(self)
        self._clock = StartClock(quiet)  # the running start's stages (start_report)
        self._progress: Callable[[str], None] = quiet
        self._report: StartReport | None = None
        self._greeter: Any = None
        self.start_seconds: float | None = None
        """Seconds the last start took until every engine had its strategy (the total of
        `start_report()`)."""
        self.log_file: str | None = None
        """After `stop()`: the file with what the engines and the controller printed."""

    # -- properties -----------------------------------------------------------------------
    @property
    def plan(self) -> LaunchPlan:
        """What this cluster starts (engines, GPUs, backend)."""
        return self._plan

    @property
    def num_engines(self) -> int:
        """The number of engines (= replicas)."""
        return self._plan.n

    @property
    def running(self) -> bool:
        """True between a successful `start()` and `stop()`."""
        return self._state == "running"

    @property
    def broken(self) -> str | None:
        """Why the engines' process group is unusable, else None (Note [Cluster health] in
        `calls`): a timeout, an interrupt or a failed collective that left an engine blocked,
        a dead engine, or a group that could not be formed again.

        `strategy.run` and `%%distribute` cells refuse to run (`ClusterUnusableError`) until
        `restart()`; `push` and `pull` still work while no engine is busy.
        """
        return self._broken

    @property
    def repaired(self) -> str | None:
        """What made nbdist form the process group again last (the engines kept their
        variables), else None. Forgotten once a later call or cell succeeds."""
        return self._repaired

    def forget_repair(self) -> None:
        """A call or cell succeeded after the group was formed again: `repaired` is None (so
        `%dist status` stops naming a fault that is over)."""
        self._repaired = None

    @property
    def engines(self) -> tuple[EngineInfo, ...]:
        """The engines in replica order (empty when not running)."""
        return self._engines

    @property
    def strategy(self) -> EngineStrategy:
        """The notebook's strategy over the engines (replica `i` = engine of rank `i`)."""
        self._require_running("cluster.strategy")
        return self._strategy

    @property
    def client(self) -> Any:
        """The connected `ipyparallel.Client`."""
        self._require_running("cluster.client")
        return self._client

    @property
    def connected_client(self) -> Any:
        """The `ipyparallel.Client` while one is connected (from `start` to the end of
        `stop`), else None; never raises, for readers in other threads (the dashboards)."""
        return self._client

    def inflight(self) -> dict[int, tuple[Any, ...]]:
        """The requests (AsyncResults) sent and not answered yet, by engine id: a snapshot,
        safe to take from any thread (the dashboards read it; `track_request` fills it)."""
        return {engine: tuple(requests) for engine, requests in list(self._inflight.items())}

    # -- lifecycle ------------------------------------------------------------------------
    def start(
        self, progress: Callable[[str], None] | None = None, *, began: float | None = None
    ) -> Cluster:
        """Start the controller and engines, and give every engine its strategy.

        Returns when every engine has joined the process group, or raises within `timeout`
        seconds having stopped whatever it started. Does nothing if already running.

        Args:
            progress: Called with a line at each stage as it happens, the seconds since the
                start began first (`"1.3 s  2/2 engines registered"`): imports, engines
                launched, controller started, each engine registered, the group joined. E.g.
                `print`; `%dist start` shows them. `start_report()` has them afterwards.
            began: the `time.perf_counter()` moment the report counts from (default: now);
                `%dist start` passes the moment its line began, so that its imports count.

        Raises:
            EngineTimeoutError: (a `TimeoutError`) the controller or the engines did not start,
                register or join in time; the message names the timeout to raise.
            ClusterInterrupted: (a `KeyboardInterrupt`) Ctrl-C; everything started was stopped.
            ClusterStartError: (a `RuntimeError`) the controller or an engine failed to start,
                or an engine failed to create its strategy; the message has the engine output.
        """
        if self._state == "running":
            return self
        if self._state != "stopped":
            from nbdist.errors import ContextError

            raise ContextError(
                f"Cannot start a cluster that is {self._state}: another thread's start() or "
                "stop() of it has not finished. Wait for that call to return, then call "
                "start() again (on a running cluster it returns at once)."
            )
        stop_at_exit()
        self._clock = StartClock(progress or quiet, began)
        self._progress = self._clock.stage  # a subclass's _join says its stages with it
        deadline = time.monotonic() + self._plan.timeout
        self._state = "starting"
        live_clusters.add(self)
        try:
            self._launch(deadline)
            self._join(deadline)
        except BaseException as error:
            output = "" if isinstance(error, KeyboardInterrupt) else output_tail(self._ipp)
            with interrupts_deferred():  # a second Ctrl-C must not leave processes behind
                self._teardown()
            if isinstance(error, KeyboardInterrupt):
                raise ClusterInterrupted(
                    "Starting the cluster was interrupted (Ctrl-C); every process it had "
                    "started was stopped. Start it again when you are ready."
                ) from None
            if isinstance(error, TimeoutError) and not isinstance(error, EngineTimeoutError):
                # ipyparallel's own wait (the controller's connection files) ran out of time
                error = EngineTimeoutError(
                    f"The controller did not start within timeout={self._plan.timeout:g} s "
                    f"({error}). Raise the timeout (Cluster(timeout=...), or `%dist start "
                    "--timeout S`; the default is 120 s) on a slow or busy machine."
                )
                raise error from None
            if isinstance(error, (ClusterStartError, EngineTimeoutError)):
                if output:
                    error.args = (f"{error.args[0]}\n{output}", *error.args[1:])
                raise
            if type(error).__name__ == "EngineError":  # ipyparallel saw the engine set stop
                raise ClusterStartError(
                    f"{engines_exited(self._plan, 'of the engine set').args[0]}\n{output}"
                ) from None
            raise ClusterStartError(
                f"The cluster failed to start: {type(error).__name__}: {error}\n{output}"
            ) from error
        self._state = "running"
        self._report = self._clock.finish()
        self.start_seconds = self._report.total
        self._size_history = [SizeChange(time.time(), 0, self._plan.n, "start", self.start_seconds)]
        return self

    def start_report(self) -> StartReport | None:
        """What the last start waited for, stage by stage, with its total (None before the
        first start succeeded). `print(cluster.start_report())` shows a table; the total
        counts from the `%dist start` line when the magic started the cluster (its imports
        included), else from `start()`'s call.

        Example (starts processes, so not run here)::

            report = cluster.start_report()
            report.total                                     # 2.9 (seconds)
            [(s.name, s.seconds) for s in report.stages]     # [('imports done ...', 0.4), ...]
        """
        return self._report

    _restarting = False

    def stop(self) -> None:
        """Stop the engines and the controller; return once none of their processes is left.

        Processes still running `timeout` seconds after being asked to stop (or 5 s, if less)
        are killed. Safe to call twice, or on a cluster that never started.
        """
        if self._state == "stopped" and self._ipp is None:
            return
        self._state = "stopping"
        self._teardown()

    def restart(self, progress: Callable[[str], None] | None = None) -> Cluster:
        """Stop and start again: fresh engines and a fresh process group (state is lost).
        The start report's total includes the stop. Local engines are forked again from the
        same zygote, which has kept its imports."""
        began = time.perf_counter()
        self._restarting = True  # the engine zygote stays for the new engines
        try:
            self.stop()
        finally:
            self._restarting = False
        return self.start(progress, began=began)

    def __enter__(self) -> Cluster:
        return self.start()

    def __exit__(self, *exc_info: Any) -> None:
        self.stop()

    # -- repr -----------------------------------------------------------------------------
    def __repr__(self) -> str:
        plan = self._plan
        kind = {
            "gpu": f"GPU engine(s) {list(plan.gpus or ())}",
            "auto": "engine(s) on GPUs where their hosts have them",
            "cpu": "CPU engine(s)",
        }[plan.device_kind]
        ids = f", engines {[e.id for e in self._engines]}" if self._engines else ""
        state = "running, unusable" if self._broken else self._state
        return (
            f"<nbdist.Cluster: {plan.n} {kind}, launcher={plan.launcher!r}, "
            f"backend={plan.backend!r}, {state}{ids}>"
        )

    # -- calling --------------------------------------------------------------------------
    def call(
        self,
        entry: Callable[..., dict[str, Any]],
        payloads: bytes | Sequence[Any],
        *extra: Any,
        timeout: float | None,
        what: str,
        fn: Any = None,
        needs_group: bool = False,
    ) -> list[dict[str, Any]]:
        """`calls.call_engines(self, entry, ...)` in this cluster's turn (Note [One call at a
        time]), after checking that it is running and idle (or its group usable); `entry` is an
        engine-side function (`engine_side.calls.call`, ...), sent by reference."""
        self._require_running(what)
        with self.turn(what, timeout) as deadline:
            self._require_running(what)  # again: another thread may have stopped it meanwhile
            check = self.require_usable if needs_group else self.require_idle
            check(what, wait=self.time_left(what, timeout, deadline))
            self.time_left(what, timeout, deadline)
            return call_engines(
                self, entry, payloads, *extra, timeout=timeout, what=what, fn=fn,
                deadline=deadline,
            )  # fmt: skip

    # -- helpers --------------------------------------------------------------------------
    def _require_running(self, what: str) -> None:
        if self._state != "running":
            raise ClusterStoppedError(
                f"{what} needs running engines, but the cluster is {self._state}. Start it: "
                "cluster.start() (or `with nd.Cluster(...) as cluster:`; in a notebook, "
                "`%dist start`), then run it again."
            )

