"""`OneDeviceStrategy` and the default strategy: one replica, no communication."""

from __future__ import annotations

import torch

from nbdist.core.devices import canonical_device, physical_device
from nbdist.strategies.local import LocalStrategy

__all__ = ["DefaultStrategy", "OneDeviceStrategy"]


class OneDeviceStrategy(LocalStrategy):
    """Run on one device: variables and computation are placed there.

    Args:
        device: A device string (`"cpu"`, `"cuda:0"`, or TF's `"/gpu:0"`).

    Example:
        >>> import nbdist as nd
        >>> strategy = nd.OneDeviceStrategy("/cpu:0")
        >>> strategy.extended.worker_devices, strategy.num_replicas_in_sync
        (('cpu:0',), 1)
    """

    def __init__(self, device: str | torch.device):
        name = canonical_device(device)
        super().__init__((name,), (name,), cross_device_ops=None)

    def __repr__(self) -> str:
        return f"OneDeviceStrategy(device={self._devices[0]!r})"


class DefaultStrategy(LocalStrategy):
    """The strategy that answers outside every scope: one replica on the default device.

    Example:
        >>> import nbdist as nd
        >>> nd.get_strategy().num_replicas_in_sync
        1
    """

    # Its scope changes no context, and another strategy may be entered inside it (as in TF).
    changes_context = False

    def __init__(self) -> None:
        device = torch.get_default_device()
        name = f"{device.type}:{device.index or 0}"
        super().__init__((name,), (name,), cross_device_ops=None)
        self._target = physical_device(name)

    def __repr__(self) -> str:
        return "DefaultStrategy()"
