"""`cluster.scale(n)` / `%dist scale N`: grow or shrink a live cluster, keeping its training state.

A mixin of `Cluster` (its methods work on the cluster's fields). One resize, in order:

1. refusals, before anything changes (`ScaleRefusedError`, naming why and the fix): a call or
   cell running, more engines than the machine has room for, a parameter-server cluster,
   engines on other hosts, dead engines without `survivors=True`, state that cannot follow;
2. new engines start in the same ipyparallel controller (as `start` starts them), or the
   engines to remove are chosen (the highest replica ids);
3. the process group is formed at the new size at a fresh rendezvous: the engines that stay
   keep their strategy object (`engine_side.resize.regroup`), new ones create theirs
   (`joining.bootstrap`);
4. replica 0's strategy state is copied to the new engines (`snapshot`/`adopt`), then every
   engine follows (`follow`): datasets re-sharded, iterators continued, sync-on-read values
   shared out, every parameter compared across the replicas, `@nd.on_scale` functions run;
5. the removed engines stop; the size history gets an entry.

What follows and what does not: Note [State that follows] in `engine_side.resize`.

Example (starts processes, so not run here)::

    report = cluster.scale(3)               # 2 -> 3 engines
    print(report)                           # what followed, and the time it took
    cluster.scale(2, keep="replica-batch")
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import signal
import socket
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from nbdist._private_api import launcher_has_exited
from nbdist.cluster import _wire
from nbdist.cluster.addresses import store_peers
from nbdist.cluster.bringup import Greeter, controller_address
from nbdist.cluster.engine_side import joining, resize
from nbdist.cluster.errors import (
    ClusterInterrupted,
    ClusterStartError,
    EngineTimeoutError,
    ScaleFailedError,
    ScaleRefusedError,
)
from nbdist.cluster.launch.processes import pid_alive
from nbdist.cluster.launch.startup import output_tail, wait_all
from nbdist.cluster.replies import reply_ok
from nbdist.cluster.size_history import ScaleReport, SizeChange
from nbdist.cluster.status import EngineInfo
from nbdist.errors import InvalidArgumentError

STOP_GRACE_S = 2.0
"""Seconds an engine removed by a shrink gets to exit after SIGTERM before it is killed."""

__all__ = ["KEEP_MODES", "ScaleReport", "Scaling", "SizeChange", "cpu_engine_limit"]

KEEP_MODES = ("global-batch", "replica-batch")
"""`keep=`: the global batch stays (each replica's batch changes) or each replica's batch stays
(the global batch changes with the number of replicas; scale the learning rate with it)."""


def cpu_engine_limit() -> int:
    """The most CPU engines `scale` starts on this machine: twice its cores, at least 4 (each
    engine is a process holding torch, a few hundred MB)."""
    return max(4, 2 * joining.cores())


class Scaling:
    """`Cluster.scale` and the size history (a mixin of `Cluster`; see the module)."""

    _plan: Any
    _settings: Any
    _ipp: Any
    _client: Any
    _engines: tuple[EngineInfo, ...]
    _inflight: dict[int, set[Any]]
    _broken: str | None
    _repaired: str | None
    _reform_pending: str | None
    _rendezvous: tuple[str, int] | None
    _group_prefix: str | None
    _turn_lock: Any
    _turn_holder: str | None
    _size_history: list[SizeChange]

    if TYPE_CHECKING:  # the Cluster methods used here

        def _require_running(self, what: str) -> None: ...
        def status(self) -> Any: ...
        def _record_processes(self) -> None: ...
        def mark_broken(self, reason: str) -> None: ...

    @property
    def size_history(self) -> tuple[SizeChange, ...]:
        """The cluster's sizes since it started: one `SizeChange` for the start, one per resize."""
        return tuple(getattr(self, "_size_history", ()))

    def scale(
        self,
        n: int | None = None,
        keep: str = "global-batch",
        *,
        survivors: bool = False,
        timeout: float | None = None,
        progress: Callable[[str], None] | None = None,
    ) -> ScaleReport:
        """Grow or shrink the running cluster to `n` engines, keeping the strategy's state.

        Args:
            n: Engines after. Default (with `survivors=True`): the engines still alive.
            keep: `"global-batch"` (default: each global batch stays the same, each replica
                takes a different share of it; keep the learning rate) or `"replica-batch"`
                (each replica's batch stays, the global batch scales with the replicas; scale
                the learning rate by new/old, the linear scaling rule). Distributed datasets
                follow either way.
            survivors: Continue without engines that died, with the survivors' in-memory
                state (their parameters are those from before the death).
            timeout: Seconds for the whole resize (default: the cluster's start timeout).
            progress: Called with a line at each stage (`%dist scale` prints them).

        Returns:
            A `ScaleReport` (print it).

        Raises:
            InvalidArgumentError: (a `ValueError`) `n` is not a whole number of at least 1, or
                `keep` is not one of `KEEP_MODES`.
            ScaleRefusedError: (a `RuntimeError`) refused before anything changed; the
                message names why and the fix.
            ScaleFailedError: (a `RuntimeError`) it failed part-way; the cluster is marked
                unusable (`cluster.restart()`).
        """
        keep = _keep_mode(keep)
        if n is not None and (isinstance(n, bool) or not isinstance(n, int) or n < 1):
            raise InvalidArgumentError(
                f"scale needs a whole number of engines of at least 1, got n={n!r}; e.g. "
                "cluster.scale(3) (`%dist scale 3`)."
            )
        if n is None and not survivors:
            raise InvalidArgumentError(
                "scale needs the number of engines, e.g. cluster.scale(3) (`%dist scale 3`), "
                "or survivors=True to continue on the engines still alive."
            )
        self._refuse_kind()
        self._require_running("cluster.scale()")
        say = progress or (lambda line: None)
        if not self._turn_lock.acquire(blocking=False):
            raise ScaleRefusedError(
                f"cluster.scale() was refused: {self._turn_holder or 'a call'} is running on "
                "the engines, and a resize must not change the cluster under it. Nothing "
                "changed. Scale once it has finished (or interrupt it first).",
                reason="busy",
            )
        self._turn_holder = "cluster.scale()"
        try:
            return self._scale(n, keep, survivors, timeout, say)
        finally:
            self._turn_holder = None
            self._turn_lock.release()

    # -- the resize, in the cluster's turn --------------------------------------------------
    def _scale(
        self, n: int | None, keep: str, survivors: bool, timeout: float | None,
        say: Callable[[str], None],
    ) -> ScaleReport:  # fmt: skip
        began = time.perf_counter()
        rows = list(self.status())
        busy = [row.rank for row in rows if row.state == "busy"]
        if busy:
            raise ScaleRefusedError(
                f"cluster.scale() was refused: replica(s) {busy} are still running an earlier "
                "request (a cell or call). Nothing changed. Scale once they finish, or "
                "interrupt them first.",
                reason="busy",
            )
        dead = [row.rank for row in rows if row.state == "dead"]
        alive = [info for info, row in zip(self._engines, rows) if row.state != "dead"]
        self._refuse(n, survivors, dead, alive)
        target = n if n is not None else len(alive)
        old = len(self._engines)
        if target == old and not dead:
            change = SizeChange(time.time(), old, old, "unchanged", 0.0)
            return ScaleReport(change, {})
        why = (
            f"survivors: replica(s) {dead}'s engine(s) died" if dead else f"scale {old} → {target}"
        )
        if dead and target != len(alive):
            why += f", then {len(alive)} → {target}"
        self._scale_timeout = timeout or self._plan.timeout  # what its timeout errors name
        deadline = time.monotonic() + self._scale_timeout
        staying, removed = alive[:target], alive[target:]
        grow = target - len(staying)
        prepared = self._each(staying if dead else self._engines, resize.prepare, deadline,
                              "preparing the resize", keep, old, target, bool(dead))  # fmt: skip
        problems = [p for reply in prepared for p in reply["value"]["problems"]]
        if problems:
            raise ScaleRefusedError(
                f"cluster.scale() was refused (keep={keep!r}): "
                f"{'; '.join(dict.fromkeys(problems))}."
                " Nothing changed. Use keep='global-batch', or distribute the data from a "
                "DataLoader with a batch size.",
                reason="state",
            )
        blob = self._snapshot(staying[0], deadline) if grow else b""
        say(f"{time.perf_counter() - began:.1f} s  state found on {len(prepared)} engine(s)")
        try:
            joined = self._launch_more(grow, target, deadline) if grow else []
            if grow:
                say(f"{time.perf_counter() - began:.1f} s  {grow} engine(s) started, registered")
            engines, prefix = self._regroup(staying, joined, target, deadline)
            say(f"{time.perf_counter() - began:.1f} s  process group formed at {target}")
            notes, hooks, failures, printed = self._follow(
                engines, len(staying), keep, old, target, why, bool(dead), deadline, blob
            )
        except ScaleRefusedError:
            raise
        except KeyboardInterrupt:
            self.mark_broken(f"resizing {old} → {target} was interrupted (Ctrl-C) part-way")
            raise ClusterInterrupted(
                f"Resizing {old} → {target} was interrupted part-way; the cluster is unusable: "
                "run `%dist restart` (cluster.restart()) for fresh engines."
            ) from None
        except Exception as error:
            reason = f"resizing {old} → {target} failed ({type(error).__name__}: {error})"
            self.mark_broken(reason)
            raise ScaleFailedError(
                f"{reason[0].upper()}{reason[1:]}; the cluster is unusable: run "
                "`%dist restart` (cluster.restart()) for fresh engines (engine state is lost)."
            ) from None
        self._stop_engines(removed, deadline)
        self._engines = engines
        self._plan = dataclasses.replace(
            self._plan, n=target, gpus=tuple(e.gpu for e in engines) if self._plan.gpus else None
        )
        self._group_prefix = prefix
        self._broken = self._repaired = self._reform_pending = None
        self._record_processes()
        change = SizeChange(time.time(), old, target, why, time.perf_counter() - began)
        self._size_history = [*self.size_history, change]
        removed_ranks = tuple(dead) + tuple(info.rank for info in removed)
        return ScaleReport(
            change, notes, tuple(range(len(staying), target)), removed_ranks, hooks, failures,
            printed,
        )  # fmt: skip

    def _refuse_kind(self) -> None:
        """Raise `ScaleRefusedError` for a cluster whose kind cannot be resized."""
        plan = self._plan
        if plan.strategy == "parameter_server":
            raise ScaleRefusedError(
                "cluster.scale() was refused: a parameter-server cluster cannot be resized "
                "(its worker and ps tasks are fixed when it starts). Nothing changed. Save a "
                "checkpoint, then `%dist restart` with the new size (`%dist start -n N "
                "--strategy parameter_server`), and restore it.",
                reason="strategy",
            )
        if plan.launcher != "local" or plan.hosts:
            raise ScaleRefusedError(
                f"cluster.scale() was refused: it starts engines on this machine, and this "
                f"cluster's engines were started by launcher={plan.launcher!r}. Nothing "
                "changed. Restart the cluster with the new size instead.",
                reason="launcher",
            )

    def _refuse(
        self, n: int | None, survivors: bool, dead: list[int], alive: list[EngineInfo]
    ) -> None:
        """Raise `ScaleRefusedError` for a resize that cannot be done (nothing changed)."""
        plan = self._plan
        if dead and not survivors:
            raise ScaleRefusedError(
                f"cluster.scale() was refused: the engine(s) of replica(s) {dead} are dead. "
                "Nothing changed. Continue on the live engines with their state: "
                "`%dist scale --survivors` (cluster.scale(survivors=True)), or "
                "`%dist restart` (engine state is lost).",
                reason="dead engines",
            )
        if not alive:
            raise ScaleRefusedError(
                "cluster.scale() was refused: no engine is alive. Run `%dist restart`.",
                reason="dead engines",
            )
        if self._broken is not None and not dead:
            raise ScaleRefusedError(
                f"cluster.scale() was refused: the cluster is unusable because {self._broken}. "
                "Nothing changed. Run `%dist restart` (engine state is lost).",
                reason="unusable",
            )
        history = self.size_history
        if history and history[0].new < 2:  # its strategies were made without a group
            raise ScaleRefusedError(
                "cluster.scale() was refused: a cluster started with one engine has no process "
                "group to resize. Nothing changed. Start it with 2 or more engines "
                "(`%dist start -n 2`); it can be scaled down to 1 and up again later.",
                reason="one engine",
            )
        target = n if n is not None else len(alive)
        if plan.gpus:
            from nbdist.cluster.launch.plan import local_gpu_ids

            limit, unit = len(local_gpu_ids()), "GPU(s)"
        else:
            limit, unit = cpu_engine_limit(), f"CPU engines (2 per core, {joining.cores()} cores)"
        if target > limit:
            raise ScaleRefusedError(
                f"cluster.scale({target}) was refused: this machine has room for {limit} "
                f"{unit}. Nothing changed. Scale to {limit} or fewer.",
                reason="capacity",
            )

    def _each(
        self, engines: Sequence[EngineInfo], fn: Callable[..., dict[str, Any]], deadline: float,
        what: str, *args: Any, per_engine: Sequence[tuple] | None = None,
    ) -> list[dict[str, Any]]:  # fmt: skip
        """Call `fn(*args)` (or `fn(*per_engine[i])`) on every engine at once; their replies,
        or `ScaleFailedError` naming the first that failed."""
        from ipyparallel.client.asyncresult import AsyncResult

        parts = [
            self._client.direct_view([info.id]).apply_async(
                fn, *(per_engine[i] if per_engine is not None else args)
            )
            for i, info in enumerate(engines)
        ]
        replies = wait_all(AsyncResult.join(*parts), deadline, what, *self._timeout_named())
        for info, reply in zip(engines, replies):
            if not reply_ok(reply):
                raise ScaleFailedError(
                    f"{what} failed on the engine of replica {info.rank}: {reply.get('ename')}: "
                    f"{reply.get('evalue')}"
                )
        return replies

    def _timeout_named(self) -> tuple[float, str]:
        """The resize's timeout and how to raise it, for its timeout errors."""
        timeout = getattr(self, "_scale_timeout", self._plan.timeout)
        return timeout, "Give the resize longer (cluster.scale(n, timeout=S))"

    def _snapshot(self, first: EngineInfo, deadline: float) -> bytes:
        """Replica 0's strategy state, pickled for the engines about to join (taken before
        anything changes, so state that cannot be copied refuses the resize)."""
        reply = (
            self._client.direct_view([first.id])
            .apply_async(resize.snapshot)
            .get(timeout=max(1.0, deadline - time.monotonic()))
        )
        reply = reply[0] if isinstance(reply, list) else reply
        if not reply_ok(reply):
            raise ScaleRefusedError(
                f"cluster.scale() was refused: {reply.get('evalue')} Nothing changed.",
                reason="state",
            )
        return bytes(reply["value"]["blob"])

    def _launch_more(self, count: int, target: int, deadline: float) -> list[tuple[int, dict]]:
        """Start `count` engines in this cluster's controller, wait for them to register,
        attach and describe them; `(engine id, description)` in id order."""
        known = set(self._client.ids) | {info.id for info in self._engines}
        threads = max(1, joining.cores() // target)
        env = {"OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads),
               "MPLBACKEND": "Agg"}  # fmt: skip
        sets = []
        if self._plan.gpus:
            from nbdist.cluster.launch.plan import local_gpu_ids

            used = {info.gpu for info in self._engines}
            free = [gpu for gpu in local_gpu_ids() if gpu not in used][:count]
            for gpu in free:
                environment = {**env, "CUDA_VISIBLE_DEVICES": gpu}
                sets.append(self._ipp.start_engines_sync(n=1, environment=environment))
        else:
            sets.append(self._ipp.start_engines_sync(n=count, environment=env))
        self._record_processes()
        launchers = [
            launcher
            for engine_set in sets
            for launcher in getattr(self._ipp.engines.get(engine_set), "launchers", {}).values()
        ]
        while True:
            new = sorted(set(self._client.ids) - known)
            if len(new) >= count:
                break
            exited = [launcher for launcher in launchers if launcher_has_exited(launcher)]
            if exited:
                pids = ", ".join(str(getattr(launcher, "pid", "?")) for launcher in exited)
                raise ClusterStartError(
                    f"new engine process(es) (pid {pids}) exited before registering; their "
                    f"output:\n{output_tail(self._ipp)}"
                )
            if time.monotonic() > deadline:
                raise EngineTimeoutError(
                    f"{len(new)} of {count} new engine(s) registered within the resize's "
                    "timeout. Give it longer: cluster.scale(n, timeout=S)."
                )
            time.sleep(0.05)  # ipyparallel's registration has no wait of its own here
        new = new[:count]
        greeter = Greeter(self._client, controller_address(self._settings, self._client))
        described = greeter.described(new, deadline, *self._timeout_named())
        return list(zip(new, described))

    def _regroup(
        self, staying: list[EngineInfo], joined: list[tuple[int, dict]], target: int,
        deadline: float,
    ) -> tuple[tuple[EngineInfo, ...], str | None]:  # fmt: skip
        """Form the group at `target` (survivors `regroup`, new engines `bootstrap`); the
        engines in their new rank order and the group's prefix in the store."""
        from ipyparallel.client.asyncresult import AsyncResult

        first = staying[0]
        where = (
            self._client.direct_view([first.id])
            .apply_async(joining.describe, controller_address(self._settings, self._client))
            .get(timeout=max(1.0, deadline - time.monotonic()))
        )
        where = where[0] if isinstance(where, list) else where
        plan = self._plan
        base = {
            "world_size": target, "local_world_size": target,
            "master_addr": where["address"], "master_port": where["free_port"],
            "implementation": plan.implementation.value,
            "timeout_seconds": plan.communication.timeout_seconds,
            "bytes_per_pack": plan.communication.bytes_per_pack,
            "compression": plan.communication.compression,
            "peers": store_peers(  # Note [Store peers]: who was in, and who joins
                [*getattr(self, "_store_peers", ()), *(d["address"] for _, d in joined)],
                where["address"],
            ),
        }  # fmt: skip
        parts = []
        for rank, info in enumerate(staying):
            config = {**base, "rank": rank, "local_rank": rank}
            view = self._client.direct_view([info.id])
            parts.append(view.apply_async(resize.regroup, config))
        for offset, (engine_id, _) in enumerate(joined):
            rank = len(staying) + offset
            config = {**base, "rank": rank, "local_rank": rank}
            view = self._client.direct_view([engine_id])
            parts.append(view.apply_async(joining.bootstrap, config))
        replies = wait_all(
            AsyncResult.join(*parts), deadline, "forming the group", *self._timeout_named()
        )
        for rank, reply in enumerate(replies[: len(staying)]):
            if not reply_ok(reply):
                raise ScaleFailedError(
                    f"replica {rank} could not join the group at the new size: "
                    f"{reply.get('ename')}: {reply.get('evalue')}"
                )
        engines = [
            dataclasses.replace(info, rank=rank, device=reply["value"]["device"])
            for rank, (info, reply) in enumerate(zip(staying, replies))
        ]
        for offset, ((engine_id, info), boot) in enumerate(zip(joined, replies[len(staying) :])):
            engines.append(
                EngineInfo(
                    id=engine_id, rank=len(staying) + offset, host=info["host"], pid=info["pid"],
                    device=boot["device"],
                    gpu=info["cuda_visible_devices"] if plan.gpus else None,
                    stacks=tuple(boot["stacks"]) if boot.get("stacks") else None,
                )
            )  # fmt: skip
        self._rendezvous = (str(where["address"]), int(where["free_port"]))
        prefix = replies[0]["value"]["prefix"] if staying else None
        return tuple(engines), prefix

    def _follow(
        self, engines: tuple[EngineInfo, ...], staying: int, keep: str, old: int, new: int,
        why: str, survivors: bool, deadline: float, blob: bytes,
    ) -> tuple[dict[str, str], tuple[str, ...], tuple[str, ...], tuple[str, ...]]:  # fmt: skip
        """Give the joined engines replica 0's state (`blob`), then let every engine follow."""
        joined = engines[staying:]
        if joined:
            self._each(joined, resize.adopt, deadline, "taking the state", blob)
        from nbdist.core.scale_hooks import on_scale

        hooks = _wire.dumps([_wire.Call.of(fn, (), {}) for fn in on_scale.registered()])
        joins = [info.rank >= staying for info in engines]
        args = [(keep, old, new, joins[i], survivors) for i in range(len(engines))]
        followed = self._each(engines, resize.follow, deadline, "following the resize",
                              per_engine=args)  # fmt: skip
        args = [(keep, old, new, why, joins[i], hooks) for i in range(len(engines))]
        settled = self._each(engines, resize.settle, deadline, "checking the replicas",
                             per_engine=args)  # fmt: skip
        failures = tuple(
            f"replica {info.rank}: {line}"
            for info, reply in zip(engines, settled)
            for line in reply["value"]["hook_failures"]
        )
        printed = tuple(
            f"[{info.rank}] {line}"
            for info, reply in zip(engines, settled)
            for line in reply["value"].get("printed", "").splitlines()
        )
        return (
            followed[0]["value"]["notes"], tuple(settled[0]["value"]["hooks"]),
            failures, printed,
        )  # fmt: skip

    def _stop_engines(self, engines: Sequence[EngineInfo], deadline: float) -> None:
        """Stop the engines removed by a shrink: SIGTERM (they have left the group and run
        nothing), then SIGKILL for any still there after `STOP_GRACE_S`; their nannies then
        tell the controller they are gone."""
        here = socket.gethostname()
        pids = [info.pid for info in engines if info.host == here]
        for pid in pids:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGTERM)
        end = min(deadline, time.monotonic() + STOP_GRACE_S)
        while any(pid_alive(pid) for pid in pids) and time.monotonic() < end:
            time.sleep(0.02)  # waiting for processes to exit: no event to wait on
        for pid in pids:
            if pid_alive(pid):
                with contextlib.suppress(OSError):
                    os.kill(pid, signal.SIGKILL)


def _keep_mode(keep: Any) -> str:
    """`keep` checked and normalised (`"replica_batch"`, `"Replica-Batch"` are accepted)."""
    name = keep.strip().lower().replace("_", "-") if isinstance(keep, str) else None
    if name not in KEEP_MODES:
        raise InvalidArgumentError(
            f"keep must be one of {', '.join(KEEP_MODES)}, got {keep!r}; e.g. "
            "cluster.scale(3, keep='global-batch') (`%dist scale 3 --keep global-batch`)."
        )
    return name
