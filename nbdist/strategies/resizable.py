"""`Resizable`: what `MultiWorkerMirroredStrategy` does when its cluster is resized.

`%dist scale` (nbdist.cluster.scaling) changes the number of engines of a live cluster. The
strategy object of a surviving engine stays the same object (the user's models, optimizers and
variables refer to it), and only its place changes: `resize_group` forms its process group
again at the new size and moves the strategy to its new rank, so `num_replicas_in_sync` and
every replica id follow. An engine that joins gets the state its strategy tracked on replica 0
(`resize_layout`, then `resize_adopt`): the parameters captured in `scope()` in the same
order and the same gradient buckets (their layout is compared across the workers), and the
count of optimizer steps that times the replica check.

A mixin of `MultiWorkerMirroredStrategy`: it reads the strategy's own fields.

Example (on every engine of a cluster being resized; see nbdist.cluster.engine_side.resize)::

    strategy.resize_group(rank=2, world_size=3, master_addr="127.0.0.1", master_port=29511)
    strategy.num_replicas_in_sync          # 3
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch

from nbdist.errors import ContextError

__all__ = ["Resizable"]


class Resizable:
    """The resize of a `MultiWorkerMirroredStrategy` (see the module docstring)."""

    _group: Any
    _buckets: Any
    _captured: list[torch.Tensor]
    _captured_ids: set[int]
    _names: dict[int, str]
    _steps: int
    _num_workers: int
    _worker_index: int
    _topology: Any
    _cluster_resolver: Any

    def resize_group(
        self,
        *,
        rank: int,
        world_size: int,
        master_addr: str,
        master_port: int,
        generation: str = "0",
        resolver: Any = None,
    ) -> None:
        """Form the process group again as `rank` of `world_size` at a fresh rendezvous
        (`master_addr:master_port`); every worker of the new group calls it at once (a
        joining engine creates its strategy at that rendezvous instead). The strategy's
        parameters, buckets and variables stay; `num_replicas_in_sync` is `world_size` after.

        Raises:
            ContextError: a one-worker strategy (it has no process group to resize).
            RendezvousError: a worker did not join in time.
        """
        if self._group is None:
            raise ContextError(
                "This MultiWorkerMirroredStrategy has one worker and no process group, so it "
                "cannot be resized. Start the cluster with 2 or more engines "
                "(`%dist start 2`) to resize it later."
            )
        self._group.resize(
            rank=rank, world_size=world_size, master_addr=master_addr,
            master_port=master_port, generation=generation,
        )  # fmt: skip
        self._num_workers, self._worker_index = world_size, rank
        self._topology = dataclasses.replace(
            self._topology, rank=rank, world_size=world_size, master_addr=master_addr,
            master_port=master_port,
        )  # fmt: skip
        if resolver is not None:
            self._cluster_resolver = resolver

    def tracks(self, tensors: list[torch.Tensor]) -> bool:
        """True when one of `tensors` was created in this strategy's scope (or adopted)."""
        return any(id(t) in self._captured_ids for t in tensors)

    def resize_layout(self) -> dict[str, Any]:
        """What a joining worker needs to track the same parameters as this one: the captured
        tensors in capture order, their names, the gradient buckets' groups (indices into the
        captured tensors, in the order they were added) and the optimizer steps counted.
        Pickle it with the objects that hold those tensors, so that they stay the same
        objects."""
        index = {id(t): i for i, t in enumerate(self._captured)}
        groups: dict[int, list[int]] = {}
        if self._buckets is not None:
            for bucket in self._buckets.buckets:
                groups.setdefault(bucket.group, []).extend(index[id(p)] for p in bucket.params)
        return {
            "captured": list(self._captured),
            "names": [self._names.get(id(t), "") for t in self._captured],
            "groups": [list(reversed(members)) for _, members in sorted(groups.items())],
            "steps": self._steps,
        }

    def resize_adopt(self, layout: dict[str, Any]) -> None:
        """Track the tensors of `layout` (from replica 0's `resize_layout`, unpickled here)
        as if they had been created in this strategy's scope: captured in the same order, in
        the same gradient buckets. Call it on a joining worker, before any backward."""
        captured = layout["captured"]
        for tensor, name in zip(captured, layout["names"]):
            if id(tensor) not in self._captured_ids:
                self._captured_ids.add(id(tensor))
                self._captured.append(tensor)
                self._names[id(tensor)] = name
        if self._buckets is not None:
            for members in layout["groups"]:
                self._buckets.add([captured[i] for i in members])
        self._steps = int(layout["steps"])

    def check_resized(self) -> None:
        """After a resize, on every worker at once: the gradient buckets' layout agrees
        (`CollectiveMismatchError` names a worker whose differs), and every mirrored
        parameter is identical across the workers (`ReplicasDivergedError` names them)."""
        if self._group is None:
            return
        layout = self._buckets.layout() if self._buckets is not None else []
        self._group.check("gradient layout after a resize", layout)
        self.check_replicas_identical("after the resize")  # type: ignore[attr-defined]
