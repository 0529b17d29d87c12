"""Cross-device reduction and broadcast for replicas in one process (TF's `CrossDeviceOps`).

`ReductionToOneDevice` and `HierarchicalCopyAllReduce` reduce on one device and copy back;
`NcclAllReduce` runs `torch.cuda.nccl` over CUDA devices. Batched reductions pack many tensors
into flat buffers so one reduction carries them all. Imports core modules only.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, Protocol

from nbdist._lazy_module import LazyModule
from nbdist._private_api import foreach
from nbdist.core.devices import canonical_devices, physical_device
from nbdist.core.reduce.op import ReduceOp, as_reducible, refuse_bool
from nbdist.core.reduce.options import CommunicationOptions
from nbdist.core.values import DistributedValues, Mirrored
from nbdist.errors import ArgumentTypeError, InvalidArgumentError

if TYPE_CHECKING:
    import torch
else:
    torch = LazyModule("torch")  # imported at first use: not on `Cluster.start()`'s path

__all__ = [
    "CrossDeviceOps",
    "HierarchicalCopyAllReduce",
    "NcclAllReduce",
    "ReductionToOneDevice",
    "resolve_destinations",
]

DEFAULT_PACK_BYTES = 32 * 1024 * 1024


class Recorder(Protocol):
    """Where a `CrossDeviceOps` records its reductions: the strategy's `nbdist.telemetry.records`
    record, set by the strategy (the core names what it needs, and does not import the
    telemetry, which reads the core's variables)."""

    enabled: bool

    def record(
        self,
        op: str,
        nbytes: int,
        implementation: str,
        replicas: tuple[int, ...],
        start: float,
        duration: float,
        waits: Sequence[float],
    ) -> None: ...


class CrossDeviceOps:
    """Base class of algorithms that reduce and broadcast values across local devices.

    Implement these: `_reduce_tensors` (one tensor per replica in, one per destination out).
    Inherited: `reduce`, `batch_reduce`, `broadcast`, packing and telemetry.

    Example:
        >>> ops = ReductionToOneDevice()
        >>> from nbdist.core.values import PerReplica
        >>> value = PerReplica([torch.tensor(1.0), torch.tensor(2.0)], devices=["cpu:0", "cpu:1"])
        >>> ops.reduce("sum", value, destinations="cpu:0")
        tensor(3.)
    """

    implementation_name = "local"

    def __init__(self) -> None:
        self.telemetry: Recorder | None = None
        self.num_replicas_hint = 1
        """How many replicas a plain (not per-replica) value stands for (set by the strategy:
        a SUM of a plain tensor over several replicas is refused)."""
        self._replicas_seen = 1

    # -- implement these ------------------------------------------------------------------
    def _reduce_tensors(
        self, op: ReduceOp, tensors: list[torch.Tensor], destinations: tuple[str, ...]
    ) -> list[torch.Tensor]:
        raise NotImplementedError

    def check_devices(self, devices: Sequence[str]) -> None:
        """Raise `ValueError` when this algorithm cannot run on `devices`."""

    # -- inherited ------------------------------------------------------------------------
    def reduce(
        self,
        reduce_op: ReduceOp | str,
        per_replica_value: Any,
        destinations: Any,
        options: CommunicationOptions | None = None,
    ) -> Any:
        """Reduce a per-replica value to `destinations` (a `Mirrored` for several devices).

        Context: cross-replica. Hangs if: never (no other replica is waited for).
        `options` must be a `CommunicationOptions` or None: one tensor in one process is one
        reduction, so there is nothing to pack, compress or time out.
        """
        _check_options(options)
        op = ReduceOp.from_value(reduce_op)
        devices = resolve_destinations(destinations)
        tensors = self._components(op, per_replica_value)
        start = time.perf_counter()
        results = self._reduce_tensors(op, tensors, devices)
        self._replicas_seen = len(tensors)
        self._record(f"reduce:{op.value}", tensors[:1], start)
        return _as_destination_value(results, devices)

    def batch_reduce(
        self,
        reduce_op: ReduceOp | str,
        value_destination_pairs: Sequence[tuple[Any, Any]],
        options: CommunicationOptions | None = None,
    ) -> list[Any]:
        """Reduce many values at once: one reduction carries them all.

        Values whose components and destinations share one physical device are reduced with
        torch's multi-tensor (`_foreach`) kernels, one call for all of them; values that must
        cross devices are packed into flat buffers of `bytes_per_pack` bytes.

        Context: cross-replica. Hangs if: never.
        """
        _check_options(options)
        op = ReduceOp.from_value(reduce_op)
        explicit = options.bytes_per_pack if options else 0
        num_packs = getattr(self, "num_packs", 1)
        start = time.perf_counter()
        resolved: dict[int, tuple[str, ...]] = {}
        prepared = []
        for value, dest in value_destination_pairs:
            devices = resolved.get(id(dest))
            if devices is None:
                devices = resolved[id(dest)] = resolve_destinations(dest)
            prepared.append((self._components(op, value), devices))
        results: list[Any] = [None] * len(prepared)
        groups: dict[tuple, list[int]] = {}
        for index, (tensors, devices) in enumerate(prepared):
            key = (tensors[0].dtype, devices, len(tensors), tensors[0].device)
            groups.setdefault(key, []).append(index)
        for (dtype, devices, _, device), indices in groups.items():
            columns = [prepared[i][0] for i in indices]
            if self._fuse_in_place(op, dtype, device, devices):
                per_destination = _foreach_reduce(op, columns, len(devices))
                for k, index in enumerate(indices):
                    results[index] = _as_destination_value(
                        [out[k] for out in per_destination], devices
                    )
                continue
            pack_bytes = explicit or DEFAULT_PACK_BYTES
            if not explicit and num_packs > 1:  # HierarchicalCopyAllReduce(num_packs=k)
                total = sum(columns[k][0].numel() * columns[k][0].element_size()
                            for k in range(len(columns)))  # fmt: skip
                pack_bytes = max(1, -(-total // num_packs))
            for pack in _packs(indices, prepared, pack_bytes):
                reduced = self.reduce_packed(op, [prepared[i][0] for i in pack], devices)
                for index, per_destination in zip(pack, reduced):
                    results[index] = _as_destination_value(per_destination, devices)
        if prepared:
            self._replicas_seen = len(prepared[0][0])
            first_replica = [tensors[0] for tensors, _ in prepared]
            self._record(f"batch_reduce:{op.value}", first_replica, start)
        return results

    def _fuse_in_place(
        self, op: ReduceOp, dtype: torch.dtype, device: torch.device, devices: tuple[str, ...]
    ) -> bool:
        """True when a batch can be reduced with `_foreach` kernels where it lies."""
        if self.implementation_name == "nccl" or not (dtype.is_floating_point or op is not
                                                         ReduceOp.MEAN):  # fmt: skip
            return False
        return all(physical_device(d) == device for d in devices)

    def broadcast(self, tensor: torch.Tensor, destinations: Any) -> Any:
        """Copy `tensor` to every destination device (a `Mirrored` for several devices)."""
        devices = resolve_destinations(destinations)
        copies = [_copy_to(tensor, device, i > 0) for i, device in enumerate(devices)]
        return _as_destination_value(copies, devices)

    def reduce_packed(
        self, op: ReduceOp, per_value: list[list[torch.Tensor]], devices: tuple[str, ...]
    ) -> list[list[torch.Tensor]]:
        """Reduce several values (each a list of per-replica tensors) through one flat buffer."""
        if len(per_value) == 1:
            return [self._reduce_tensors(op, per_value[0], devices)]
        replicas = len(per_value[0])
        flats = [torch.cat([v[r].reshape(-1) for v in per_value]) for r in range(replicas)]
        reduced = self._reduce_tensors(op, flats, devices)
        sizes = [v[0].numel() for v in per_value]
        shapes = [v[0].shape for v in per_value]
        out: list[list[torch.Tensor]] = [[] for _ in per_value]
        for flat in reduced:
            for i, piece in enumerate(torch.split(flat, sizes)):
                out[i].append(piece.view(shapes[i]))
        return out

    def _components(self, op: ReduceOp, value: Any) -> list[torch.Tensor]:
        if isinstance(value, DistributedValues):
            tensors = [as_reducible(v, "reduce_to") for v in value.values]
            refuse_bool(op, tensors)  # Note [Bool reductions]
            _check_same_shapes(tensors)
            return tensors
        tensor = as_reducible(value, "reduce_to")
        refuse_bool(op, (tensor,))
        if op is ReduceOp.SUM and self.num_replicas_hint > 1:
            raise InvalidArgumentError(
                f"A plain tensor cannot be SUM-reduced over {self.num_replicas_hint} replicas: "
                "it is not a per-replica value, so the sum is ambiguous. Pass the PerReplica "
                "value returned by strategy.run, or use MEAN."
            )
        return [tensor]

    def _record(self, op: str, tensors: list[torch.Tensor], start: float) -> None:
        """Record one reduction: `tensors` are one replica's contributions."""
        telemetry = self.telemetry
        if telemetry is not None and telemetry.enabled:
            nbytes = sum(t.numel() * t.element_size() for t in tensors)
            replicas = tuple(range(self._replicas_seen))
            duration = time.perf_counter() - start
            telemetry.record(
                op, nbytes, self.implementation_name, replicas, start, duration,
                (0.0,) * len(replicas),
            )  # fmt: skip


class ReductionToOneDevice(CrossDeviceOps):
    """Copy every value to one device, reduce there, then copy the result back.

    Args:
        reduce_to_device: Where to reduce (default: the first destination).
        accumulation_fn: Sums a list of tensors (default: repeated in-place `add`).

    Example:
        >>> ReductionToOneDevice(reduce_to_device="cpu:0").reduce_to_device
        'cpu:0'
    """

    implementation_name = "reduction_to_one_device"

    def __init__(
        self,
        reduce_to_device: str | None = None,
        accumulation_fn: Callable[[list[torch.Tensor]], torch.Tensor] | None = None,
    ):
        super().__init__()
        self.reduce_to_device = canonical_devices(reduce_to_device)[0] if reduce_to_device else None
        self.accumulation_fn = accumulation_fn

    def _reduce_tensors(self, op, tensors, destinations):
        target = physical_device(self.reduce_to_device or destinations[0])
        local = [t.to(target, non_blocking=True) for t in tensors]
        if self.accumulation_fn is not None and op in (ReduceOp.SUM, ReduceOp.MEAN):
            reduced = self.accumulation_fn(local)
            if op is ReduceOp.MEAN:
                reduced = reduced / len(local)
        else:
            reduced = op.combine(local)
        return [_copy_to(reduced, device, i > 0) for i, device in enumerate(destinations)]


def _checked_num_packs(num_packs: Any) -> int:
    """`num_packs` of an all-reduce algorithm, refused unless a positive whole number."""
    if not isinstance(num_packs, int) or num_packs < 1:
        raise InvalidArgumentError(f"num_packs must be a positive whole number, got {num_packs!r}.")
    return num_packs


class _InPacks:
    """The `num_packs` option of the packing cross-device ops (checked once, here)."""

    def __init__(self, num_packs: int = 1):
        super().__init__()
        self.num_packs = _checked_num_packs(num_packs)


class HierarchicalCopyAllReduce(_InPacks, ReductionToOneDevice):
    """Reduction through one device, with batched values split into `num_packs` packs.

    Example:
        >>> HierarchicalCopyAllReduce(num_packs=2).num_packs
        2
    """

    implementation_name = "hierarchical_copy"


class NcclAllReduce(_InPacks, CrossDeviceOps):
    """All-reduce with NCCL between the CUDA devices of one process (`torch.cuda.nccl`).

    Raises:
        ValueError: used with devices that are not CUDA GPUs; names the alternatives.

    Example:
        >>> NcclAllReduce(num_packs=1).num_packs
        1
    """

    implementation_name = "nccl"

    def check_devices(self, devices: Sequence[str]) -> None:
        """Raise `ValueError` unless every device is a CUDA GPU."""
        others = [d for d in devices if not d.startswith("cuda")]
        if others:
            raise InvalidArgumentError(
                f"NcclAllReduce needs CUDA GPUs but the devices include {others}. Use "
                "nbdist.ReductionToOneDevice() or nbdist.HierarchicalCopyAllReduce() for CPU "
                "devices (or leave cross_device_ops=None to choose automatically)."
            )

    def _reduce_tensors(self, op, tensors, destinations):
        self.check_devices(destinations)
        if len(tensors) != len(destinations):
            return ReductionToOneDevice().reduce_packed(op, [tensors], destinations)[0]
        buffers = [
            t.to(physical_device(d), copy=True) for t, d in zip(tensors, destinations)
        ]  # fmt: skip
        torch.cuda.nccl.all_reduce(buffers, op=_NCCL_OPS[op])
        if op is ReduceOp.MEAN:
            for buffer in buffers:
                buffer.div_(len(buffers))
        return buffers


_NCCL_OPS = {ReduceOp.SUM: 0, ReduceOp.MEAN: 0, ReduceOp.MAX: 2, ReduceOp.MIN: 3}


def resolve_destinations(destinations: Any) -> tuple[str, ...]:
    """The devices named by `destinations`: a device, a list of them, or a distributed value.

    Example:
        >>> resolve_destinations(["CPU:0", "cpu:1"])
        ('cpu:0', 'cpu:1')
    """
    devices = getattr(destinations, "devices", None)
    if isinstance(devices, tuple) and devices:
        return devices
    if isinstance(destinations, DistributedValues):
        return tuple(str(v.device) for v in destinations.values)
    if isinstance(destinations, torch.Tensor):
        return canonical_devices([str(destinations.device)])
    device = getattr(destinations, "device", None)
    if isinstance(device, str) and not isinstance(destinations, (str, list, tuple)):
        return canonical_devices([device])
    return canonical_devices(destinations)


def _check_same_shapes(tensors: list[torch.Tensor]) -> None:
    shapes = [tuple(t.shape) for t in tensors]
    if len(set(shapes)) > 1:
        listed = ", ".join(f"replica {i}: {s}" for i, s in enumerate(shapes))
        raise InvalidArgumentError(
            f"Cannot reduce per-replica values of different shapes ({listed}). Reduce along "
            "the batch axis with axis=0, or make every replica produce the same shape."
        )


def _copy_to(tensor: torch.Tensor, device: str, force_copy: bool) -> torch.Tensor:
    target = physical_device(device)
    if tensor.device == target:
        return tensor.clone() if force_copy else tensor
    return tensor.to(target, non_blocking=True)


def _as_destination_value(results: list[torch.Tensor], devices: tuple[str, ...]) -> Any:
    if len(results) == 1:
        return results[0]
    return Mirrored(results, devices=devices)


def _foreach_reduce(
    op: ReduceOp, columns: list[list[torch.Tensor]], destinations: int
) -> list[list[torch.Tensor]]:
    """Reduce values (each a list of per-replica tensors on one device) with `_foreach` ops.

    Returns one list of results per destination (copies for every destination after the first).
    """
    replicas = list(zip(*columns))
    if len(replicas) == 1:
        total = [t.clone() for t in replicas[0]]
    elif op in (ReduceOp.SUM, ReduceOp.MEAN):
        total = foreach.add(list(replicas[0]), list(replicas[1]))
        for more in replicas[2:]:
            foreach.add_(total, list(more))
        if op is ReduceOp.MEAN:
            foreach.div_(total, float(len(replicas)))
    else:
        combine = foreach.maximum if op is ReduceOp.MAX else foreach.minimum
        total = combine(list(replicas[0]), list(replicas[1]))
        for more in replicas[2:]:
            total = combine(total, list(more))
    outputs = [total]
    for _ in range(1, destinations):
        outputs.append(foreach.mul(total, 1))
    return outputs


def _check_options(options: Any) -> None:
    if options is not None and not isinstance(options, CommunicationOptions):
        raise ArgumentTypeError(
            f"CrossDeviceOps options must be nbdist.experimental.CommunicationOptions or None, "
            f"got {options!r}."
        )


def _packs(
    indices: list[int], prepared: list[tuple[list[torch.Tensor], Any]], pack_bytes: int
) -> list[list[int]]:
    packs: list[list[int]] = [[]]
    size = 0
    for index in indices:
        tensor = prepared[index][0][0]
        nbytes = tensor.numel() * tensor.element_size()
        if packs[-1] and size + nbytes > pack_bytes:
            packs.append([])
            size = 0
        packs[-1].append(index)
        size += nbytes
    return packs
