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

from nbdist.communication import CommunicationImplementation

__all__ = [
    "BACKENDS",
    "DEFAULT_CPU_ENGINES",
    "LAUNCHERS",
    "STRATEGIES",
    "LaunchPlan",
    "local_gpu_ids",
    "make_plan",
    "parse_hosts",
]

LAUNCHERS = ("local", "ssh", "mpi", "slurm")
"""Launcher names, as `%dist start --launcher` spells them."""

BACKENDS = {
    "auto": CommunicationImplementation.AUTO,
    "gloo": CommunicationImplementation.RING,
    "nccl": CommunicationImplementation.NCCL,
}
"""Backend name → `CommunicationImplementation` of the engines' strategy."""

STRATEGIES = ("mirrored", "multi_worker", "parameter_server")
"""Strategy names. On engines, "mirrored" and "multi_worker" both mean one replica per engine
in one `torch.distributed` group (`MultiWorkerMirroredStrategy`)."""

DEFAULT_CPU_ENGINES = 2
"""Engines started when `n` is not given and there is no GPU: the smallest multi-replica cluster."""

_NOT_YET = {
    "ssh": "ipyparallel's SSHEngineSetLauncher",
    "mpi": "ipyparallel's MPIEngineSetLauncher",
    "slurm": "ipyparallel's SlurmEngineSetLauncher",
}


@dataclasses.dataclass(frozen=True)
class LaunchPlan:
    """A checked description of the engines to start.

    Attributes:
        n: Number of engines (= replicas).
        gpus: Per engine, the `CUDA_VISIBLE_DEVICES` value it is pinned to (one physical GPU);
            None for CPU engines.
        hosts: `(host, count)` pairs for remote engines; None for engines on this machine.
        launcher: One of `LAUNCHERS`.
        backend: One of `BACKENDS`' names.
        implementation: The `CommunicationImplementation` the engines' strategy uses.
        strategy: One of `STRATEGIES`.
        timeout: Seconds for the engines to start and join, and for them to stop.
    """

    n: int
    gpus: tuple[str, ...] | None
    hosts: tuple[tuple[str, int], ...] | None
    launcher: str
    backend: str
    implementation: CommunicationImplementation
    strategy: str
    timeout: float

    @property
    def device_kind(self) -> str:
        """`"gpu"` or `"cpu"`."""
        return "gpu" if self.gpus else "cpu"

    def engine_sets(self) -> list[tuple[int, dict[str, str]]]:
        """`(count, environment)` per ipyparallel engine set to start.

        CPU engines are one set of `n`; GPU engines are one set per GPU, each with its own
        `CUDA_VISIBLE_DEVICES`, so every engine sees exactly one GPU (as `cuda:0`).

        Example:
            >>> make_plan(gpus=[0, 1], gpu_ids=("0", "1")).engine_sets()
            [(1, {'CUDA_VISIBLE_DEVICES': '0'}), (1, {'CUDA_VISIBLE_DEVICES': '1'})]
        """
        if not self.gpus:
            return [(self.n, {})]
        return [(1, {"CUDA_VISIBLE_DEVICES": gpu}) for gpu in self.gpus]


def local_gpu_ids() -> tuple[str, ...]:
    """The physical ids of the CUDA GPUs this process sees, honouring `CUDA_VISIBLE_DEVICES`.

    Returns what each engine's `CUDA_VISIBLE_DEVICES` must be set to for it to see that GPU
    alone: `("0", "1")` on a 2-GPU machine; `("2", "3")` when `CUDA_VISIBLE_DEVICES=2,3`.
    Asks torch how many devices there are (no CUDA context is created).
    """
    import torch

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
            raise ValueError(
                f"hosts entry {item!r} is not HOST or HOST:COUNT with COUNT >= 1. "
                "Write e.g. hosts='node1:2,node2:2'."
            )
        if any(host == seen for seen, _ in parsed):
            raise ValueError(
                f"host {host!r} is listed twice in hosts={hosts!r}; give it once with the "
                "total count, e.g. 'node1:4'."
            )
        parsed.append((host, int(count_text)))
    if not parsed:
        raise ValueError(f"hosts={hosts!r} names no host; write e.g. hosts='node1:2,node2:2'.")
    return tuple(parsed)


def _check_n(n: Any) -> int | None:
    if n is None:
        return None
    if isinstance(n, bool) or not isinstance(n, int):
        raise TypeError(f"n must be a whole number of engines, got {n!r}; pass e.g. n=2.")
    if n < 1:
        raise ValueError(f"n must be at least 1 engine, got n={n}; pass e.g. n=2.")
    return n


def _choose(name: str, value: Any, valid: Sequence[str]) -> str:
    text = value.strip().lower() if isinstance(value, str) else None
    if text not in valid:
        raise ValueError(f"Unknown {name} {value!r}; choose one of {', '.join(map(repr, valid))}.")
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
        raise TypeError(
            f"gpus={gpus!r} is ambiguous: pass gpus='all', a list of GPU indices such as "
            "gpus=[0, 1], or n=2 for two engines."
        )
    else:
        try:
            items = list(gpus)
        except TypeError:
            raise TypeError(
                f"gpus must be 'all', 'none', a list of GPU indices or '0,1', got {gpus!r}."
            ) from None
    if not items:
        return "none"
    indices = []
    for item in items:
        if isinstance(item, bool) or not (
            isinstance(item, int) or (isinstance(item, str) and item.isdecimal())
        ):
            raise ValueError(
                f"gpus={gpus!r}: {item!r} is not a GPU index. Write gpus='all', gpus=[0, 1] "
                "or gpus='0,1'."
            )
        indices.append(int(item))
    if len(set(indices)) != len(indices):
        raise ValueError(
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
            `gpus`; `hosts` with the local launcher; NCCL without GPU engines; a timeout that
            is not positive.
        TypeError: `n` or `gpus` of the wrong type.
        NotImplementedError: a launcher or strategy this version cannot start yet.

    Example:
        >>> make_plan(n=0)
        Traceback (most recent call last):
        ...
        ValueError: n must be at least 1 engine, got n=0; pass e.g. n=2.
    """
    n = _check_n(n)
    launcher = _choose("launcher", launcher, LAUNCHERS)
    backend = _choose("backend", backend, tuple(BACKENDS))
    strategy = _choose("strategy", strategy, STRATEGIES)
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not timeout > 0:
        raise ValueError(f"timeout must be a positive number of seconds, got {timeout!r}.")
    if not math.isfinite(timeout):
        raise ValueError(f"timeout must be finite, got {timeout!r}; pass e.g. timeout=120.")
    if strategy == "parameter_server":
        raise NotImplementedError(
            "strategy='parameter_server' is not available on engines yet. Use "
            "strategy='mirrored' (one replica per engine, gradients all-reduced)."
        )
    parsed_hosts = parse_hosts(hosts) if hosts is not None else None
    if parsed_hosts is not None and launcher == "local":
        raise ValueError(
            f"hosts={hosts!r} needs a launcher that reaches other machines; pass "
            "launcher='ssh' (or 'mpi', 'slurm'), or leave hosts out for engines on this machine."
        )
    if launcher != "local":
        raise NotImplementedError(
            f"launcher={launcher!r} ({_NOT_YET[launcher]}) is not wired up in this version of "
            "nbdist.Cluster; only launcher='local' (engines on this machine) can be started. "
            "For other machines, start engines with ipyparallel's `ipcluster` for now."
        )
    wanted = _gpu_indices(gpus)
    available = tuple(local_gpu_ids() if gpu_ids is None else gpu_ids)
    chosen: tuple[str, ...] | None
    if wanted == "none" or (wanted is None and not available):
        chosen = None
        count = n if n is not None else DEFAULT_CPU_ENGINES
    elif wanted in ("all", None):
        if not available:
            raise ValueError(
                "gpus='all' asks for one engine per GPU, but no CUDA GPU is visible here "
                "(torch.cuda.device_count() is 0). Start CPU engines instead: Cluster(n=2) "
                "(or gpus='none'), or check CUDA_VISIBLE_DEVICES and the driver."
            )
        if wanted == "all" and n is not None and n != len(available):
            raise ValueError(
                f"n={n} but gpus='all' means one engine per GPU, and there are "
                f"{len(available)}. Leave n out, or pick GPUs with gpus=[...]."
            )
        if n is not None and n > len(available):
            raise ValueError(
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
            raise ValueError(
                f"gpus={gpus!r} asks for GPU(s) {missing}, but this machine has {have}. "
                "Pick existing GPUs, or gpus='none' / Cluster(n=2) for CPU engines."
            )
        if n is not None and n != len(wanted):
            raise ValueError(
                f"n={n} disagrees with gpus={gpus!r} ({len(wanted)} GPU(s)); one engine runs "
                "per GPU. Leave n out."
            )
        chosen = tuple(available[i] for i in wanted)
        count = len(chosen)
    if BACKENDS[backend] is CommunicationImplementation.NCCL and not chosen:
        raise ValueError(
            "backend='nccl' needs GPU engines, but these engines run on CPUs. Use "
            "backend='gloo' or 'auto' (gloo on CPUs, NCCL on GPUs)."
        )
    return LaunchPlan(
        n=count,
        gpus=chosen,
        hosts=parsed_hosts,
        launcher=launcher,
        backend=backend,
        implementation=BACKENDS[backend],
        strategy=strategy,
        timeout=float(timeout),
    )
