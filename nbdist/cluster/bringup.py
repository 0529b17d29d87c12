"""How `Cluster.start` brings a cluster up: launch the processes, then join the group.

- `_launch`: the engines (before the controller, for local engines: they import torch while
  it comes up and wait for its connection file), the controller, the client; then waits for
  every engine to register, sending each one its first requests (attach, describe) the moment
  it registers (`Greeter`), so that they run while the others are still registering;
- `_join`: ranks the engines from their descriptions and bootstraps every engine at once:
  torchrun variables, torch threads, a `MultiWorkerMirroredStrategy` named `strategy`.

Each step is a stage of the start's `StartClock` (`start_report`), said as it happens. The
methods (a mixin of `Cluster`) work on its own fields: its start-up, kept out of `engines.py`.

Example (starts processes, so not run here)::

    cluster._launch(deadline)   # engines registered, attached, described
    cluster._join(deadline)     # one process group
    join(cluster, deadline, greeter)     # one torch.distributed group
"""

from __future__ import annotations

import logging
import socket
from typing import Any

from nbdist._private_api import client_location
from nbdist.cluster.addresses import store_peers
from nbdist.cluster.engine_side import joining
from nbdist.cluster.errors import ClusterStartError, EngineTimeoutError
from nbdist.cluster.launch.launchers import (
    ROUTE_TO_HOSTS,
    SPARE_CONTROLLER_LAUNCHER,
    IpyparallelSettings,
    for_start,
    probe_hosts,
)
from nbdist.cluster.launch.lockdown import private_dirs, private_files
from nbdist.cluster.launch.slurm_jobs import JobWatch
from nbdist.cluster.launch.startup import (
    launch_failure,
    probe_timeout,
    rank_engines,
    wait_all,
    wait_for_registration,
)
from nbdist.cluster.launch.stop_log import keep_crash_output
from nbdist.cluster.launch.zygote import (
    Zygote,
    return_spare,
    start_spare_controller,
    take_spare,
    take_spare_controller,
)
from nbdist.cluster.status import EngineInfo

__all__ = ["ATTACH", "BringUp", "Greeter", "controller_address"]

ATTACH = (
    "import nbdist.cluster.engine_side.state as _nbdist_engine_state\n"
    "import nbdist.cluster.engine_side.guards as _nbdist_engine_guards\n"
    "_nbdist_engine_state.attach(get_ipython().user_ns)\n"
    "_nbdist_engine_guards.refuse_exit(get_ipython())\n"
    "del _nbdist_engine_state, _nbdist_engine_guards\n"
)
"""The first code every engine runs: remember its namespace; `exit()` and `quit()` are refused
there from now on (`engine_side.guards.refuse_exit`)."""


class Greeter:
    """Sends each engine its first requests as soon as it registers: attach, then describe.

    Both are queued on the engine at once (one engine runs its requests in order), so there is
    no round trip between them, and engine 0's are done while engine 1 still registers.
    """

    def __init__(self, client: Any, address: str):
        self._client = client
        self._address = address
        self.sent: dict[int, tuple[Any, Any]] = {}

    def __call__(self, ids: list[int]) -> None:
        for engine_id in ids:
            if engine_id not in self.sent:
                view = self._client.direct_view([engine_id])
                self.sent[engine_id] = (
                    view.execute(ATTACH, block=False),
                    view.apply_async(joining.describe, self._address),
                )

    def described(
        self, ids: list[int], deadline: float, timeout: float, fix: str = ""
    ) -> list[Any]:
        """Every engine's description (attached first), in the order of `ids`."""
        self(ids)
        from ipyparallel.client.asyncresult import AsyncResult

        attached = AsyncResult.join(*(self.sent[i][0] for i in ids))
        wait_all(attached, deadline, "attaching", timeout, fix)
        described = AsyncResult.join(*(self.sent[i][1] for i in ids))
        return wait_all(described, deadline, "describing", timeout, fix)


class BringUp:
    """`Cluster`'s start-up (a mixin of it): `_launch` starts the processes and waits for
    their registration, `_join` bootstraps every engine into the process group. A subclass
    whose `_join` does its own requests (`PSCluster`) gets no greeter."""

    plan: Any
    _settings: IpyparallelSettings
    _clock: Any
    _ipp: Any
    _client: Any
    _greeter: Greeter | None
    _rendezvous: tuple[str, int] | None
    _store_peers: list[str]
    _group_prefix: str | None
    _engines: tuple[EngineInfo, ...]

    _processes: Any
    _zygote: Zygote | None = None

    def _exited_engine(self, identifier: Any) -> str | None:
        """ "replica R's engine (pid P)" for the engine launcher `identifier` that has just
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

    def _record_processes(self) -> None:
        """Remember every process of the cluster (controller, schedulers, engines, nannies)."""
        roots: list[Any] = [self._zygote.pid if self._zygote is not None else None]
        if self._ipp is not None:
            roots.append(getattr(getattr(self._ipp, "controller", None), "process", None))
            for engine_set in list(getattr(self._ipp, "engines", {}).values()):
                roots.append(getattr(engine_set, "process", None))  # mpiexec
                for launcher in list(getattr(engine_set, "launchers", {}).values()):
                    roots.append(getattr(launcher, "process", None))
        here = socket.gethostname()
        roots += [info.pid for info in self._engines if info.host == here]
        self._processes.record(roots)

    def _launch(self, deadline: float) -> None:
        """Start the controller and engines, connect the client, wait for registration; keep the
        `Greeter` that sent the registered engines their first requests (None for a cluster
        whose `_join` does its own)."""
        greet = type(self)._join is BringUp._join  # noqa: SLF001 (a method of this class)
        import ipyparallel

        plan = self.plan
        settings: IpyparallelSettings = self._settings
        clock = self._clock
        clock.stage("imports done (nbdist, ipyparallel; torch waits for first use)")
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
            clock.stage(f"ssh reaches {len(plan.hosts)} host(s), nbdist is installed there")
        threads = max(1, joining.cores() // plan.n)
        engine_env = {
            "OMP_NUM_THREADS": str(threads),
            "MKL_NUM_THREADS": str(threads),
            "MPLBACKEND": "Agg",  # engines have no screen; %%distribute shows figures
        }
        # the controller listens on the address that reaches the hosts, never on every one
        settings = self._settings = for_start(settings, plan)
        cluster_kwargs = settings.cluster_kwargs
        if settings.zygote:  # Note [Engines from a zygote] in launchers.py
            cluster_kwargs = self._start_zygote(deadline, engine_env)
        ipp = self._ipp = ipyparallel.Cluster(**cluster_kwargs)
        private_dirs(ipp.profile_dir)  # connection files, keys and logs: owner only
        ipp.log = ipp_logger(ipp.cluster_id, settings.cluster_kwargs["log_level"])
        keep_crash_output(ipp.log, ipp.profile_dir, ipp.cluster_id, self._exited_engine)
        if not settings.engines_first:
            ipp.start_controller_sync()
            spare = "controller_launcher_class" in cluster_kwargs
            clock.stage("spare controller took over (its imports done while warm)" if spare
                        else "controller process launched")  # fmt: skip
        for count, environment in plan.engine_sets():
            env = dict(engine_env)
            env.update(environment)
            try:
                ipp.start_engines_sync(n=count, environment=env)
            except (ClusterStartError, EngineTimeoutError):  # the zygote's (with its output)
                raise
            except Exception as error:
                raise ClusterStartError(launch_failure(plan, error)) from error
        if settings.zygote:
            clock.stage(f"{plan.n} engine(s) forked from the zygote (torch imported once)")
        else:
            clock.stage(f"{plan.n} engine process(es) launched")
        if settings.engines_first:
            ipp.start_controller_sync()
            clock.stage("controller process launched (the engines import torch meanwhile)")
        self._record_processes()
        client = self._client = ipp.connect_client_sync()
        clock.stage("connected to the controller")
        private_files(ipp.profile_dir, ipp.cluster_id)
        greeter = Greeter(client, controller_address(settings, client)) if greet else None
        watch = JobWatch(ipp.engines.values()).check if plan.launcher == "slurm" else None
        wait_for_registration(
            ipp, client, plan, deadline, clock.stage, on_registered=greeter, job_problem=watch
        )
        self._record_processes()
        self._greeter = greeter

    def _start_zygote(self, deadline: float, env: dict[str, str]) -> dict[str, Any]:
        """Launch the engine zygote (its imports overlap the controller's start); the
        ipyparallel `Cluster` arguments whose launcher asks it for the engines."""
        import copy
        import time

        remaining = max(1.0, deadline - time.monotonic())
        kept = self._zygote  # the one that forked the engines before a restart
        if kept is not None and kept.process.poll() is None:
            said = "engine zygote kept from the last start (torch imported already)"
        else:
            kept = take_spare()  # started by `%dist start` before its imports, or kept warm
            said = "engine zygote taken (launched before this start: its imports overlap)"
        if kept is None:
            kept = Zygote.start(remaining, env)
            said = "engine zygote launched (it imports torch for every engine)"
        zygote = self._zygote = kept
        zygote.timeout = remaining
        zygote.limit = self.plan.timeout
        self._processes.record([zygote.pid])
        self._clock.stage(said)
        kwargs = dict(self._settings.cluster_kwargs)
        config = kwargs["config"] = copy.deepcopy(kwargs["config"])
        config.ZygoteEngineLauncher.zygote_socket = zygote.socket_path
        spare = take_spare_controller()  # kept warm: ipyparallel's controller imported already
        if spare is not None:
            spare.timeout = remaining
            spare.limit = self.plan.timeout
            kwargs["controller_launcher_class"] = SPARE_CONTROLLER_LAUNCHER
            config.SpareControllerLauncher.spare_socket = spare.socket_path
        return kwargs

    def _stop_zygote(self, keep: bool = False) -> None:
        """Stop the zygote (the engines it forked are stopped before; any left, it stops);
        with `keep` (a restart), keep it running for the next start instead."""
        zygote, self._zygote = self._zygote, None
        if zygote is None:
            return
        if keep and zygote.process.poll() is None:
            self._zygote = zygote
            self._processes.forget([zygote.pid])  # not reaped with the engines' nannies
        elif return_spare(zygote):  # kept warm for the next cluster (`%dist warm on`)
            self._processes.forget([zygote.pid])
        else:
            zygote.stop()
        start_spare_controller()  # when kept warm: the next start (or this restart) takes it

    def _join(self, deadline: float) -> None:
        """Bootstrap every engine at once, in rank order; record them."""
        greeter = self._greeter
        plan = self.plan
        client = self._client
        ids = sorted(client.ids)[: plan.n]
        greeter = greeter or Greeter(client, controller_address(self._settings, client))
        described = greeter.described(ids, deadline, plan.timeout)
        ranked = rank_engines(plan, ids, described)
        peers = store_peers([d["address"] for d in described], ranked[0][2]["master_addr"])
        for _, _, config in ranked:
            config["peers"] = peers  # Note [Store peers]
        self._store_peers = peers
        results = [
            client.direct_view([engine_id]).apply_async(joining.bootstrap, config)
            for engine_id, _, config in ranked
        ]
        from ipyparallel.client.asyncresult import AsyncResult

        booted = wait_all(AsyncResult.join(*results), deadline, "joining the group", plan.timeout)
        backend = booted[0].get("backend", "?") if booted else "?"
        first = ranked[0][2]
        self._rendezvous = (str(first["master_addr"]), int(first["master_port"]))
        self._group_prefix = booted[0].get("prefix") if booted else None
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
        self._clock.stage(f"{plan.n} engines joined one torch.distributed group ({backend})")


def controller_address(settings: IpyparallelSettings, client: Any) -> str:
    """The controller's address as engines reach it (they report their own from it)."""
    if settings.controller_ip not in ("*", ROUTE_TO_HOSTS):
        return settings.controller_ip  # 127.0.0.1, or the address chosen for the hosts
    location = client_location(client)
    return str(location or socket.gethostname())


def ipp_logger(cluster_id: str, level: int) -> logging.Logger:
    """The logger of one ipyparallel cluster and its launchers (its own, not the kernel's
    application logger that ipyparallel picks inside Jupyter, so filters added to it touch
    this cluster only). Its records go to the root logger's handlers: in a kernel, the cell.
    """
    logger = logging.getLogger(f"nbdist.cluster.ipyparallel.{cluster_id}")
    logger.setLevel(level)
    return logger
