"""`PSCluster`: `nd.Cluster(n, strategy="parameter_server", num_ps=1)`: engines as the worker
and ps tasks of a `ParameterServerStrategy`, the notebook as its chief.

The last `num_ps` engines (in `hosts`' order with `launcher="ssh"`) become ps tasks, each
serving its variables on a free port of the address that reaches the notebook (127.0.0.1 on
this machine; Note [PS engines across hosts]); the others are workers, reached through
`ps_dispatch.EngineChannel`. `cluster.strategy`
is the chief's `ParameterServerStrategy`, `cluster.coordinator` its `ClusterCoordinator`.
`restart_worker(i)` starts a fresh engine in place of worker `i` (one that died); the
coordinator sends it work and rebuilds its per-worker datasets there.

Example (starts processes, so not run here)::

    with nd.Cluster(n=3, strategy="parameter_server", num_ps=1) as cluster:
        with cluster.strategy.scope():
            model = torch.nn.Linear(4, 1)
        cluster.coordinator.schedule(step, args=(model,))
"""

from __future__ import annotations

import time
from typing import Any

from nbdist.cluster.engines import Cluster
from nbdist.cluster.errors import EngineTimeoutError
from nbdist.cluster.launch.startup import wait_all
from nbdist.cluster.status import EngineInfo
from nbdist.errors import ArgumentTypeError, InvalidArgumentError

__all__ = ["PSCluster"]


class PSCluster(Cluster, strategy="parameter_server"):
    """Engines as ParameterServerStrategy tasks; see the module docstring.

    Args:
        n: Engines in all (workers + ps tasks); default `num_ps + 2`.
        num_ps: Engines that are ps tasks (at least 1, fewer than `n`).
        variable_partitioner: As `nd.ParameterServerStrategy`'s: None, or a callable
            `(shape, dtype) -> [k, 1, ...]` such as
            `nd.experimental.partitioners.FixedShardsPartitioner(2)`.
        Other arguments as `nd.Cluster` (CPU engines, on this machine or with
            `launcher="ssh", hosts="h1:1,h2:1,h3:1"` on hosts: the last host's are the ps).
    """

    def __init__(
        self,
        n: int | None = None,
        gpus: Any = None,
        hosts: Any = None,
        launcher: str = "local",
        backend: str = "auto",
        strategy: str = "parameter_server",
        timeout: float = 120.0,
        *,
        num_ps: int = 1,
        variable_partitioner: Any = None,
        **kwargs: Any,
    ):
        if variable_partitioner is not None and not callable(variable_partitioner):
            raise ArgumentTypeError(
                "variable_partitioner must be None or a callable (shape, dtype) -> [k, 1, ...], "
                f"got {variable_partitioner!r}; e.g. "
                "nd.experimental.partitioners.FixedShardsPartitioner(2)."
            )
        if isinstance(num_ps, bool) or not isinstance(num_ps, int):
            raise ArgumentTypeError(
                f"num_ps must be a whole number, got {num_ps!r}; e.g. num_ps=1."
            )
        if num_ps < 1:
            raise InvalidArgumentError(
                f"num_ps={num_ps}: a ParameterServerStrategy needs at least one ps task; pass "
                "num_ps=1."
            )
        if n is None and hosts is None:
            n = num_ps + 2  # with hosts, their counts decide
        self._check_workers(n, num_ps)
        if gpus not in (None, "none"):
            raise InvalidArgumentError(
                f"gpus={gpus!r}: strategy='parameter_server' starts CPU engines; leave gpus out."
            )
        super().__init__(n, "none", hosts, launcher, backend, "parameter_server", timeout, **kwargs)
        self._check_workers(self._plan.n, num_ps)
        options = self._plan.communication
        if options.bytes_per_pack or options.compression:
            raise InvalidArgumentError(
                "communication_options of a parameter_server cluster set only the timeout "
                "(timeout_seconds, or collective_timeout=); bytes_per_pack and compression "
                "are for strategy='mirrored' or 'multi_worker'."
            )
        self.num_ps = num_ps
        self.variable_partitioner = variable_partitioner
        """The partitioner the chief's strategy splits variables with (None: no split)."""
        self._ps_strategy: Any = None
        self._coordinator: Any = None
        self.roles: tuple[str, ...] = ()
        """Per engine (in `engines` order): `"worker"` or `"ps"`."""

    @staticmethod
    def _check_workers(n: Any, num_ps: int) -> None:
        if isinstance(n, int) and not isinstance(n, bool) and n - num_ps < 1:
            raise InvalidArgumentError(
                f"n={n} engines with num_ps={num_ps} leaves no worker: n (or the hosts' "
                "counts) counts workers and ps tasks together; pass e.g. "
                f"n={num_ps + 2}, num_ps={num_ps}."
            )

    @property
    def num_workers(self) -> int:
        return self._plan.n - self.num_ps

    @property
    def strategy(self) -> Any:
        """The chief's `ParameterServerStrategy` over these engines."""
        self._require_running("cluster.strategy")
        return self._ps_strategy

    @property
    def coordinator(self) -> Any:
        """The `ClusterCoordinator` of `strategy` (created on first use)."""
        self._require_running("cluster.coordinator")
        if self._coordinator is None:
            from nbdist.strategies.parameter_server import ClusterCoordinator

            self._coordinator = ClusterCoordinator(self._ps_strategy)
        return self._coordinator

    def _join(self, deadline: float) -> None:
        from ipyparallel.client.asyncresult import AsyncResult

        from nbdist.cluster.bringup import controller_address
        from nbdist.cluster.engine_side.joining import describe
        from nbdist.cluster.launch.startup import rank_engines
        from nbdist.cluster_resolver import ClusterSpec, SimpleClusterResolver
        from nbdist.strategies.parameter_server import ParameterServerStrategy, ps_task

        plan = self._plan
        client = self._client
        # Note [PS engines across hosts]: engines are ordered as the other clusters' ranks
        # (by host, in `hosts`' order), so the last `num_ps` (the ps tasks) are on the last
        # host(s) named, whatever order they registered in. Each reports the address its
        # traffic to the controller leaves from (127.0.0.1 on this machine); a ps task
        # listens on that address only, and the notebook and the workers reach it there.
        controller = controller_address(self._settings, client)
        registered = sorted(client.ids)[: plan.n]
        described = wait_all(
            client.direct_view(registered).apply_async(describe, controller),
            deadline,
            "describing",
            plan.timeout,
        )
        ranked = rank_engines(plan, registered, described)
        ids = [engine_id for engine_id, _, _ in ranked]
        info = {engine_id: described for engine_id, described, _ in ranked}
        workers, ps_ids = ids[: self.num_workers], ids[self.num_workers :]
        served = wait_all(
            AsyncResult.join(*(
                client.direct_view([i]).apply_async(ps_task.start_here, info[i]["address"])
                for i in ps_ids
            )),
            deadline,
            "starting the ps tasks",
            plan.timeout,
        )  # fmt: skip
        spec = ClusterSpec(
            {
                "chief": [f"{controller}:0"],
                "worker": [f"{info[i]['address']}:{info[i]['free_port']}" for i in workers],
                "ps": [s["address"] for s in served],
            }
        )
        strategy = ParameterServerStrategy(
            SimpleClusterResolver(spec, task_type="chief", task_id=0),
            variable_partitioner=self.variable_partitioner,
        )
        strategy.timeout = plan.collective_timeout
        from nbdist.cluster.ps_dispatch import EngineChannel  # the PS strategy: torch

        strategy.worker_channels = [
            EngineChannel(self._client, eid, f"/job:worker/task:{i}")
            for i, eid in enumerate(workers)
        ]
        self._ps_strategy = strategy
        self.roles = ("worker",) * len(workers) + ("ps",) * len(ps_ids)
        self._engines = tuple(
            EngineInfo(
                id=eid, rank=rank, host=info[eid]["host"], pid=info[eid]["pid"], device="cpu"
            )
            for rank, eid in enumerate(ids)
        )
        self._progress(
            f"{len(workers)} worker engine(s) and {len(ps_ids)} ps engine(s) ready "
            f"(ps at {', '.join(s['address'] for s in served)})"
        )

    def restart_worker(self, index: int) -> None:
        """Start a fresh engine as worker `index` (after the old one died); the coordinator
        gives it work as soon as it is registered. Engines on this machine only (an ssh
        cluster's workers are on hosts: an `InvalidArgumentError` says what to do instead)."""
        self._require_running("cluster.restart_worker")
        if (
            isinstance(index, bool)
            or not isinstance(index, int)
            or not 0 <= index < self.num_workers
        ):
            raise InvalidArgumentError(
                f"worker index {index!r} is not one of 0..{self.num_workers - 1}."
            )
        if self._plan.launcher != "local":
            raise InvalidArgumentError(
                "cluster.restart_worker(i) starts a fresh engine on this machine; this cluster's "
                f"engines run on hosts over {self._plan.launcher}. Its other workers run the "
                "dead worker's functions meanwhile; for a fresh cluster run `%dist restart` "
                "(cluster.restart()) and restore the model from the last checkpoint "
                "(docs/parameter-server.md)."
            )
        from nbdist.cluster.engine_side.joining import describe

        before = set(self._client.ids)
        deadline = time.monotonic() + self._plan.timeout
        self._ipp.start_engines_sync(n=1, environment={"OMP_NUM_THREADS": "1", "MPLBACKEND": "Agg"})
        while True:
            fresh = set(self._client.ids) - before - {e.id for e in self._engines}
            if fresh:
                break
            if time.monotonic() > deadline:
                raise EngineTimeoutError(
                    f"The engine replacing worker {index} did not register within "
                    f"{self._plan.timeout:g} s."
                )
            time.sleep(0.1)  # polling the controller's registrations
        eid = min(fresh)
        described = (
            self._client.direct_view([eid])
            .apply_async(describe, "127.0.0.1")
            .get(timeout=self._plan.timeout)
        )
        described = described[0] if isinstance(described, list) else described
        engines = list(self._engines)
        engines[index] = EngineInfo(
            id=eid, rank=index, host=described["host"], pid=described["pid"], device="cpu"
        )
        self._engines = tuple(engines)
        self._record_processes()
        from nbdist.cluster.ps_dispatch import EngineChannel

        self._ps_strategy.worker_channels[index] = EngineChannel(
            self._client, eid, f"/job:worker/task:{index}"
        )

    def _teardown(self) -> None:
        if self._coordinator is not None:
            self._coordinator.shutdown()
            self._coordinator = None
        if self._ps_strategy is not None:
            self._ps_strategy.close()
            self._ps_strategy = None
        super()._teardown()

    def __repr__(self) -> str:
        state = self._state
        return (
            f"<nbdist.Cluster (parameter_server): {self.num_workers} worker and {self.num_ps} "
            f"ps engine(s), {state}>"
        )
