"""`MirroredStrategy`: synchronous training on several devices of one process."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from nbdist.core.devices import canonical_devices, default_devices
from nbdist.core.reduce.cross_device import CrossDeviceOps, NcclAllReduce, ReductionToOneDevice
from nbdist.strategies.local import LocalStrategy

__all__ = ["MirroredStrategy"]


class MirroredStrategy(LocalStrategy):
    """One replica per device, variables mirrored on every device, kept in sync on write.

    Args:
        devices: Device strings (`["cpu:0", "cpu:1"]`, `["GPU:0", "GPU:1"]`); None means every
            local GPU, or one CPU replica when there is none.
        cross_device_ops: How to reduce across devices; None picks `NcclAllReduce` when every
            device is a CUDA GPU, else `ReductionToOneDevice`.

    Example:
        >>> import nbdist as nd
        >>> strategy = nd.MirroredStrategy(["cpu:0", "cpu:1"])
        >>> with strategy.scope():
        ...     model = torch.nn.Linear(2, 1)
        >>> strategy.num_replicas_in_sync
        2
    """

    def __init__(
        self,
        devices: Sequence[str | torch.device] | None = None,
        cross_device_ops: CrossDeviceOps | None = None,
    ):
        names = canonical_devices(devices) if devices is not None else default_devices()
        if cross_device_ops is None:
            all_cuda = all(d.startswith("cuda") for d in names)
            cross_device_ops = (
                NcclAllReduce() if all_cuda and len(names) > 1 else (ReductionToOneDevice())
            )
        super().__init__(names, names, cross_device_ops)
