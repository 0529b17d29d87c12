"""Device strings: TensorFlow spellings normalised to PyTorch's, and checked against the machine.

`"cpu:0"`, `"cpu:1"`, ... are *logical* CPU devices: distinct replicas computing on the host CPU.
Imports only nbdist.errors and torch; never initialises CUDA beyond counting devices.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Sequence
from typing import TYPE_CHECKING

from nbdist._lazy_module import LazyModule
from nbdist.errors import ArgumentTypeError, InvalidArgumentError

if TYPE_CHECKING:
    import torch
else:
    torch = LazyModule("torch")  # imported at first use: not on `Cluster.start()`'s path

__all__ = ["canonical_device", "canonical_devices", "default_devices", "physical_device"]

_TF_DEVICE = re.compile(
    r"^(?:/job:(?P<job>[\w-]+))?(?:/replica:(?P<replica>\d+))?(?:/task:(?P<task>\d+))?"
    r"(?:/device:|/)?(?P<kind>[A-Za-z]+)(?::(?P<index>[^/]*))?$"
)
_KIND_ALIASES = {"cpu": "cpu", "gpu": "cuda", "cuda": "cuda", "mps": "mps"}


def canonical_device(device: str | torch.device | int) -> str:
    """Normalise a device spelling to PyTorch's and check that the device exists (cached).

    See `_canonical_device`.

    Example:
        >>> canonical_device("GPU:0") if torch.cuda.is_available() else "cuda:0"
        'cuda:0'
    """
    if isinstance(device, torch.device):
        device = str(device)
    if isinstance(device, (str, int)):
        return _canonical_cached(device)
    return _canonical_device(device)


@functools.lru_cache(maxsize=256)
def _canonical_cached(device: str | int) -> str:
    return _canonical_device(device)


def _canonical_device(device: str | torch.device | int) -> str:
    """Normalise a device spelling to PyTorch's and check that the device exists.

    TensorFlow spellings are accepted (`"CPU:0"`, `"/gpu:1"`, `"/device:GPU:1"`,
    `"/job:worker/replica:0/task:1/device:GPU:0"`); a bare kind gets index 0.

    Raises:
        ValueError: the device is unknown or not on this machine; the message lists those that are.

    Example:
        >>> canonical_device("/device:CPU:1")
        'cpu:1'
    """
    if isinstance(device, int):
        device = f"cuda:{device}"
    if isinstance(device, torch.device):
        device = str(device)
    if not isinstance(device, str):
        raise ArgumentTypeError(
            f"A device must be a string such as 'cpu:0' or 'cuda:1', got {device!r}."
        )
    match = _TF_DEVICE.match(device.strip())
    kind = _KIND_ALIASES.get(match.group("kind").lower()) if match else None
    index_text = (match.group("index") if match else None) or "0"
    if kind is None or not index_text.isdigit():
        raise InvalidArgumentError(f"Unknown device {device!r}. {_devices_that_exist()}")
    index = int(index_text)
    if kind == "cuda" and index >= torch.cuda.device_count():
        raise InvalidArgumentError(
            f"Device {device!r} is not available on this machine "
            f"({torch.cuda.device_count()} CUDA GPU(s)). {_devices_that_exist()}"
        )
    if kind == "mps" and (index != 0 or not torch.backends.mps.is_available()):
        raise InvalidArgumentError(f"Device {device!r} is not available. {_devices_that_exist()}")
    return f"{kind}:{index}"


def canonical_devices(devices: Sequence[str | torch.device] | str) -> tuple[str, ...]:
    """Normalise a list of devices; duplicates raise `ValueError`.

    Example:
        >>> canonical_devices(["CPU:0", "/cpu:1"])
        ('cpu:0', 'cpu:1')
    """
    if isinstance(devices, (str, torch.device)):
        devices = [devices]
    result = tuple(canonical_device(d) for d in devices)
    if not result:
        raise InvalidArgumentError(
            "The device list is empty; pass at least one device, e.g. ['cpu:0']."
        )
    if len(set(result)) != len(result):
        raise InvalidArgumentError(
            f"Devices {list(devices)!r} name the same device twice: {list(result)}."
        )
    return result


def default_devices() -> tuple[str, ...]:
    """Every local CUDA GPU, or one CPU replica when there is none (TF's default).

    Example:
        >>> default_devices() if not torch.cuda.is_available() else ("cpu:0",)
        ('cpu:0',)
    """
    count = torch.cuda.device_count()
    return tuple(f"cuda:{i}" for i in range(count)) if count else ("cpu:0",)


def physical_device(device: str) -> torch.device:
    """The torch device a canonical device string computes on (`cpu:N` → `cpu`).

    Example:
        >>> physical_device("cpu:1")
        device(type='cpu')
    """
    kind, _, index = device.partition(":")
    if kind == "cpu":
        return torch.device("cpu")
    return torch.device(kind, int(index or 0))


def _devices_that_exist() -> str:
    gpus = [f"cuda:{i}" for i in range(torch.cuda.device_count())]
    listed = ", ".join(["cpu:0", "cpu:1", "... (logical CPU devices)", *gpus])
    return f"Devices on this machine: {listed}."
