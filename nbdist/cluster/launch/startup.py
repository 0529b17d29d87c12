"""The steps of `Cluster.start` that need no cluster state: waiting and ranking.

- `wait_for_registration`: until every engine has registered with the controller, reporting
  progress, failing at once when an engine process exits and within the deadline otherwise;
- `wait_all`: one request on every engine, with failures gathered into one error;
- `rank_engines`: replica order (host, then GPU, then engine id) and each engine's torchrun
  settings (rank, local rank, the rendezvous address);
- the messages for start failures (`launch_failure`, `output_tail`).

Example:
    >>> from nbdist.cluster.launch.plan import make_plan
    >>> described = [
    ...     {"host": "b", "address": "10.0.0.2", "free_port": 2, "cuda_visible_devices": None},
    ...     {"host": "a", "address": "10.0.0.1", "free_port": 1, "cuda_visible_devices": None},
    ... ]
    >>> ranked = rank_engines(make_plan(n=2, gpu_ids=()), [7, 8], described)
    >>> [(engine_id, config["rank"], config["master_addr"]) for engine_id, _, config in ranked]
    [(7, 0, '10.0.0.2'), (8, 1, '10.0.0.2')]
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

from nbdist._private_api import launcher_has_exited, refresh_engines_from_hub
from nbdist.cluster.errors import ClusterStartError, EngineTimeoutError
from nbdist.cluster.launch.plan import LaunchPlan

__all__ = [
    "engines_exited",
    "launch_failure",
    "output_tail",
    "probe_timeout",
    "quiet",
    "rank_engines",
    "wait_all",
    "wait_for_registration",
]

_OUTPUT_TAIL = 30
_POLL_S = 0.2  # how often a wait for registration checks whether an engine process exited
_HUB_LOOK_S = 1.0  # how often it asks the controller itself (Note [Registrations not heard])
_ENGINE_EXIT_HINT = {
    "local": "Its output is below.",
    "mpi": "mpiexec's output is below (an MPI that refuses the launch, or mpi4py missing).",
    "ssh": (
        "Check that nbdist is installed for the hosts' Python (pass "
        "launcher_options={'remote_python': '/path/to/python'}); the output is below."
    ),
    "slurm": "The job's output is below (sbatch options, the allocation).",
}


def quiet(line: str) -> None:
    """The default `progress` of `Cluster.start`: say nothing."""


def engines_exited(plan: LaunchPlan, names: str, registered: int = 0) -> ClusterStartError:
    """The error of engine processes `names` that exited before registering (the caller adds
    their output), with the launcher's hint at the usual cause."""
    return ClusterStartError(
        f"Engine process(es) {names} exited before registering; {registered} of {plan.n} "
        f"engine(s) registered. {_ENGINE_EXIT_HINT[plan.launcher]}"
    )


def wait_for_registration(
    ipp: Any,
    client: Any,
    plan: LaunchPlan,
    deadline: float,
    progress: Callable[[str], None],
    on_registered: Callable[[list[int]], None] | None = None,
    job_problem: Callable[[], str | None] | None = None,
) -> None:
    """Wait until `plan.n` engines have registered; fail at once when an engine process exits.

    ipyparallel learns that a launched process exited in a thread that hands the news to
    its event loop, which runs only inside its `*_sync` calls; so the exit is read here
    from that thread having ended. `progress` hears every count ("1/2 engines registered",
    then "2/2 ..."), even when several engines registered between two looks;
    `on_registered` gets the ids of the engines registered so far at each look that found
    a new one. Every second it also asks the controller which engines it has registered
    (Note [Registrations not heard]). `job_problem` (a batch system's look at the engines' job, e.g.
    `slurm_jobs.JobWatch.check`) is a message when the job will never run the engines.

    Raises:
        ClusterStartError: an engine process exited before registering, or `job_problem`
            said the job will not run them.
        EngineTimeoutError: not every engine registered before `deadline`.
    """
    launchers = []
    for engine_set in ipp.engines.values():
        launchers += list(getattr(engine_set, "launchers", {}).values()) or [engine_set]
    waiting = client.wait_for_engines(
        plan.n, timeout=_remaining(deadline), block=False, interactive=False
    )
    said = 0
    next_hub_look = time.monotonic() + _HUB_LOOK_S

    def say_new() -> None:
        nonlocal said
        ids = list(client.ids)
        if len(ids) > said and on_registered is not None:
            on_registered(sorted(ids)[: plan.n])
        for count in range(said + 1, min(len(ids), plan.n) + 1):
            progress(f"{count}/{plan.n} engines registered")
        said = max(said, min(len(ids), plan.n))

    while True:
        try:
            waiting.result(timeout=_POLL_S)
            say_new()
            return
        except TimeoutError:  # not yet (or ipyparallel's own wait timed out: done())
            if time.monotonic() >= next_hub_look and len(client.ids) < plan.n:
                next_hub_look = time.monotonic() + _HUB_LOOK_S
                if len(_engines_at_hub(client, deadline)) >= plan.n:
                    waiting.cancel()
                    say_new()
                    return
            say_new()
            exited = [launcher for launcher in launchers if launcher_has_exited(launcher)]
            if exited and not waiting.done():
                names = ", ".join(str(getattr(x, "identifier", "?")) for x in exited)
                raise engines_exited(plan, names, len(client.ids)) from None
            problem = job_problem() if job_problem is not None and not waiting.done() else None
            if problem and len(client.ids) < plan.n:
                raise ClusterStartError(problem) from None
            if waiting.done() or time.monotonic() >= deadline:
                if len(client.ids) >= plan.n:  # the last one registered just now
                    say_new()
                    return
                break
    raise EngineTimeoutError(
        f"Only {len(client.ids)} of {plan.n} engines registered within "
        f"{plan.timeout:g} s. Raise the timeout (Cluster(timeout=...), or `%dist start "
        "--timeout S`) on a slow or busy machine"
        + (
            f", and check that hosts {[h for h, _ in plan.hosts]} can reach this machine "
            "(the controller listens on one address of this machine: the one on the route "
            "to the first host, or launcher_options={'controller_ip': ...})."
            if plan.hosts
            else "."
        ),
        pending=(plan.n - len(client.ids),),
    )


def _engines_at_hub(client: Any, deadline: float) -> list[int]:
    """The engine ids the controller has registered, recorded in `client` (its own when the
    controller does not answer in time: the next look asks again)."""
    try:
        wait = max(_POLL_S, min(10.0, _remaining(deadline)))
        return refresh_engines_from_hub(client, timeout=wait)
    except TimeoutError:
        return list(client.ids)


# Note [Registrations not heard]: an ipyparallel Client asks the controller for its engines when
# it connects, then subscribes to the controller's notifications of new ones. An engine that
# registers between the two is in neither: ZeroMQ drops what is published before a subscription
# takes effect, and the client never lists that engine. With engines forked from the zygote,
# registration begins within a second of the controller's start, just when `Cluster.start`
# connects its client; on a busy machine one engine in a few hundred starts fell in that gap, and
# the start failed with "Only 2 of 3 engines registered" although all three had. So the wait also
# asks the controller itself, once a second, while engines are missing.


def wait_all(
    result: Any, deadline: float, step: str, timeout: float, fix: str = ""
) -> list[Any]:
    """The values of an ipyparallel `result` on every engine, or one error naming the step.

    Raises:
        EngineTimeoutError: not finished before `deadline` (`timeout` is named in the message).
        ClusterStartError: one or more engines raised; their errors are listed.
    """
    if not result.wait(_remaining(deadline)):
        raise EngineTimeoutError(
            f"The engines did not finish {step} within {timeout:g} s. "
            + (fix or "Raise the timeout (Cluster(timeout=...), or `%dist start --timeout S`)")
            + " on a slow or busy machine."
        )
    values = result.get(return_exceptions=True)
    errors = [(i, v) for i, v in enumerate(values) if isinstance(v, BaseException)]
    if errors:
        lines = [f"{len(errors)} engine(s) failed while {step}:"]
        for index, error in errors:
            lines.append(f"--- engine {index}: {_ipp_error_text(error)}")
        raise ClusterStartError("\n".join(lines))
    return list(values)


def rank_engines(
    plan: LaunchPlan, ids: Sequence[int], described: Sequence[dict[str, Any]]
) -> list[tuple[int, dict[str, Any], dict[str, Any]]]:
    """`(engine id, its description, its bootstrap config)` in replica (rank) order.

    Engines are ordered by host (in `plan.hosts`' order, whatever order their engines
    registered in: ssh starts them all at once; hosts not named there after them, first seen
    first), then by their place in `plan.gpus`, then by engine id. The first engine's address
    and free port are the rendezvous.
    """
    named = [host.rpartition("@")[2] for host, _ in plan.hosts or ()]
    seen = list(dict.fromkeys(d["host"] for d in described))
    hosts = sorted(
        seen, key=lambda h: (named.index(h) if h in named else len(named), seen.index(h))
    )

    def order(item: tuple[int, dict[str, Any]]) -> tuple[int, int, int]:
        engine_id, info = item
        gpu = info["cuda_visible_devices"]
        gpu_order = plan.gpus.index(gpu) if plan.gpus and gpu in plan.gpus else 0
        return (hosts.index(info["host"]), gpu_order, engine_id)

    ranked = sorted(zip(ids, described), key=order)
    first = ranked[0][1]
    result = []
    for rank, (engine_id, info) in enumerate(ranked):
        same_host = [i for i, (_, d) in enumerate(ranked) if d["host"] == info["host"]]
        config = {
            "rank": rank,
            "world_size": plan.n,
            "local_rank": same_host.index(rank),
            "local_world_size": len(same_host),
            "master_addr": first["address"],
            "master_port": first["free_port"],
            "implementation": plan.implementation.value,
            "timeout_seconds": plan.communication.timeout_seconds,
            "bytes_per_pack": plan.communication.bytes_per_pack,
            "compression": plan.communication.compression,
            "strategy": plan.strategy,
        }
        result.append((engine_id, info, config))
    return result


def launch_failure(plan: LaunchPlan, error: BaseException) -> str:
    """The message for an engine launcher that failed to start (ssh, mpiexec, sbatch)."""
    detail = f"{type(error).__name__}: {error}"
    output = getattr(error, "output", None) or getattr(error, "stderr", None)
    if isinstance(output, bytes):
        output = output.decode(errors="replace")
    if output:
        detail += f"\n{str(output).strip()}"
    if plan.launcher == "ssh":
        hosts = ", ".join(host for host, _ in plan.hosts or ())
        return (
            f"Could not start engines over ssh on {hosts}: {detail}\nCheck that each host is "
            "reachable and that `ssh HOST` logs in without a password prompt (a key in "
            "ssh-agent or ~/.ssh/config); pass ssh options with "
            "launcher_options={'ssh_args': [...]}."
        )
    if plan.launcher == "slurm":
        from nbdist.cluster.launch.slurm_jobs import refusal

        return refusal(error)
    return f"ipyparallel's {plan.launcher} launcher could not start the engines: {detail}"


def output_tail(ipp: Any) -> str:
    """The last lines the engines and the controller printed (for start errors)."""
    import contextlib

    chunks = []
    with contextlib.suppress(Exception):
        for engine_set in list(ipp.engines.values()) if ipp else []:
            chunks.append(("engines'", engine_set.get_output()))
    with contextlib.suppress(Exception):
        if ipp is not None and ipp.controller is not None:
            chunks.append(("controller's", ipp.controller.get_output()))
    lines = []
    for name, text in chunks:
        tail = [line for line in (text or "").splitlines() if line.strip()][-_OUTPUT_TAIL:]
        if tail:
            lines.append(f"--- last lines of the {name} output:")
            lines.extend(tail)
    return "\n".join(lines)


def probe_timeout(deadline: float) -> float:
    """Seconds for checking the hosts over ssh: half of what is left, between 1 and 30."""
    return max(1.0, min(30.0, _remaining(deadline) / 2))


def _remaining(deadline: float) -> float:
    return max(0.0, deadline - time.monotonic())


def _ipp_error_text(error: BaseException) -> str:
    ename = getattr(error, "ename", type(error).__name__)
    evalue = getattr(error, "evalue", str(error))
    tb = getattr(error, "traceback", None)
    text = f"{ename}: {evalue}"
    if tb:
        text += "\n" + "\n".join(str(tb).splitlines()[-_OUTPUT_TAIL:])
    return text
