"""Argument types shared by the `nbdist` command and `nbdist demo`'s own parser.

Example:
    >>> positive_int("3")
    3
"""

from __future__ import annotations

import argparse

__all__ = ["positive_int"]


def positive_int(text: str) -> int:
    """An argparse `type=`: a whole number of at least 1 (engines, epochs)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value
