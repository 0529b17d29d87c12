"""`CentralStorageStrategy`: replicas compute on several devices, variables live on one."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from nbdist.core.devices import canonical_device, canonical_devices, default_devices
from nbdist.core.reduce.cross_device import ReductionToOneDevice
from nbdist.strategies.local import LocalStrategy

__all__ = ["CentralStorageStrategy"]


class CentralStorageStrategy(LocalStrategy):
    """Compute on every device; keep one copy of each variable on the parameter device.

    Args:
        compute_devices: Devices running replicas (None: every GPU, else one CPU replica).
        parameter_device: Where variables live (None: the CPU when there are several compute
            devices, else the single compute device).

    Example:
        >>> import nbdist as nd
        >>> strategy = nd.CentralStorageStrategy(["cpu:0", "cpu:1"], parameter_device="cpu:0")
        >>> strategy.extended.parameter_devices
        ('cpu:0',)
    """

    _central_storage = True

    def __init__(
        self,
        compute_devices: Sequence[str | torch.device] | None = None,
        parameter_device: str | torch.device | None = None,
    ):
        names = canonical_devices(compute_devices) if compute_devices else default_devices()
        if parameter_device is not None:
            parameter = canonical_device(parameter_device)
        else:
            parameter = "cpu:0" if len(names) > 1 else names[0]
        super().__init__(names, (parameter,), ReductionToOneDevice(reduce_to_device=parameter))

    def __repr__(self) -> str:
        return (
            f"CentralStorageStrategy(compute_devices={list(self._devices)!r}, "
            f"parameter_device={self._parameter_devices[0]!r})"
        )
