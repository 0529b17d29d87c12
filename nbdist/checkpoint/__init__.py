"""Checkpoints: save a run (model, optimizer, variables, iterator position) and resume it,
on the same or another number of replicas.

`nd.checkpoint.save(path, **objects)` writes one file, once (by the worker whose
`strategy.extended.should_checkpoint` is True) and atomically; `nd.checkpoint.restore(path,
**objects)` puts the states back in place; `nd.checkpoint.read(path)` returns them.
`nd.checkpoint.CheckpointManager(directory, max_to_keep=5, **objects)` keeps numbered
checkpoints (`ckpt-1`, `ckpt-2`, ...) as TensorFlow's does, and
`nd.checkpoint.latest_checkpoint(directory)` finds the newest. Works with
in-process strategies, in scripts under torchrun (`MultiWorkerMirroredStrategy`) and in
`%%distribute` cells. Modules: `fileformat` (the file), `objects` (what each kind of object
saves), `workers` (who writes, how every worker learns the outcome), `save_restore`, `state_file`
(the manager's `checkpoint` file) and `manager`.

Example:
    >>> import os, tempfile, torch, nbdist as nd
    >>> model = torch.nn.Linear(2, 1)
    >>> path = nd.checkpoint.save(os.path.join(tempfile.mkdtemp(), "ckpt.pt"), model=model)
    >>> with torch.no_grad():
    ...     _ = model.weight.zero_()
    >>> nd.checkpoint.restore(path, model=model)
    >>> bool(model.weight.abs().sum() > 0)
    True
"""

from __future__ import annotations

from nbdist.checkpoint.manager import CheckpointManager, latest_checkpoint
from nbdist.checkpoint.save_restore import read, restore, save
from nbdist.errors import CheckpointError, CheckpointMismatchError, CheckpointTypeError

__all__ = [
    "CheckpointError",
    "CheckpointManager",
    "CheckpointMismatchError",
    "CheckpointTypeError",
    "latest_checkpoint",
    "read",
    "restore",
    "save",
]
