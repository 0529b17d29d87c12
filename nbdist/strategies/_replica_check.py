"""Are the replicas' copies of the mirrored parameters still the same? (the replica check)

Note [Replica check]: gradient averaging keeps the parameters created in `strategy.scope()`
bit-identical on every replica (each replica receives the same all-reduced bits and applies the
same optimizer step). Anything that changes a parameter on some replicas only breaks that, and
nothing else would notice: an in-place edit under `torch.no_grad()` on one worker,
`load_state_dict` on one worker, gradients written into `.grad` by hand or made with
`torch.autograd.grad` (never averaged), a `%%distribute --targets` cell that trained some
replicas. The check compares a fingerprint of those parameters across the replicas: two
float64 numbers per parameter, the sum of its elements and their Euclidean norm, computed in
one pass over the parameters and compared in one small collective (or in the notebook, from the
engines' replies, at the end of a `%%distribute` cell). Two copies whose fingerprints agree to
`RTOL` of the parameter's scale are taken as equal: float64 sums of the same float32 values agree
to ~1e-16 even when computed on different hardware, while a difference in one training step
moves them by far more (a step on un-averaged gradients: ~1e-3).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

__all__ = ["RTOL", "differing", "diverged_message", "fingerprint"]

RTOL = 1e-7


def fingerprint(params: Sequence[torch.Tensor]) -> torch.Tensor:
    """`(len(params), 2)` float64 on the CPU: each parameter's element sum and norm.

    Example:
        >>> fingerprint([torch.tensor([3.0, -4.0])]).tolist()
        [[-1.0, 5.0]]
    """
    if not params:
        return torch.zeros(0, 2, dtype=torch.float64)
    with torch.no_grad():
        sums = torch.stack([p.detach().sum(dtype=torch.float64) for p in params])
        norms = torch.stack(
            [torch.linalg.vector_norm(p.detach(), dtype=torch.float64) for p in params]
        )
        return torch.stack([sums, norms], dim=1).cpu()


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


def diverged_message(names: Sequence[str], indices: Sequence[int], when: str, detail: str) -> str:
    """The `ReplicasDivergedError` message: what differs, when it was seen, causes and fix."""
    shown = ", ".join(names[i] for i in indices[:4])
    more = f" and {len(indices) - 4} more" if len(indices) > 4 else ""
    return (
        f"The replicas' copies of {len(indices)} of {len(names)} parameter(s) created in "
        f"strategy.scope() are no longer identical ({shown}{more}), seen {when}{detail}. "
        "Every replica must apply the same update. Usual causes: a parameter changed on some "
        "replicas only (under torch.no_grad(), load_state_dict on one worker, a %%distribute "
        "--targets cell that trained some replicas), or gradients made with "
        "torch.autograd.grad or written to .grad by hand (only loss.backward() averages them). "
        "Fix the cause, then bring the replicas back to replica 0's values on every replica: "
        "`with torch.no_grad(): [p.copy_(strategy.extended.broadcast_from_first(p)) for p in "
        "model.parameters()]` (or restore a checkpoint on every replica)."
    )
