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
"""

from __future__ import annotations

import atexit
import concurrent.futures
import contextlib
import logging
import socket
import threading
import time
import weakref
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, ClassVar

from nbdist._private_api import client_location
from nbdist.cluster import _wire
from nbdist.cluster import stacks as engine_stacks
from nbdist.cluster.calls import call_engines
from nbdist.cluster.engine_side import calls as entries
from nbdist.cluster.engine_side import health, joining
from nbdist.cluster.errors import (
    ClusterInterrupted,
    ClusterStartError,
    ClusterStoppedError,
    ClusterUnusableError,
    EngineTimeoutError,
)
from nbdist.cluster.launchers import ipyparallel_settings, probe_hosts
from nbdist.cluster.lockdown import private_dirs, private_files
from nbdist.cluster.plan import LaunchPlan, make_plan, with_communication
from nbdist.cluster.processes import ProcessSet, pid_alive
from nbdist.cluster.remote import EngineStrategy, _has_distributed, _scatter
from nbdist.cluster.replies import interrupt_note, reply_ok
from nbdist.cluster.sigint import interrupts_deferred
from nbdist.cluster.startup import (
    launch_failure,
    output_tail,
    probe_timeout,
    quiet,
    rank_engines,
    wait_all,
    wait_for_registration,
)
from nbdist.cluster.status import EngineInfo, EngineStatus, StatusTable
from nbdist.cluster.stop_log import keep_crash_output, launchers_of, quiet_stop_log, write_log
from nbdist.communication import CommunicationOptions
from nbdist.debug.stacks import ReplicaStack
from nbdist.errors import BusyError, InvalidArgumentError, WorkerLostError
from nbdist.values import PerReplica

__all__ = ["Cluster"]

_LOG = logging.getLogger(__name__)
_ATTACH = (
    "import nbdist.cluster.engine_side.state as _nbdist_engine_state\n"
    "import nbdist.cluster.engine_side.guards as _nbdist_engine_guards\n"
    "_nbdist_engine_state.attach(get_ipython().user_ns)\n"
    "_nbdist_engine_guards.refuse_exit(get_ipython())\n"
    "del _nbdist_engine_state, _nbdist_engine_guards\n"
)
"""The first code every engine runs: remember its namespace; `exit()` and `quit()` are refused
there from now on (`engine_side.guards.refuse_exit`)."""

REAP_GRACE_S = 1.0
"""Seconds what is left of a cluster after ipyparallel's stop gets to exit before it is killed."""

_running: weakref.WeakSet[Cluster] = weakref.WeakSet()
_atexit_registered = False


def _stop_all_at_exit() -> None:
    for cluster in list(_running):
        with contextlib.suppress(Exception):
            cluster.stop()


class Cluster:
    """Engines for a notebook: one replica each, joined in one `torch.distributed` group.

    Args:
        n: Number of engines. Default: one per visible GPU, else 2 CPU engines.
        gpus: `"all"` (one engine per GPU), GPU indices (`[0, 2]` or `"0,2"`), or `"none"`
            for CPU engines on a GPU machine. Default: the GPUs if there are any.
        hosts: `"h1:2,h2:2"` (`[user@]HOST[:COUNT]`) for engines on other machines, with
            launcher ssh, mpi or slurm. The controller then listens on all interfaces, and the
            rendezvous on the first engine's address.
        launcher: `"local"` (this machine), `"ssh"` (needs hosts; ssh must log in without a
            password), `"mpi"` (`mpiexec`; needs mpi4py) or `"slurm"` (an `sbatch` job of
            `n` tasks). All are ipyparallel's engine-set launchers.
        backend: `"auto"` (NCCL on GPUs, gloo on CPUs), `"gloo"` or `"nccl"`.
        strategy: `"mirrored"` or `"multi_worker"` (both: one replica per engine in one group),
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
        self._turn_lock = threading.Lock()  # Note [One call at a time]
        self._turn_holder: str | None = None
        self.last_replica_check: tuple[float, bool, str] | None = None
        """(wall time, replicas identical, message) of the newest end-of-cell replica check."""
        self._strategy = EngineStrategy(self)
        self._progress: Callable[[str], None] = quiet
        self.start_seconds: float | None = None
        """Seconds the last `start()` took until every engine had its strategy."""
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
        `supervisor`): a timeout, an interrupt or a failed collective that left an engine blocked,
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
    def start(self, progress: Callable[[str], None] | None = None) -> Cluster:
        """Start the controller and engines, and give every engine its strategy.

        Returns when every engine has joined the process group, or raises within `timeout`
        seconds having stopped whatever it started. Does nothing if already running.

        Args:
            progress: Called with a short line at each stage (hosts checked, engines
                registered, group joined), e.g. `print`; `%dist start` shows them.

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
        _register_atexit()
        begin = time.perf_counter()
        deadline = time.monotonic() + self._plan.timeout
        self._state = "starting"
        _running.add(self)
        try:
            self._progress = progress or quiet
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
            raise ClusterStartError(
                f"The cluster failed to start: {type(error).__name__}: {error}\n{output}"
            ) from error
        self._state = "running"
        self.start_seconds = time.perf_counter() - begin
        return self

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
        """Stop and start again: fresh engines and a fresh process group (state is lost)."""
        self.stop()
        return self.start(progress)

    def __enter__(self) -> Cluster:
        return self.start()

    def __exit__(self, *exc_info: Any) -> None:
        self.stop()

    # -- engine namespaces ----------------------------------------------------------------
    def push(self, values: dict[str, Any], *, timeout: float | None = None) -> None:
        """Assign `values` (`{name: value}`) in every engine's namespace.

        A `PerReplica` value is scattered: engine `i` gets component `i`.
        """
        if not isinstance(values, dict) or not all(isinstance(k, str) for k in values):
            from nbdist.errors import ArgumentTypeError

            raise ArgumentTypeError(
                f"push takes a dict of {{name: value}} with string names, got {values!r}; "
                "e.g. cluster.push({'lr': 0.1})."
            )
        n = self.num_engines
        parts = [(f"values[{key!r}]", value) for key, value in values.items()]
        if _has_distributed(values):
            payload: Any = [_wire.encode(_scatter(values, i, n), parts) for i in range(n)]
        else:
            payload = _wire.encode(values, parts)
        self.call(entries.store, payload, timeout=timeout, what="cluster.push")

    def pull(self, *names: str, timeout: float | None = None) -> Any:
        """Each engine's value of `name` as one `PerReplica` (a tuple of them for several).

        Names may be dotted paths (`"model.fc.weight"`); tensors come back detached, on the
        CPU.
        """
        from nbdist.cluster.refs import RemoteRef

        if not names:
            from nbdist.errors import ArgumentTypeError

            raise ArgumentTypeError(
                "pull needs at least one variable name, e.g. cluster.pull('loss')."
            )
        for name in names:
            RemoteRef(name)  # checks the name
        payload = _wire.dumps(list(names))
        replies = self.call(entries.fetch, payload, timeout=timeout, what="cluster.pull")
        pulled = tuple(
            PerReplica([reply["value"][k] for reply in replies]) for k in range(len(names))
        )
        return pulled[0] if len(names) == 1 else pulled

    # -- status ---------------------------------------------------------------------------
    def stacks(self, timeout: float = 2.0) -> list[ReplicaStack]:
        """Every engine's live Python stacks, also while a cell runs (`%dist stack`).

        One `nd.debug.ReplicaStack` per replica; engines that are gone or do not answer
        within `timeout` seconds are named by their `state`. Changes nothing on the engines.
        Example: `nd.debug.format_stacks(cluster.stacks())`.
        """
        self._require_running("cluster.stacks()")
        return engine_stacks.stacks(self._engines, timeout)

    def collective_records(self, timeout: float = 2.0) -> dict[int, list[dict[str, Any]]]:
        """Every engine's collective recorder, `{replica: entries}` (oldest first), also
        while a cell runs; `nd.debug.compare_collectives(cluster)` reads it."""
        self._require_running("cluster.collective_records()")
        return engine_stacks.collective_records(self._engines, timeout)

    def status(self) -> StatusTable:
        """One row per engine: replica, engine id, host, pid, device, state.

        `state` is `"alive"` (registered, idle), `"busy"` (running a request sent through
        this cluster: `strategy.run`, `push`, `pull`) or `"dead"` (its process exited or it
        unregistered). (The controller's own queue counts lag behind the replies, so they are
        not used.)
        """
        if not self._engines:
            return StatusTable()
        registered = set(self._client.ids) if self._client is not None else set()
        here = socket.gethostname()
        rows = []
        for info in self._engines:
            alive = info.id in registered and (info.host != here or pid_alive(info.pid))
            busy = bool(self._inflight.get(info.id))
            state = "dead" if not alive else "busy" if busy else "alive"
            rows.append(
                EngineStatus(
                    info.rank, info.id, info.host, info.pid, info.device, state, gpu=info.gpu
                )
            )
        return StatusTable(rows)

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

    # -- starting -------------------------------------------------------------------------
    def _launch(self, deadline: float) -> None:
        import ipyparallel

        plan = self._plan
        settings = self._settings
        if plan.launcher == "ssh" and plan.hosts:
            try:
                probe_hosts(
                    settings,
                    [host for host, _ in plan.hosts],
                    settings.remote_python,
                    probe_timeout(deadline),
                )
            except ConnectionError as error:
                raise ClusterStartError(str(error)) from None
            self._progress(f"ssh reaches {len(plan.hosts)} host(s), nbdist is installed there")
        self._ipp = ipyparallel.Cluster(**settings.cluster_kwargs)
        private_dirs(self._ipp.profile_dir)  # connection files, keys and logs: owner only
        self._ipp.log = _ipp_logger(self._ipp.cluster_id, settings.cluster_kwargs["log_level"])
        keep_crash_output(
            self._ipp.log, self._ipp.profile_dir, self._ipp.cluster_id, self._exited_engine
        )
        threads = max(1, joining.cores() // plan.n)
        if not settings.engines_first:
            self._ipp.start_controller_sync()
        for count, environment in plan.engine_sets():
            env = {
                "OMP_NUM_THREADS": str(threads),
                "MKL_NUM_THREADS": str(threads),
                "MPLBACKEND": "Agg",  # engines have no screen; %%distribute shows figures
            }
            env.update(environment)
            try:
                self._ipp.start_engines_sync(n=count, environment=env)
            except Exception as error:
                raise ClusterStartError(launch_failure(plan, error)) from error
        if settings.engines_first:
            self._ipp.start_controller_sync()
        self._record_processes()
        self._client = self._ipp.connect_client_sync()
        private_files(self._ipp.profile_dir, self._ipp.cluster_id)
        wait_for_registration(self._ipp, self._client, plan, deadline, self._progress)
        self._record_processes()

    def _join(self, deadline: float) -> None:
        """Attach, describe and bootstrap every engine (concurrently), in rank order."""
        plan = self._plan
        ids = sorted(self._client.ids)[: plan.n]
        view = self._client.direct_view(ids)
        wait_all(view.execute(_ATTACH, block=False), deadline, "attaching", plan.timeout)
        described = wait_all(
            view.apply_async(joining.describe, self._controller_address()),
            deadline,
            "describing",
            plan.timeout,
        )
        ranked = rank_engines(plan, ids, described)
        results = [
            self._client.direct_view([engine_id]).apply_async(joining.bootstrap, config)
            for engine_id, _, config in ranked
        ]
        from ipyparallel.client.asyncresult import AsyncResult

        booted = wait_all(AsyncResult.join(*results), deadline, "joining the group", plan.timeout)
        backend = booted[0].get("backend", "?") if booted else "?"
        first = ranked[0][2]
        self._rendezvous = (str(first["master_addr"]), int(first["master_port"]))
        self._group_prefix = booted[0].get("prefix") if booted else None
        self._progress(f"{plan.n} engines joined one torch.distributed group ({backend})")
        self._engines = tuple(
            EngineInfo(
                id=engine_id,
                rank=config["rank"],
                host=info["host"],
                pid=info["pid"],
                device=boot["device"],
                gpu=info["cuda_visible_devices"] if plan.gpus else None,
                stacks=tuple(boot["stacks"]) if boot.get("stacks") else None,
            )
            for (engine_id, info, config), boot in zip(ranked, booted)
        )

    def _controller_address(self) -> str:
        """The controller's address as engines reach it (they report their own from it)."""
        if self._settings.controller_ip == "127.0.0.1":
            return "127.0.0.1"
        location = client_location(self._client)
        return str(location or socket.gethostname())

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

    # Note [One call at a time]: every call into the engines (`strategy.run`, `run_steps`,
    # `push`, `pull`, a `%%distribute` cell) holds the cluster's turn from its checks to its
    # last reply, so the busy check and the submission are one step: two notebook threads
    # calling at once can never send requests whose collectives pair with each other's (they
    # gave wrong values, the replicas even disagreeing). A second call waits its turn, and
    # its timeout covers the wait; past it, `BusyError` names the call it waited for.
    @contextlib.contextmanager
    def turn(self, what: str, timeout: float | None = None) -> Iterator[float | None]:
        """Hold the cluster for one call (Note [One call at a time]); yields the call's
        deadline on `time.monotonic()`'s clock (None: no limit), `timeout` s after it began
        to wait (`time_left` says what is left).

        Raises:
            BusyError: (a `TimeoutError`) another thread's call still held the cluster after
                `timeout` seconds; nothing was sent.
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        if timeout is None:
            acquired = self._turn_lock.acquire()
        else:
            acquired = self._turn_lock.acquire(timeout=timeout)
        if not acquired:
            raise BusyError(
                f"{what} waited {timeout:g} s for {self._turn_holder or 'another call'} to "
                "finish, and was not sent. Calls into one cluster from several threads run "
                "one at a time (the cluster is usable): give this call a longer timeout, or "
                "call the cluster from one thread."
            )
        self._turn_holder = f"{what} (thread {threading.current_thread().name!r})"
        try:
            yield deadline
        finally:
            self._turn_holder = None
            self._turn_lock.release()

    def time_left(self, what: str, timeout: float | None, deadline: float | None) -> float | None:
        """Seconds left until `deadline` (None: no limit); `BusyError` when waiting for earlier
        calls used up the call's `timeout`."""
        if deadline is None:
            return None
        left = deadline - time.monotonic()
        if left > 0:
            return left
        raise BusyError(
            f"{what} waited {timeout:g} s for earlier calls into the cluster to finish, and "
            "was not sent. Calls into one cluster run one at a time (the cluster is usable): "
            "give this call a longer timeout."
        )

    def track_request(self, engine_id: int, request: Any) -> None:
        """Count `request` (an AsyncResult) as running on the engine until it is answered."""
        pending = self._inflight.setdefault(engine_id, set())
        pending.add(request)
        request.add_done_callback(pending.discard)

    def require_alive(self, what: str, fix: str = "cluster.restart()") -> None:
        """Raise `WorkerLostError` naming the dead engines' replicas before sending `what`.

        A request to a dead engine would never be answered (ipyparallel also refuses to
        address an unregistered engine), so calls check first and name the fix.
        """
        dead = tuple(row.rank for row in self.status() if row.state == "dead")
        if dead:
            raise WorkerLostError(
                f"The engine(s) of replica(s) {list(dead)} are dead (their process exited), so "
                f"{what} was not run. Run {fix} to start fresh engines (engine state is lost), "
                "then run it again.",
                missing=dead,
            )

    def require_usable(
        self, what: str, fix: str = "cluster.restart()", *, wait: float | None = 0.0
    ) -> None:
        """Raise `ClusterUnusableError` naming what happened and `fix` if the process group
        is unusable (Note [Cluster health] in `supervisor`), so `what` never pairs with a stuck
        collective or queues behind a blocked engine; then `require_idle(what, fix, wait)`."""
        if self._broken is not None:
            raise ClusterUnusableError(
                f"{what} was not run: the cluster is unusable because {self._broken}. Run {fix} "
                "to start fresh engines (engine state is lost), then run it again.",
                reason=self._broken,
            )
        self.require_idle(what, fix, wait=wait)
        if self._reform_pending is not None:
            reason, self._reform_pending = self._reform_pending, None
            problem = self.repair(reason)
            if problem is not None:
                self.mark_broken(f"{reason}; forming the process group again failed: {problem}")
                self.require_usable(what, fix)

    def require_idle(
        self, what: str, fix: str = "cluster.restart()", *, wait: float | None = 0.0
    ) -> None:
        """Wait up to `wait` seconds (None: no limit) for engines still running an earlier
        request (`what` would queue behind it). Still busy: `ClusterUnusableError` when the
        cluster is unusable (an engine left blocked), else `BusyError`; either says what a
        replica runs when it caught an interrupt and went on."""
        pending = [request for requests in self._inflight.values() for request in requests]
        if pending and self._broken is None and (wait is None or wait > 0):
            concurrent.futures.wait(pending, timeout=wait)
        busy = [row.rank for row in self.status() if row.state == "busy"]
        if not busy:
            return
        notes = self.busy_notes()
        running = "".join(f" Replica {rank} {notes[rank]}." for rank in busy if rank in notes)
        if self._broken is not None:
            raise ClusterUnusableError(
                f"{what} was not run: replica(s) {busy} are still busy with an earlier request, "
                f"and the cluster is unusable because {self._broken}.{running} Run {fix} to "
                "start fresh engines (engine state is lost).",
                reason=self._broken,
            )
        waited = "" if not wait else f" after {wait:g} s"
        raise BusyError(
            f"{what} was not sent: replica(s) {busy} were still busy with an earlier "
            f"request{waited}.{running} The cluster is usable: run it again once they finish "
            f"(or give it a longer timeout), or run {fix} to stop them (engine state is lost)."
        )

    def busy_notes(self) -> dict[int, str]:
        """`{replica: note}` for engines running on after catching a `KeyboardInterrupt`
        (Note [Caught interrupts] in `supervisor`): what they run now."""
        notes = {}
        for info in self._engines:
            for request in list(self._inflight.get(info.id, ())):
                note = interrupt_note(self._client, request)
                if note:
                    notes[info.rank] = note
        return notes

    def reform_when_idle(self, reason: str) -> None:
        """Form the process group again before the next call that needs it, once every engine
        is idle (an interrupt abandoned it while an engine ran on: Note [Caught interrupts] in
        `supervisor`)."""
        self._reform_pending = self._reform_pending or reason

    def mark_broken(self, reason: str) -> None:
        """Record why the process group is unusable (the first reason is kept) until restart."""
        if self._broken is None:
            self._broken = reason

    def abort_group(self, reason: str) -> bool:
        """Abandon the engines' process group on every engine (Note [Waking a blocked
        collective] in `nbdist.collectives.abort`): collectives blocked in C fail within a
        heartbeat. False when the rendezvous store cannot be reached."""
        if self._rendezvous is None or self._group_prefix is None:
            return False
        if any(row.rank == 0 and row.state == "dead" for row in self.status()):
            return False  # the store died with engine 0, and so did the group's connections
        from nbdist.collectives.abort import request_abort

        addr, port = self._rendezvous
        return request_abort(addr, port, self._group_prefix, reason, timeout=2.0)

    def repair(self, reason: str) -> str | None:
        """Form the process group again on every engine, keeping their Python state; None on
        success (recorded in `repaired`), else what went wrong. Every engine must be idle."""
        self._generation += 1
        generation = f"r{self._generation}"
        ids = [info.id for info in self._engines]
        try:
            result = self._client.direct_view(ids).apply_async(health.reform, generation)
            replies = result.get(timeout=min(self._plan.timeout, 30.0))
        except Exception as error:
            return f"{type(error).__name__}: {error}"
        replies = replies if isinstance(replies, list) else [replies]
        bad = [r for r in replies if not reply_ok(r)]
        if bad:
            reply = bad[0]
            return f"{reply.get('ename')}: {reply.get('evalue')}"
        base = (self._group_prefix or "nbdist/0/").rstrip("/").rpartition("/")[0] or "nbdist"
        self._group_prefix = f"{base}/{generation}/"
        self._repaired = reason
        return None

    def _exited_engine(self, identifier: Any) -> str | None:
        """"replica R's engine (pid P)" for the engine launcher `identifier` that has just
        exited (ipyparallel marks it stopped before it logs the process's output), or None."""
        ipp = self._ipp
        for engine_set in list(getattr(ipp, "engines", {}).values()):
            launcher = getattr(engine_set, "launchers", {}).get(identifier)
            if launcher is None or getattr(launcher, "state", None) != "after":
                continue
            pid = getattr(launcher, "pid", None)
            for info in self._engines:
                if info.pid == pid:
                    return f"replica {info.rank}'s engine (pid {pid})"
        return None

    # -- stopping -------------------------------------------------------------------------
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
                # ssh stop then finds them gone instead of signalling each over ssh.
                with contextlib.suppress(Exception):
                    self._client.shutdown(hub=False, block=True)
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
        _running.discard(self)

    def _record_processes(self) -> None:
        """Remember every process of the cluster (controller, schedulers, engines, nannies)."""
        roots: list[Any] = []
        if self._ipp is not None:
            roots.append(getattr(getattr(self._ipp, "controller", None), "process", None))
            for engine_set in list(getattr(self._ipp, "engines", {}).values()):
                roots.append(getattr(engine_set, "process", None))  # mpiexec
                for launcher in list(getattr(engine_set, "launchers", {}).values()):
                    roots.append(getattr(launcher, "process", None))
        here = socket.gethostname()
        roots += [info.pid for info in self._engines if info.host == here]
        self._processes.record(roots)

    @property
    def processes(self) -> tuple[int, ...]:
        """Pids of the cluster's processes seen so far (controller, engines, nannies)."""
        self._record_processes()
        return self._processes.pids

    # -- helpers --------------------------------------------------------------------------
    def _require_running(self, what: str) -> None:
        if self._state != "running":
            raise ClusterStoppedError(
                f"{what} needs running engines, but the cluster is {self._state}. Start it: "
                "cluster.start() (or `with nd.Cluster(...) as cluster:`; in a notebook, "
                "`%dist start`), then run it again."
            )


def _register_atexit() -> None:
    global _atexit_registered
    if not _atexit_registered:
        atexit.register(_stop_all_at_exit)
        _atexit_registered = True


def _ipp_logger(cluster_id: str, level: int) -> logging.Logger:
    """The logger of one ipyparallel cluster and its launchers (its own, not the kernel's
    application logger that ipyparallel picks inside Jupyter, so filters added to it touch
    this cluster only). Its records go to the root logger's handlers: in a kernel, the cell.
    """
    logger = logging.getLogger(f"nbdist.cluster.ipyparallel.{cluster_id}")
    logger.setLevel(level)
    return logger
