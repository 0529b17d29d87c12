"""The digits data set bundled with nbdist, for the demo: `nbdist.app.datasets` is its public home
(`nd.datasets.load_digits()`); this module re-exports it for the demo's code.

Example:
    >>> load_digits(seed=0).x_train.shape
    torch.Size([1437, 64])
"""

from __future__ import annotations

from nbdist.app.datasets import Digits, load_digits, raw_digits

__all__ = ["Digits", "load_digits", "raw_digits"]
