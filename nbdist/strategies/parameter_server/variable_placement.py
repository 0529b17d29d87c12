"""Where each variable (or shard) of a `ParameterServerStrategy` lives.

Round-robin over the ps tasks: the n-th variable or shard created goes to ps `n % num_ps`.
A partitioner's answer `[k, 1, ...]` splits `shape[0]` rows into `min(k, shape[0])` shards,
the first `shape[0] % n` one row longer (TF's rule), named `NAME/part_i`.

Example:
    >>> shard_rows(10, 4)
    [3, 3, 2, 2]
    >>> check_partition([2, 1], torch.Size([5, 3]), "emb")
    2
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch

from nbdist.errors import InvalidArgumentError

__all__ = ["Shard", "check_partition", "shard_rows"]


@dataclasses.dataclass(frozen=True)
class Shard:
    """One shard of a variable: its name, ps task, first row and shape."""

    name: str
    ps: int
    offset: int
    shape: tuple[int, ...]

    @property
    def device(self) -> str:
        """TF's device string of the ps task holding it."""
        return f"/job:ps/replica:0/task:{self.ps}/device:CPU:0"


def shard_rows(rows: int, num_shards: int) -> list[int]:
    """Row counts of `min(num_shards, rows)` shards of `rows` rows (the first ones longer)."""
    n = max(1, min(num_shards, rows))
    base, extra = divmod(rows, n)
    return [base + (1 if i < extra else 0) for i in range(n)]


def check_partition(answer: Any, shape: torch.Size, name: str) -> int:
    """The shard count `k` from a partitioner's `answer`; `ValueError` unless `[k, 1, ...]`."""
    fix = (
        f"A partitioner must return a list [k, 1, ..., 1] with one entry per dimension of the "
        f"variable (here {len(shape)}), k >= 1 shards along the first dimension"
    )
    if not len(shape):
        return 1
    try:
        items = [int(x) for x in answer]
        ok = all(int(x) == x and not isinstance(x, bool) for x in answer)
    except (TypeError, ValueError):
        raise InvalidArgumentError(
            f"The variable partitioner returned {answer!r} for {name!r} of shape "
            f"{list(shape)}. {fix}."
        ) from None
    if not ok or len(items) != len(shape) or items[0] < 1 or any(x != 1 for x in items[1:]):
        raise InvalidArgumentError(
            f"The variable partitioner returned {answer!r} for {name!r} of shape "
            f"{list(shape)}. {fix}, e.g. {[2] + [1] * (len(shape) - 1)}."
        )
    return items[0]
