"""Give a forked process a name of its own in `top`, `ps -o comm` and psutil's `name()`.

Engines and nannies forked from the engine zygote keep the zygote's command line (which `ps`
still shows); their short name is set here so a user can tell them apart.

Example:
    >>> name_process(b"nbdist-doctest")  # Linux: /proc/self/comm now reads nbdist-doctest
    >>> name_process(b"python")
"""

from __future__ import annotations

import contextlib


def name_process(name: bytes) -> None:
    """Name this process `name` (at most 15 bytes are kept, as Linux does)."""
    with contextlib.suppress(Exception):  # not glibc: the name stays as it was
        import ctypes

        ctypes.CDLL(None).prctl(15, ctypes.c_char_p(name[:15]), 0, 0, 0)  # PR_SET_NAME
