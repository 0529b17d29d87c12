"""Are the replicas' copies of the mirrored parameters still the same? (the replica check)

Note [Replica check]: gradient averaging keeps the parameters created in `strategy.scope()`
bit-identical on every replica (each replica receives the same all-reduced bits and applies the
same optimizer step). Anything that changes a parameter on some replicas only breaks that, and
nothing else would notice: an in-place edit under `torch.no_grad()` on one worker,
`load_state_dict` on one worker, gradients written into `.grad` by hand or made with
`torch.autograd.grad` (never averaged), a `%%distribute --targets` cell that trained some
replicas. The check compares a fingerprint of those parameters across the replicas: two
numbers, the sum of the elements and their Euclidean norm, per gradient bucket (one pass over
the parameters, one small all-reduce; the parameters of a bucket that differs are then compared
one by one, to name them), or per parameter in the notebook, from the engines' replies, at the
end of a `%%distribute` cell. The reductions run in the parameters' own precision (a float64
sum of float32 values costs ~10x more). Two copies whose fingerprints agree to `RTOL` of the
scale (the norm; for the sum, the norm times the square root of the element count, which
bounds it) are taken as equal: the same values reduced on different hardware or thread counts
differ by float32 rounding, ~1e-6 of that scale at most, while one step on un-averaged
gradients moves them by ~1e-3 (the ported DDP tutorial: up to 0.031).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

__all__ = ["RTOL", "differing", "diverged_message", "fingerprint"]

RTOL = 1e-5


def fingerprint(params: Sequence[torch.Tensor]) -> torch.Tensor:
    """`(len(params), 2)` float64 on the CPU: each parameter's element sum and norm.

    Example:
        >>> fingerprint([torch.tensor([3.0, -4.0])]).tolist()
        [[-1.0, 5.0]]
    """
    if not params:
        return torch.zeros(0, 2, dtype=torch.float64)
    with torch.no_grad():
        rows = [
            torch.stack([p.detach().sum(), torch.linalg.vector_norm(p.detach())]).double()
            for p in params  # each in its own precision (they may differ)
        ]
        return torch.stack(rows).cpu()


def differing(high: torch.Tensor, low: torch.Tensor, numels: Sequence[int]) -> list[int]:
    """Indices of the parameters whose fingerprints' largest (`high`) and smallest (`low`)
    values over the replicas differ by more than rounding.

    Example:
        >>> a = fingerprint([torch.ones(4), torch.ones(2)])
        >>> b = fingerprint([torch.ones(4), torch.tensor([1.0, 1.01])])
        >>> differing(torch.maximum(a, b), torch.minimum(a, b), [4, 2])
        [1]
    """
    out = []
    for i, numel in enumerate(numels):
        norm = float(high[i, 1])
        scales = (norm * math.sqrt(max(numel, 1)), norm)
        for column, scale in enumerate(scales):
            if float(high[i, column] - low[i, column]) > RTOL * scale:
                out.append(i)
                break
    return out


def diverged_message(
    names: Sequence[str], indices: Sequence[int], when: str, detail: str, total: int | None = None
) -> str:
    """The `ReplicasDivergedError` message: what differs (`indices` into `names`, out of
    `total` mirrored parameters, default `len(names)`), when it was seen, causes and fix."""
    shown = ", ".join(names[i] for i in indices[:4])
    more = f" and {len(indices) - 4} more" if len(indices) > 4 else ""
    total = len(names) if total is None else total
    return (
        f"The replicas' copies of {len(indices)} of {total} parameter(s) created in "
        f"strategy.scope() are no longer identical ({shown}{more}), seen {when}{detail}. "
        "Every replica must apply the same update. Usual causes: a parameter changed on some "
        "replicas only (under torch.no_grad(), load_state_dict on one worker, a %%distribute "
        "--targets cell that trained some replicas), or gradients made with "
        "torch.autograd.grad or written to .grad by hand (only loss.backward() averages them). "
        "Fix the cause, then bring the replicas back to replica 0's values: "
        "`strategy.realign_replicas()` on every replica (in a %%distribute cell; it covers "
        "every model made in the scope, also one you created again), or restore a checkpoint "
        "on every replica."
    )
