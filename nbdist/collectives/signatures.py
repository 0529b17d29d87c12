"""The signature row of a checked collective (Note [Checked collectives] in `torch_dist`): a
fixed-size int64 row that says which collective a rank calls and with which shapes and dtypes,
so that one small all-gather lets every rank compare every rank's call and all raise the same
clear error. Imports only torch and nbdist.core.reduce.op.

Example:
    >>> import torch
    >>> row = signature("all_reduce:SUM", [torch.zeros(2, 3)])
    >>> describe(row)
    'all_reduce:SUM of 1 tensor(s) (2, 3) float32'
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

import torch

from nbdist.core.reduce.op import ReduceOp

__all__ = ["DIMS", "SIGNATURE_WIDTH", "describe", "rows_agree", "signature"]

SIGNATURE_WIDTH = 64
"""int64 words in a row: op code, tensor count, layout hash, then per tensor dtype, rank and
up to `DIMS` sizes (the first `_MAX_DESCRIBED` tensors)."""
DIMS = 8
"""Sizes written per tensor (the layout hash covers the rest)."""
_MAX_DESCRIBED = 5
_DTYPES = [
    torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int64, torch.int32,
    torch.int16, torch.int8, torch.uint8, torch.bool, torch.complex64, torch.complex128,
]  # fmt: skip


def rows_agree(rows: torch.Tensor) -> bool:
    """Whether every rank's row equals the first."""
    first = rows[0]
    return all(torch.equal(first, rows[r]) for r in range(1, rows.shape[0]))


def signature(what: str, tensors: Sequence[torch.Tensor]) -> torch.Tensor:
    """The row of collective `what` called with `tensors`."""
    row = torch.zeros(SIGNATURE_WIDTH, dtype=torch.int64)
    layout = repr([(tuple(t.shape), str(t.dtype)) for t in tensors])
    digest = hashlib.blake2b(f"{what}|{layout}".encode(), digest_size=7).digest()
    row[0] = _op_code(what)
    row[1] = len(tensors)
    row[2] = int.from_bytes(digest, "big")
    for k, tensor in enumerate(tensors[:_MAX_DESCRIBED]):
        base = 3 + k * (DIMS + 2)
        row[base] = _DTYPES.index(tensor.dtype) if tensor.dtype in _DTYPES else 99
        row[base + 1] = tensor.dim()
        for d, size in enumerate(tensor.shape[:DIMS]):
            row[base + 2 + d] = size
    return row


def describe(row: torch.Tensor) -> str:
    """A row in words, for the mismatch error."""
    count = int(row[1])
    parts = []
    for k in range(min(count, _MAX_DESCRIBED)):
        base = 3 + k * (DIMS + 2)
        code, ndim = int(row[base]), int(row[base + 1])
        dtype = str(_DTYPES[code]).replace("torch.", "") if code < len(_DTYPES) else "?"
        shape = tuple(int(x) for x in row[base + 2 : base + 2 + min(ndim, DIMS)])
        parts.append(f"{shape} {dtype}")
    more = f" and {count - _MAX_DESCRIBED} more" if count > _MAX_DESCRIBED else ""
    return f"{_OP_NAMES.get(int(row[0]), 'another collective')} of {count} tensor(s) " + (
        f"{', '.join(parts)}{more}"
    )


def _op_code(what: str) -> int:
    return int.from_bytes(hashlib.blake2b(what.encode(), digest_size=7).digest(), "big")


_OP_NAMES = {
    _op_code(name): name
    for name in [
        *(f"all_reduce:{op.value}" for op in ReduceOp),
        *(f"all_gather:{axis}" for axis in range(-4, 8)),
        "merge_call",
        "reduce",
        "gather",
        "gradient layout",
    ]
}
