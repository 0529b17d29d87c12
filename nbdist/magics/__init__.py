"""Jupyter magics (front-end layer of ARCHITECTURE.md): `%dist` and `%%distribute`.

`%load_ext nbdist` registers them. `%dist start -n 2` starts a `nbdist.cluster.Cluster`;
`%%distribute` runs a cell on all its engines at once and returns the last expression's values
as a `PerReplica`. Importing this package imports IPython, starts nothing.
"""

from nbdist.magics.core import DistMagics, current_cluster, load, unload

__all__ = ["DistMagics", "current_cluster", "load", "unload"]
