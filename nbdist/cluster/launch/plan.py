"""`LaunchPlan`: what `nd.Cluster(...)` will start, checked before anything starts.

Turns the constructor's arguments (`n`, `gpus`, `hosts`, `launcher`, `backend`, `strategy`,
`timeout`) into a validated plan: how many engines, which GPU each is pinned to, which
`torch.distributed` implementation they use. Every invalid combination raises here, with the
value seen and the fix, so `Cluster(...)` fails before a process starts. Imports no ipyparallel.

Example:
    >>> plan = make_plan(n=2, gpu_ids=())
    >>> plan.n, plan.gpus, plan.backend, plan.implementation.value
    (2, None, 'auto', 'AUTO')
    >>> plan.engine_sets()
    [(2, {})]
"""

from __future__ import annotations

import dataclasses
import math
import os
from collections.abc import Sequence
from typing import Any

from nbdist.core.reduce.options import CommunicationImplementation, CommunicationOptions
from nbdist.errors import ArgumentTypeError, InvalidArgumentError

__all__ = [
    "BACKENDS",
    "DEFAULT_CPU_ENGINES",
    "GPU_MODES",
    "LAUNCHERS",
    "STRATEGIES",
    "LaunchPlan",
    "local_gpu_ids",
    "make_plan",
    "parse_hosts",
    "with_communication",
]

LAUNCHERS = ("local", "ssh", "mpi", "slurm")
"""Launcher names, as `%dist start --launcher` spells them."""

BACKENDS = {
    "auto": CommunicationImplementation.AUTO,
    "gloo": CommunicationImplementation.RING,
    "nccl": CommunicationImplementation.NCCL,
}
"""Backend name → `CommunicationImplementation` of the engines' strategy."""

STRATEGIES = ("mirrored", "multi_worker", "parameter_server", "fully_sharded")
"""Strategy names. On engines, "mirrored" and "multi_worker" both mean one replica per engine
in one `torch.distributed` group (`MultiWorkerMirroredStrategy`); "fully_sharded" the same
group with `nd.experimental.FullyShardedStrategy` (models created in scope sharded)."""

DEFAULT_CPU_ENGINES = 2
"""Engines started when `n` is not given and there is no GPU: the smallest multi-replica cluster."""

GPU_MODES = ("pinned", "local_rank", "none")
"""How engines find their GPU: `pinned` (local engines, one `CUDA_VISIBLE_DEVICES` each),
`local_rank` (engines started by ssh, mpiexec or srun use `cuda:LOCAL_RANK` when their host has
GPUs, else the CPU), `none` (CPU engines)."""


@dataclasses.dataclass(frozen=True)
class LaunchPlan:
    """A checked description of the engines to start.

    Attributes:
        n: Number of engines (= replicas).
        gpus: Per engine, the `CUDA_VISIBLE_DEVICES` value it is pinned to (one physical GPU);
            None for CPU engines.
        hosts: `(host, count)` pairs for remote engines; None for engines on this machine.
        gpu_mode: One of `GPU_MODES`.
        gpus_required: `gpus="all"` or indices were asked for (a Slurm job then requests one
            GPU per engine).
        launcher: One of `LAUNCHERS`.
        backend: One of `BACKENDS`' names.
        implementation: The `CommunicationImplementation` the engines' strategy uses.
        strategy: One of `STRATEGIES`.
        timeout: Seconds for the engines to start and join, and for them to stop.
        communication: The `CommunicationOptions` of the engines' strategy (collective
            timeout, bucket size, compression; its implementation is `implementation`).
    """

    n: int
    gpus: tuple[str, ...] | None
    hosts: tuple[tuple[str, int], ...] | None
    launcher: str
    backend: str
    implementation: CommunicationImplementation
    strategy: str
    timeout: float
    gpu_mode: str = "none"
    gpus_required: bool = False
    communication: CommunicationOptions = dataclasses.field(default_factory=CommunicationOptions)

    @property
    def collective_timeout(self) -> float:
        """Seconds an engine's collective waits for every engine (default 300)."""
        return self.communication.timeout

    @property
    def device_kind(self) -> str:
        """`"gpu"`, `"cpu"`, or `"auto"` (engines on other hosts use a GPU where they find one)."""
        if self.gpus:
            return "gpu"
        return "auto" if self.gpu_mode == "local_rank" else "cpu"

    def engine_sets(self) -> list[tuple[int, dict[str, str]]]:
        """`(count, environment)` per ipyparallel engine set to start.

        CPU engines are one set of `n`; GPU engines are one set per GPU, each with its own
        `CUDA_VISIBLE_DEVICES`, so every engine sees exactly one GPU (as `cuda:0`).

        With the ssh, mpi and slurm launchers there is one set of `n` (ipyparallel starts
        them per host); GPUs chosen here are all made visible to it, and each engine takes
        `cuda:LOCAL_RANK`. `gpus="none"` hides every GPU (`CUDA_VISIBLE_DEVICES=""`).

        Example:
            >>> make_plan(gpus=[0, 1], gpu_ids=("0", "1")).engine_sets()
            [(1, {'CUDA_VISIBLE_DEVICES': '0'}), (1, {'CUDA_VISIBLE_DEVICES': '1'})]
            >>> make_plan(launcher="mpi", gpus=[0, 1], gpu_ids=("0", "1")).engine_sets()
            [(2, {'CUDA_VISIBLE_DEVICES': '0,1'})]
        """
        hide = {"CUDA_VISIBLE_DEVICES": ""} if self.gpu_mode == "none" and self.hosts else {}
        if self.launcher != "local":
            return [(self.n, {"CUDA_VISIBLE_DEVICES": ",".join(self.gpus)} if self.gpus else hide)]
        if not self.gpus:
            return [(self.n, {})]
        return [(1, {"CUDA_VISIBLE_DEVICES": gpu}) for gpu in self.gpus]


def local_gpu_ids() -> tuple[str, ...]:
    """The physical ids of the CUDA GPUs this process sees, honouring `CUDA_VISIBLE_DEVICES`.

    Returns what each engine's `CUDA_VISIBLE_DEVICES` must be set to for it to see that GPU
    alone: `("0", "1")` on a 2-GPU machine; `("2", "3")` when `CUDA_VISIBLE_DEVICES=2,3`.
    Counts them without importing torch where it can (`gpu_probe`: the driver's NVML and
    torch's build metadata), so that planning a start does not wait for torch's import.
    """
    from nbdist.cluster.launch.gpu_probe import visible_gpu_ids

    probed = visible_gpu_ids()
    if probed is not None:
        return probed
    import torch  # a ROCm build: only torch can count its GPUs

    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if not count:
        return ()
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is None or not visible.strip():
        return tuple(str(i) for i in range(count))
    entries = [entry.strip() for entry in visible.split(",") if entry.strip()]
    return tuple(entries[:count])


def parse_hosts(hosts: str | Sequence[str] | dict[str, int]) -> tuple[tuple[str, int], ...]:
    """`"h1:2,h2"` or `["h1:2", "h2"]` or `{"h1": 2}` → `(("h1", 2), ("h2", 1))`.

    Raises:
        ValueError: an empty host name, a count that is not a positive integer, or a host
            listed twice.

    Example:
        >>> parse_hosts("node1:2, node2")
        (('node1', 2), ('node2', 1))
    """
    if isinstance(hosts, dict):
        items = [f"{host}:{count}" for host, count in hosts.items()]
    elif isinstance(hosts, str):
        items = [item for item in hosts.split(",") if item.strip()]
    else:
        items = list(hosts)
    parsed: list[tuple[str, int]] = []
    for item in items:
        text = str(item).strip()
        host, _, count_text = text.rpartition(":") if ":" in text else (text, "", "1")
        host = host.strip()
        count_text = count_text.strip()
        if not host or not count_text.isdecimal() or int(count_text) < 1:
            raise InvalidArgumentError(
                f"hosts entry {item!r} is not HOST or HOST:COUNT with COUNT >= 1. "
                "Write e.g. hosts='node1:2,node2:2'."
            )
        if any(host == seen for seen, _ in parsed):
            raise InvalidArgumentError(
                f"host {host!r} is listed twice in hosts={hosts!r}; give it once with the "
                "total count, e.g. 'node1:4'."
            )
        parsed.append((host, int(count_text)))
    if not parsed:
        raise InvalidArgumentError(
            f"hosts={hosts!r} names no host; write e.g. hosts='node1:2,node2:2'."
        )
    return tuple(parsed)


def _check_n(n: Any) -> int | None:
    if n is None:
        return None
    if isinstance(n, bool) or not isinstance(n, int):
        raise ArgumentTypeError(f"n must be a whole number of engines, got {n!r}; pass e.g. n=2.")
    if n < 1:
        raise InvalidArgumentError(f"n must be at least 1 engine, got n={n}; pass e.g. n=2.")
    return n


def _choose(name: str, value: Any, valid: Sequence[str]) -> str:
    text = value.strip().lower() if isinstance(value, str) else None
    if text not in valid:
        raise InvalidArgumentError(
            f"Unknown {name} {value!r}; choose one of {', '.join(map(repr, valid))}."
        )
    return text


def _gpu_indices(gpus: Any) -> list[int] | str | None:
    """None, "all", "none", or the listed indices."""
    if gpus is None:
        return None
    if isinstance(gpus, str):
        text = gpus.strip().lower()
        if text in ("all", "none"):
            return text
        items: list[Any] = [item.strip() for item in text.split(",") if item.strip()]
    elif isinstance(gpus, (int, float)):
        raise ArgumentTypeError(
            f"gpus={gpus!r} is ambiguous: pass gpus='all', a list of GPU indices such as "
            "gpus=[0, 1], or n=2 for two engines."
        )
    else:
        try:
            items = list(gpus)
        except TypeError:
            raise ArgumentTypeError(
                f"gpus must be 'all', 'none', a list of GPU indices or '0,1', got {gpus!r}."
            ) from None
    if not items:
        return "none"
    indices = []
    for item in items:
        if isinstance(item, bool) or not (
            isinstance(item, int) or (isinstance(item, str) and item.isdecimal())
        ):
            raise InvalidArgumentError(
                f"gpus={gpus!r}: {item!r} is not a GPU index. Write gpus='all', gpus=[0, 1] "
                "or gpus='0,1'."
            )
        indices.append(int(item))
    if len(set(indices)) != len(indices):
        raise InvalidArgumentError(
            f"gpus={gpus!r} lists a GPU twice; each engine needs its own GPU. Give each index once."
        )
    return indices


def make_plan(
    n: int | None = None,
    gpus: Any = None,
    hosts: Any = None,
    launcher: str = "local",
    backend: str = "auto",
    strategy: str = "mirrored",
    timeout: float = 120.0,
    *,
    gpu_ids: Sequence[str] | None = None,
) -> LaunchPlan:
    """Check `Cluster`'s arguments and decide what to start (see `Cluster` for their meaning).

    Args:
        gpu_ids: The GPUs this machine offers (default: `local_gpu_ids()`); for tests.

    Raises:
        ValueError: `n` < 1; an unknown launcher, backend or strategy (the valid names are
            listed); `gpus="all"` or a GPU index without such a GPU; `n` disagreeing with
            `gpus` or `hosts`; `hosts` with the local launcher, or ssh without `hosts`; GPU
            indices with `hosts`; NCCL without GPU engines; a timeout that is not positive.
        TypeError: `n` or `gpus` of the wrong type.

    Example:
        >>> make_plan(n=0)
        Traceback (most recent call last):
        ...
        nbdist.errors.InvalidArgumentError: n must be at least 1 engine, got n=0; pass e.g. n=2.
    """
    n = _check_n(n)
    launcher = _choose("launcher", launcher, LAUNCHERS)
    backend = _choose("backend", backend, tuple(BACKENDS))
    strategy = _choose("strategy", strategy, STRATEGIES)
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not timeout > 0:
        raise InvalidArgumentError(
            f"timeout must be a positive number of seconds, got {timeout!r}."
        )
    if not math.isfinite(timeout):
        raise InvalidArgumentError(
            f"timeout must be finite, got {timeout!r}; pass e.g. timeout=120."
        )
    if strategy == "parameter_server" and launcher not in ("local", "ssh"):
        raise InvalidArgumentError(
            f"strategy='parameter_server' starts its engines on this machine (launcher="
            f"'local') or on hosts over ssh (launcher='ssh', hosts='node1:1,node2:1,...'), not "
            f"with launcher={launcher!r}; under {launcher} run nd.Server tasks from TF_CONFIG "
            "(docs/parameter-server.md)."
        )
    parsed_hosts = parse_hosts(hosts) if hosts is not None else None
    if parsed_hosts is not None and launcher == "local":
        raise InvalidArgumentError(
            f"hosts={hosts!r} needs a launcher that reaches other machines; pass "
            "launcher='ssh' (or 'mpi', 'slurm'), or leave hosts out for engines on this machine."
        )
    if launcher == "ssh" and parsed_hosts is None:
        raise InvalidArgumentError(
            "launcher='ssh' starts engines on other machines and needs hosts, e.g. "
            "hosts='node1:2,node2:2' (HOST:ENGINES). For engines on this machine use "
            "launcher='local'."
        )
    wanted = _gpu_indices(gpus)
    if parsed_hosts is not None:
        return _remote_plan(n, wanted, gpus, parsed_hosts, launcher, backend, strategy, timeout)
    if launcher == "slurm":
        # srun places the engines on the allocation's nodes: their GPUs are not this machine's.
        count = n if n is not None else DEFAULT_CPU_ENGINES
        if isinstance(wanted, list):
            raise InvalidArgumentError(_NO_GPU_LIST.format(gpus=gpus, launcher=launcher))
        mode = "none" if wanted == "none" else "local_rank"
        return _finish(
            count, None, None, launcher, backend, strategy, timeout, mode, gpus, wanted == "all"
        )
    available = tuple(local_gpu_ids() if gpu_ids is None else gpu_ids)
    chosen: tuple[str, ...] | None
    if wanted == "none" or (wanted is None and not available):
        chosen = None
        count = n if n is not None else DEFAULT_CPU_ENGINES
    elif wanted in ("all", None):
        if not available:
            raise InvalidArgumentError(
                "gpus='all' asks for one engine per GPU, but no CUDA GPU is visible here "
                "(torch.cuda.device_count() is 0). Start CPU engines instead: Cluster(n=2) "
                "(or gpus='none'), or check CUDA_VISIBLE_DEVICES and the driver."
            )
        if wanted == "all" and n is not None and n != len(available):
            raise InvalidArgumentError(
                f"n={n} but gpus='all' means one engine per GPU, and there are "
                f"{len(available)}. Leave n out, or pick GPUs with gpus=[...]."
            )
        if n is not None and n > len(available):
            raise InvalidArgumentError(
                f"n={n} engines but only {len(available)} GPU(s) are visible, and each GPU "
                "engine needs its own GPU. Pass n <= "
                f"{len(available)}, or gpus='none' for CPU engines."
            )
        chosen = available[: n if n is not None else len(available)]
        count = len(chosen)
    else:
        assert isinstance(wanted, list)
        missing = [i for i in wanted if i >= len(available)]
        if missing:
            have = f"GPUs 0..{len(available) - 1}" if available else "no CUDA GPU"
            raise InvalidArgumentError(
                f"gpus={gpus!r} asks for GPU(s) {missing}, but this machine has {have}. "
                "Pick existing GPUs, or gpus='none' / Cluster(n=2) for CPU engines."
            )
        if n is not None and n != len(wanted):
            raise InvalidArgumentError(
                f"n={n} disagrees with gpus={gpus!r} ({len(wanted)} GPU(s)); one engine runs "
                "per GPU. Leave n out."
            )
        chosen = tuple(available[i] for i in wanted)
        count = len(chosen)
    mode = "none" if not chosen else "pinned" if launcher == "local" else "local_rank"
    return _finish(
        count, chosen, None, launcher, backend, strategy, timeout, mode, gpus, bool(chosen)
    )


_NO_GPU_LIST = (
    "gpus={gpus!r}: GPU indices name GPUs of this machine, but launcher={launcher!r} starts "
    "engines elsewhere. Leave gpus out (each engine takes its host's GPU number LOCAL_RANK "
    "when there is one) or pass gpus='none' for CPU engines; set CUDA_VISIBLE_DEVICES on the "
    "hosts to choose GPUs there."
)


def with_communication(
    plan: LaunchPlan, collective_timeout: Any = None, communication_options: Any = None
) -> LaunchPlan:
    """`plan` with the engines' `CommunicationOptions`: `communication_options` (default:
    TF's defaults) with `collective_timeout` as its `timeout_seconds`, and the implementation
    agreed with `plan.backend`.

    Raises:
        ArgumentTypeError: `collective_timeout` not a number; `communication_options` not a
            `CommunicationOptions`.
        InvalidArgumentError: `collective_timeout` not a positive finite number of seconds;
            both given with different timeouts; an implementation that contradicts
            `backend`, or NCCL on CPU engines.

    Example:
        >>> plan = with_communication(make_plan(n=2, gpu_ids=()), collective_timeout=30)
        >>> plan.collective_timeout
        30.0
    """
    options = communication_options
    if options is None:
        options = CommunicationOptions()
    elif not isinstance(options, CommunicationOptions):
        raise ArgumentTypeError(
            f"communication_options must be nd.experimental.CommunicationOptions, got "
            f"{type(options).__name__} {options!r}; e.g. communication_options="
            f"nd.experimental.CommunicationOptions(timeout_seconds=600)."
        )
    if collective_timeout is not None:
        if isinstance(collective_timeout, bool) or not isinstance(collective_timeout, (int, float)):
            raise ArgumentTypeError(
                f"collective_timeout must be a number of seconds, got "
                f"{type(collective_timeout).__name__} {collective_timeout!r}; e.g. "
                f"collective_timeout=600."
            )
        if not (collective_timeout > 0 and math.isfinite(collective_timeout)):
            raise InvalidArgumentError(
                f"collective_timeout must be a positive number of seconds, got "
                f"{collective_timeout!r}; e.g. collective_timeout=600 (the default is 300 s)."
            )
        if options.timeout_seconds is not None and options.timeout_seconds != collective_timeout:
            raise InvalidArgumentError(
                f"collective_timeout={collective_timeout!r} and communication_options."
                f"timeout_seconds={options.timeout_seconds!r} disagree; give the timeout once."
            )
        options = dataclasses.replace(options, timeout_seconds=float(collective_timeout))
    elif options.timeout_seconds is not None and not math.isfinite(options.timeout_seconds):
        raise InvalidArgumentError(
            f"communication_options.timeout_seconds must be finite, got "
            f"{options.timeout_seconds!r}; e.g. timeout_seconds=600."
        )
    implementation = options.implementation
    backend = plan.backend
    if implementation is not CommunicationImplementation.AUTO:
        wanted = next(name for name, value in BACKENDS.items() if value is implementation)
        if backend != "auto" and backend != wanted:
            raise InvalidArgumentError(
                f"backend={backend!r} and communication_options.implementation="
                f"{implementation.value} disagree; give one of them (backend={wanted!r} is "
                f"implementation={implementation.value})."
            )
        if implementation is CommunicationImplementation.NCCL and plan.gpu_mode == "none":
            raise InvalidArgumentError(
                "communication_options.implementation=NCCL needs GPU engines, but these "
                "engines run on CPUs. Use RING (gloo) or AUTO."
            )
        backend = wanted
    options = dataclasses.replace(options, implementation=CommunicationImplementation.AUTO)
    return dataclasses.replace(
        plan, backend=backend, implementation=BACKENDS[backend], communication=options
    )


def _remote_plan(
    n: int | None,
    wanted: list[int] | str | None,
    gpus: Any,
    hosts: tuple[tuple[str, int], ...],
    launcher: str,
    backend: str,
    strategy: str,
    timeout: float,
) -> LaunchPlan:
    """The plan for engines on `hosts` (launcher ssh, mpi or slurm)."""
    total = sum(count for _, count in hosts)
    if n is not None and n != total:
        spelled = ",".join(f"{host}:{count}" for host, count in hosts)
        raise InvalidArgumentError(
            f"n={n} disagrees with hosts={spelled!r}, which asks for {total} engine(s). Leave "
            "n out (the hosts' counts decide), or change the counts."
        )
    if isinstance(wanted, list):
        raise InvalidArgumentError(_NO_GPU_LIST.format(gpus=gpus, launcher=launcher))
    mode = "none" if wanted == "none" else "local_rank"
    return _finish(
        total, None, hosts, launcher, backend, strategy, timeout, mode, gpus, wanted == "all"
    )


MAX_ENGINES_PER_CORE = 4
"""Local engines per CPU core beyond which `Cluster` refuses to start (the same as the CLI's)."""
ENGINE_MEMORY_MB = 200
"""The least resident memory one CPU engine takes (Python, torch, ipyparallel), in MiB."""


def check_capacity(count: int, cores: int | None = None, memory_mb: int | None = None) -> None:
    """Refuse, before anything starts, more local engines than this machine can hold: more
    than `MAX_ENGINES_PER_CORE` per core, or more than its memory fits at `ENGINE_MEMORY_MB`
    each. The message names the machine's capacity.

    Example:
        >>> check_capacity(10**6, cores=2, memory_mb=8192)  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        nbdist.errors.InvalidArgumentError: n=1000000 local engines is more than ...
    """
    cores = cores if cores is not None else (os.cpu_count() or 1)
    if memory_mb is None:
        try:
            memory_mb = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // 2**20
        except (ValueError, OSError, AttributeError):  # not a POSIX system: cores decide
            memory_mb = 2**40
    most = min(MAX_ENGINES_PER_CORE * cores, max(1, memory_mb // ENGINE_MEMORY_MB))
    if count > most:
        raise InvalidArgumentError(
            f"n={count} local engines is more than this machine can hold ({cores} CPU cores, "
            f"{memory_mb} MiB of memory; at most {most} engines: {MAX_ENGINES_PER_CORE} per "
            f"core, about {ENGINE_MEMORY_MB} MiB each). Pass n={cores} (one per core) or "
            "fewer, or spread the engines over machines with hosts=... ."
        )


def _finish(
    count: int,
    chosen: tuple[str, ...] | None,
    hosts: tuple[tuple[str, int], ...] | None,
    launcher: str,
    backend: str,
    strategy: str,
    timeout: float,
    mode: str,
    gpus: Any,
    required: bool,
) -> LaunchPlan:
    if launcher == "local" and hosts is None:
        check_capacity(count)
    if BACKENDS[backend] is CommunicationImplementation.NCCL and mode == "none":
        where = "gpus='none' asks for CPU engines" if gpus is not None else "no GPU is visible"
        raise InvalidArgumentError(
            f"backend='nccl' needs GPU engines, but these engines run on CPUs ({where}). Use "
            "backend='gloo' or 'auto' (gloo on CPUs, NCCL on GPUs)."
        )
    return LaunchPlan(
        n=count,
        gpus=chosen,
        hosts=hosts,
        launcher=launcher,
        backend=backend,
        implementation=BACKENDS[backend],
        strategy=strategy,
        timeout=float(timeout),
        gpu_mode=mode,
        gpus_required=required,
    )
