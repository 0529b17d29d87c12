"""Partitioners: how many shards a variable created in `ParameterServerStrategy.scope()` gets.

A partitioner is a callable `(shape, dtype) -> [k, 1, ..., 1]`: `k` shards along the first
dimension (TF's `tf.distribute.experimental.partitioners`, same rules and defaults). The
strategy then splits the rows (`placement.shard_rows`).

Example:
    >>> import torch
    >>> FixedShardsPartitioner(4)(torch.Size([10, 3]), torch.float32)
    [4, 1]
    >>> MinSizePartitioner(min_shard_bytes=64, max_shards=8)(torch.Size([10, 4]), torch.float32)
    [3, 1]
    >>> MaxSizePartitioner(max_shard_bytes=48)(torch.Size([10, 4]), torch.float32)
    [4, 1]
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import torch

from nbdist.errors import InvalidArgumentError

__all__ = ["FixedShardsPartitioner", "MaxSizePartitioner", "MinSizePartitioner", "Partitioner"]


def _at_least_one(name: str, value: Any, cls: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidArgumentError(
            f"{cls}: `{name}` must be a positive integer, got {value!r}; pass e.g. {name}=2."
        )
    if value < 1:
        raise InvalidArgumentError(
            f"{cls}: `{name}` must be at least 1, got {value!r}; pass e.g. {name}=2."
        )
    return value


def _shape(shape: Any) -> torch.Size:
    return shape if isinstance(shape, torch.Size) else torch.Size(tuple(int(d) for d in shape))


def _element_bytes(dtype: Any, bytes_per_string: int) -> int:
    if isinstance(dtype, torch.dtype):
        return dtype.itemsize
    return bytes_per_string  # strings (object arrays) count as TF counts them


def _result(k: int, shape: torch.Size) -> list[int]:
    return [k] + [1] * (len(shape) - 1) if len(shape) else []


class Partitioner:
    """Base class: `partitioner(shape, dtype)` → `[k, 1, ..., 1]` (k shards along axis 0)."""

    def __call__(self, shape: Sequence[int], dtype: Any) -> list[int]:
        raise NotImplementedError


class FixedShardsPartitioner(Partitioner):
    """`num_shards` shards (fewer when the variable has fewer rows).

    Example:
        >>> FixedShardsPartitioner(4)([2, 5], torch.float32)
        [2, 1]
    """

    def __init__(self, num_shards: int):
        self._num_shards = _at_least_one("num_shards", num_shards, "FixedShardsPartitioner")

    def __call__(self, shape: Sequence[int], dtype: Any) -> list[int]:
        shape = _shape(shape)
        if not len(shape):
            return []
        return _result(max(1, min(self._num_shards, shape[0])), shape)

    def __repr__(self) -> str:
        return f"FixedShardsPartitioner(num_shards={self._num_shards})"


class MinSizePartitioner(Partitioner):
    """As many shards as keep each at least `min_shard_bytes`, at most `max_shards`.

    `k = max(1, min(shape[0], max_shards, ceil(total_bytes / min_shard_bytes)))`.

    Example:
        >>> MinSizePartitioner(min_shard_bytes=4, max_shards=2)([6, 1], torch.float32)
        [2, 1]
    """

    def __init__(
        self, min_shard_bytes: int = 256 << 10, max_shards: int = 1, bytes_per_string: int = 16
    ):
        name = "MinSizePartitioner"
        self._min_shard_bytes = _at_least_one("min_shard_bytes", min_shard_bytes, name)
        self._max_shards = _at_least_one("max_shards", max_shards, name)
        self._bytes_per_string = _at_least_one("bytes_per_string", bytes_per_string, name)

    def __call__(self, shape: Sequence[int], dtype: Any) -> list[int]:
        shape = _shape(shape)
        if not len(shape):
            return []
        total = shape.numel() * _element_bytes(dtype, self._bytes_per_string)
        wanted = math.ceil(total / self._min_shard_bytes)
        return _result(max(1, min(shape[0], self._max_shards, wanted)), shape)

    def __repr__(self) -> str:
        return (
            f"MinSizePartitioner(min_shard_bytes={self._min_shard_bytes}, "
            f"max_shards={self._max_shards}, bytes_per_string={self._bytes_per_string})"
        )


class MaxSizePartitioner(Partitioner):
    """As few shards as keep each at most `max_shard_bytes` (at least one row each).

    Rows per shard `max(1, floor(max_shard_bytes / bytes_per_row))`, `k = ceil(shape[0] /
    rows_per_shard)`, capped at `max_shards`.

    Example:
        >>> MaxSizePartitioner(max_shard_bytes=8, max_shards=3)([10, 1], torch.float32)
        [3, 1]
    """

    def __init__(
        self, max_shard_bytes: int, max_shards: int | None = None, bytes_per_string: int = 16
    ):
        name = "MaxSizePartitioner"
        self._max_shard_bytes = _at_least_one("max_shard_bytes", max_shard_bytes, name)
        self._max_shards = (
            None if max_shards is None else _at_least_one("max_shards", max_shards, name)
        )
        self._bytes_per_string = _at_least_one("bytes_per_string", bytes_per_string, name)

    def __call__(self, shape: Sequence[int], dtype: Any) -> list[int]:
        shape = _shape(shape)
        if not len(shape):
            return []
        if shape[0] == 0:
            return _result(1, shape)
        bytes_per_row = (shape.numel() / shape[0]) * _element_bytes(dtype, self._bytes_per_string)
        rows_per_shard = max(1, math.floor(self._max_shard_bytes / bytes_per_row))
        k = math.ceil(shape[0] / rows_per_shard)
        if self._max_shards is not None:
            k = min(self._max_shards, k)
        return _result(k, shape)

    def __repr__(self) -> str:
        return (
            f"MaxSizePartitioner(max_shard_bytes={self._max_shard_bytes}, "
            f"max_shards={self._max_shards}, bytes_per_string={self._bytes_per_string})"
        )
