"""Sizes as people read them, for messages, figures and stack views.

Example:
    >>> format_bytes(16), format_bytes(4096), format_bytes(3 * 1024 * 1024)
    ('16 B', '4.0 KiB', '3.0 MiB')
"""

from __future__ import annotations

__all__ = ["format_bytes"]


def format_bytes(nbytes: float) -> str:
    """`nbytes` in B, KiB or MiB (MiB for anything larger: collectives stay well under GiB)."""
    for unit in ("B", "KiB"):
        if nbytes < 1024:
            return f"{nbytes:.0f} {unit}" if unit == "B" else f"{nbytes:.1f} {unit}"
        nbytes /= 1024
    return f"{nbytes:.1f} MiB"
