"""Which source files are the user's, on an engine: the frames that tracebacks,
post-mortems and debugger steps keep.

A frame is the user's unless it is nbdist's own (the files `_wire.cut_from_tracebacks` names)
or torch's, IPython's or ipykernel's. Shared by the failure replies (`failures`) and the
debugger on replicas (`debugger`), which otherwise would import each other.

Example:
    >>> is_user_file("/home/me/train.py")
    True
    >>> import os
    >>> is_user_file(os.sep.join(["", "site-packages", "torch", "nn", "modules", "linear.py"]))
    False
"""

from __future__ import annotations

import os

from nbdist.cluster import _wire

_LIBRARY_FOLDERS = tuple(os.sep + name + os.sep for name in ("torch", "IPython", "ipykernel"))


def is_user_file(filename: str) -> bool:
    """True when `filename` is neither nbdist's own nor torch's, IPython's or ipykernel's."""
    return not _wire.cut_from_tracebacks(filename) and not any(
        part in filename for part in _LIBRARY_FOLDERS
    )
