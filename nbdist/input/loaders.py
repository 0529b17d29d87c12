"""`loader_settings`: what a `DataLoader` is built with, to build another over the same data.

nbdist rebuilds a user's `DataLoader` with its own batch sampler in two places: sharding it
over workers (`sharding`) and re-batching it after a resize (`following`). Both keep every
other setting of the user's loader (workers, collate function, pinning, generator, ...).

Example:
    >>> from torch.utils.data import DataLoader
    >>> settings = loader_settings(DataLoader(range(8), batch_size=2, num_workers=0))
    >>> settings["num_workers"], settings["prefetch_factor"]
    (0, None)
"""

from __future__ import annotations

from typing import Any

from torch.utils.data import DataLoader

__all__ = ["loader_settings"]


def loader_settings(loader: DataLoader) -> dict[str, Any]:
    """The keyword arguments of `loader`'s settings, other than its dataset and its batching
    (`batch_size`, `shuffle`, `sampler`, `batch_sampler`, `drop_last`), for
    `DataLoader(dataset, batch_sampler=..., **loader_settings(loader))`."""
    return {
        "num_workers": loader.num_workers,
        "collate_fn": loader.collate_fn,
        "pin_memory": loader.pin_memory,
        "timeout": loader.timeout,
        "worker_init_fn": loader.worker_init_fn,
        "multiprocessing_context": loader.multiprocessing_context,
        "generator": loader.generator,
        "prefetch_factor": loader.prefetch_factor if loader.num_workers > 0 else None,
        "persistent_workers": loader.persistent_workers,
    }
