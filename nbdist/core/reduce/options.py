"""`CommunicationOptions` and `CommunicationImplementation`: how collectives communicate.

Exported under `nbdist.experimental` as in TensorFlow. Imports nothing from nbdist.
"""

from __future__ import annotations

import dataclasses
import enum

from nbdist.core.names import member_by_name
from nbdist.errors import InvalidArgumentError

__all__ = ["DEFAULT_TIMEOUT_SECONDS", "CommunicationImplementation", "CommunicationOptions"]

DEFAULT_TIMEOUT_SECONDS = 300.0


class CommunicationImplementation(enum.Enum):
    """Which library carries collectives between processes.

    `AUTO` picks NCCL when every replica is a CUDA device, else `RING` (gloo). Names are accepted
    in any case.

    Example:
        >>> CommunicationImplementation.from_value("nccl")
        <CommunicationImplementation.NCCL: 'NCCL'>
    """

    AUTO = "AUTO"
    RING = "RING"
    NCCL = "NCCL"

    @classmethod
    def from_value(cls, value: CommunicationImplementation | str) -> CommunicationImplementation:
        """Return the member for a member or its name."""
        member = member_by_name(cls, value)
        if member is not None:
            return member
        names = ", ".join(m.value for m in cls)
        raise InvalidArgumentError(
            f"Unknown communication implementation {value!r}; choose one of {names}."
        )


@dataclasses.dataclass(frozen=True)
class CommunicationOptions:
    """Options for cross-replica communication.

    Args:
        bytes_per_pack: Bucket size of batched reductions in bytes; 0 chooses automatically.
        timeout_seconds: How long a collective waits for every replica; None means 300 s.
        implementation: `CommunicationImplementation` or its name.
        compression: None, `"fp16"` or `"bf16"`: floating tensors travel at half width and get
            their dtype back after the reduction (beyond TF).

    Example:
        >>> CommunicationOptions(timeout_seconds=5).timeout
        5.0
    """

    bytes_per_pack: int = 0
    timeout_seconds: float | None = None
    implementation: CommunicationImplementation | str = CommunicationImplementation.AUTO
    compression: str | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.bytes_per_pack, int) or self.bytes_per_pack < 0:
            raise InvalidArgumentError(
                f"bytes_per_pack must be a whole number of bytes >= 0 (0: automatic), "
                f"got {self.bytes_per_pack!r}."
            )
        if self.timeout_seconds is not None and not self.timeout_seconds > 0:
            raise InvalidArgumentError(
                f"timeout_seconds must be a positive number of seconds or None (300 s), "
                f"got {self.timeout_seconds!r}."
            )
        object.__setattr__(
            self, "implementation", CommunicationImplementation.from_value(self.implementation)
        )
        if self.compression is not None:
            name = str(self.compression).lower()
            if name not in ("fp16", "bf16"):
                raise InvalidArgumentError(
                    f"compression must be None, 'fp16' or 'bf16', got {self.compression!r}."
                )
            object.__setattr__(self, "compression", name)

    @property
    def timeout(self) -> float:
        """The timeout in seconds, with the default filled in."""
        return float(self.timeout_seconds or DEFAULT_TIMEOUT_SECONDS)

    def merge(self, override: CommunicationOptions | None) -> CommunicationOptions:
        """These options with the fields that `override` sets replaced (per-call options)."""
        if override is None:
            return self
        defaults = CommunicationOptions()
        changes = {
            field.name: getattr(override, field.name)
            for field in dataclasses.fields(self)
            if getattr(override, field.name) != getattr(defaults, field.name)
        }
        return dataclasses.replace(self, **changes)
