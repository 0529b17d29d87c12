"""What each device holds: parameters, buffers and `nd.Variable`s found in a namespace (count
and bytes, grouped by module name), and the memory in use (CUDA memory on GPUs, the process's
RSS on CPUs). Read by the dashboard's placement view; imports nothing from Jupyter.

Example:
    >>> import torch
    >>> rows = holdings({"model": torch.nn.Linear(2, 3)})
    >>> [(r["device"], r["kind"], r["module"], r["count"], r["bytes"]) for r in rows]
    [('cpu', 'parameters', 'model', 2, 36)]
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

__all__ = ["holdings", "memory_in_use"]


def holdings(namespace: Mapping[str, Any]) -> list[dict[str, Any]]:
    """One row per (device, kind, module name): `count` tensors and their `bytes`.

    Kinds: `"parameters"` and `"buffers"` of `torch.nn.Module`s, `"parameter shards"` for
    the parameters `FullyShardedStrategy` sharded (the bytes of this replica's shards, not of
    the whole tensors), `"variables"` for `nd.Variable`s (each component of a mirrored variable
    on its own device).
    """
    import torch

    from nbdist.core.variables import Variable

    totals: dict[tuple[str, str, str], list[int]] = {}

    def add(device: Any, kind: str, module: str, tensor: torch.Tensor) -> None:
        row = totals.setdefault((str(device), kind, module), [0, 0])
        row[0] += 1
        row[1] += tensor.numel() * tensor.element_size()

    seen: set[int] = set()
    for name, value in list(namespace.items()):
        if name.startswith("_") or id(value) in seen:
            continue
        seen.add(id(value))
        if isinstance(value, torch.nn.Module):
            for p in value.parameters():
                local = getattr(p, "to_local", None)  # a DTensor: this replica's shard
                if local is not None:
                    add(p.device, "parameter shards", name, local())
                else:
                    add(p.device, "parameters", name, p)
            for b in value.buffers():
                add(b.device, "buffers", name, b)
        elif isinstance(value, Variable):
            for device, component in _components(value):
                add(device, "variables", name, component)
    return [
        {"device": d, "kind": k, "module": m, "count": c, "bytes": b}
        for (d, k, m), (c, b) in sorted(totals.items())
    ]


def _components(variable: Any) -> list[Any]:
    values = getattr(variable, "values", None)
    parts = values if isinstance(values, tuple) and values else (variable,)
    return [(getattr(part, "device", "cpu"), part.read_value()) for part in parts]


def memory_in_use(device: str = "cpu") -> int:
    """Bytes in use: CUDA memory allocated for `cuda:N`, else this process's RSS."""
    if device.startswith("cuda"):
        import torch

        return int(torch.cuda.memory_allocated(device))
    import psutil

    return int(psutil.Process(os.getpid()).memory_info().rss)
