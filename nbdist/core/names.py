"""Case-insensitive lookup of enum members by name: every nbdist option that takes an enum also
takes its name in any case (`"sum"`, `"Nccl"`, `"on_read"`). Imports nothing from nbdist."""

from __future__ import annotations

import enum
from typing import Any, TypeVar

__all__ = ["member_by_name"]

E = TypeVar("E", bound=enum.Enum)


def member_by_name(cls: type[E], value: Any) -> E | None:
    """The member of `cls` that `value` is or names (any case, spaces ignored), else None.

    Example:
        >>> class Color(enum.Enum):
        ...     RED = "RED"
        >>> member_by_name(Color, " red"), member_by_name(Color, "blue")
        (<Color.RED: 'RED'>, None)
    """
    if isinstance(value, cls):
        return value
    if isinstance(value, str):
        return cls.__members__.get(value.strip().upper())
    return None
