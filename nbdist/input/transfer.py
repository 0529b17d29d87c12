"""Moving each replica's batch to its device, asynchronously on CUDA so it can be prefetched.

On CUDA the copy runs on a side stream per device (`non_blocking=True`, overlapping the step
that runs meanwhile); when the batch is handed out, the consumer's current stream waits for
the copy and the tensors are recorded on that stream, so the caching allocator does not reuse
their memory early. Host tensors copy asynchronously only from pinned memory: use
`DataLoader(..., pin_memory=True)` for overlap. CPU replicas (`cpu:0`, `cpu:1`, ...) are never
copied: `.to(cpu)` returns the tensor itself. Imports nothing from nbdist.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from nbdist._private_api import pytree

__all__ = ["DeviceTransfer", "Staged"]


@dataclass
class Staged:
    """One step's batches, their copies under way: `DeviceTransfer.finish` hands them out."""

    parts: list[Any]
    pending: list[Any]  # (device, torch.cuda.Event) per replica copied on a side stream, else None
    sources: list[Any]  # the host batches, kept alive until their copies are done


def _tensors(structure: Any) -> list[torch.Tensor]:
    return [x for x in pytree.tree_leaves(structure) if isinstance(x, torch.Tensor)]


class DeviceTransfer:
    """Moves a step's per-replica batches to the replicas' devices.

    Args:
        devices: The torch device of each local replica, or None to leave batches where the
            input made them (`experimental_fetch_to_device=False`).

    Example:
        >>> transfer = DeviceTransfer([torch.device("cpu"), torch.device("cpu")])
        >>> x = torch.arange(2)
        >>> transfer.finish(transfer.start([x, x + 2]))[0] is x  # CPU: no copy
        True
    """

    def __init__(self, devices: Sequence[torch.device] | None):
        self._devices = tuple(devices) if devices is not None else None
        self._streams: dict[torch.device, Any] = {}

    @property
    def asynchronous(self) -> bool:
        """True when some replica's copies run on a CUDA side stream (worth prefetching)."""
        return self._devices is not None and any(d.type == "cuda" for d in self._devices)

    def start(self, parts: list[Any]) -> Staged:
        """Begin moving each replica's batch (`parts[j]`) to replica `j`'s device."""
        if self._devices is None:
            return Staged(parts, [None] * len(parts), [])
        moved, pending = [], []
        for part, device in zip(parts, self._devices):
            if device.type == "cuda":
                part, event = self._start_cuda(part, device)
                pending.append((device, event))
            else:
                part = _move(part, device, non_blocking=False)
                pending.append(None)
            moved.append(part)
        return Staged(moved, pending, parts)

    def finish(self, staged: Staged) -> list[Any]:
        """Make the consumer's streams wait for the copies and return the moved batches."""
        for part, pending in zip(staged.parts, staged.pending):
            if pending is None:
                continue
            device, event = pending
            consumer = torch.cuda.current_stream(device)
            consumer.wait_event(event)
            for tensor in _tensors(part):
                if tensor.device == device:
                    tensor.record_stream(consumer)
        staged.sources.clear()
        return staged.parts

    def _start_cuda(self, part: Any, device: torch.device) -> tuple[Any, Any]:
        stream = self._streams.get(device)
        if stream is None:
            stream = self._streams[device] = torch.cuda.Stream(device=device)
        # Tensors already on a GPU were made on that GPU's current stream: wait for them.
        for source_device in {t.device for t in _tensors(part) if t.is_cuda}:
            stream.wait_stream(torch.cuda.current_stream(source_device))
        with torch.cuda.stream(stream):
            part = _move(part, device, non_blocking=True)
            event = torch.cuda.Event()
            event.record(stream)
        return part, event


def _move(part: Any, device: torch.device, *, non_blocking: bool) -> Any:
    # An `(x, y)` batch already on the CPU: `.to` would return every tensor itself.
    if (
        device.type == "cpu"
        and type(part) in (tuple, list)
        and all(type(t) is torch.Tensor and t.is_cpu for t in part)
    ):
        return part
    return pytree.tree_map_only(
        torch.Tensor, lambda t: t.to(device, non_blocking=non_blocking), part
    )
