"""Which ranks of an NCCL group would share one GPU, found before the group is formed.

NCCL refuses a communicator in which two ranks use the same GPU ("Duplicate GPU detected"),
and says so only after every rank has joined, in NCCL's words. Each rank therefore publishes
its GPU's identity (host and CUDA UUID) when it arrives at the rendezvous; every rank reads all
of them, so every rank finds the same sharing and raises the same error, naming the fix.

Example:
    >>> ranks_sharing_a_gpu(["h|GPU-a", "h|GPU-b", "h|GPU-a"])
    [[0, 2]]
    >>> ranks_sharing_a_gpu(["h1|GPU-a", "h2|GPU-a"])  # same model of GPU on two hosts
    []
"""

from __future__ import annotations

import socket
from collections.abc import Sequence

import torch

from nbdist.errors import InvalidArgumentError

UNKNOWN = "1"
"""The identity of a rank whose GPU cannot be named (a CPU group, or no CUDA UUID)."""


def gpu_identity(device: torch.device) -> str:
    """`host|uuid` of the CUDA `device` this rank computes on; `UNKNOWN` for other devices."""
    if device.type != "cuda":
        return UNKNOWN
    index = device.index if device.index is not None else torch.cuda.current_device()
    uuid = getattr(torch.cuda.get_device_properties(index), "uuid", None)
    return f"{socket.gethostname()}|{uuid}" if uuid is not None else UNKNOWN


def ranks_sharing_a_gpu(identities: Sequence[str]) -> list[list[int]]:
    """Groups of two or more ranks (in rank order) whose identities name the same GPU."""
    by_gpu: dict[str, list[int]] = {}
    for rank, identity in enumerate(identities):
        if identity != UNKNOWN:
            by_gpu.setdefault(identity, []).append(rank)
    return [ranks for ranks in by_gpu.values() if len(ranks) > 1]


def check_one_gpu_each(identities: Sequence[str], rank: int) -> None:
    """Raise `InvalidArgumentError` if ranks of an NCCL group would share a GPU.

    >>> check_one_gpu_each(["h|GPU-a", "h|GPU-a"], rank=1)  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    nbdist.errors.InvalidArgumentError: Ranks [0, 1] run on one GPU (h|GPU-a), ...
    """
    shared = ranks_sharing_a_gpu(identities)
    if not shared:
        return
    where = "; ".join(f"ranks {ranks} run on one GPU ({identities[ranks[0]]})" for ranks in shared)
    raise InvalidArgumentError(
        f"{where[0].upper()}{where[1:]}, but NCCL needs a GPU of its own for each worker "
        f"(this is rank {rank}). Start at most one worker per GPU (torchrun "
        "--nproc-per-node=<GPUs per machine>), or let workers share a GPU over gloo: "
        "CommunicationOptions(implementation=CommunicationImplementation.RING)."
    )
