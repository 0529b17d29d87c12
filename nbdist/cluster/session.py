"""The notebook's cluster: the one `%dist start` started, for whoever shows it (`nd.dashboard()`).

The magics keep the cluster they start on their own object, one per IPython shell. They
register that object here (`holders`), and `notebook_cluster()` answers from it, so a reader
such as the dashboard finds the running cluster by importing this module, never the magics
(the magics import the dashboard to open it: that way round, the imports point one way).

Example:
    >>> notebook_cluster() is None  # no `%dist start` in this process
    True
"""

from __future__ import annotations

import weakref
from typing import Any, Protocol

__all__ = ["ClusterHolder", "holders", "notebook_cluster"]


class ClusterHolder(Protocol):
    """An object that may hold the notebook's running cluster (`DistMagics` does)."""

    cluster: Any


holders: weakref.WeakSet[Any] = weakref.WeakSet()
"""The live holders (the magics of each shell that loaded `%load_ext nbdist`)."""


def notebook_cluster() -> Any:
    """The cluster started with `%dist start` (None when none is running)."""
    for holder in list(holders):
        if holder.cluster is not None:
            return holder.cluster
    return None
