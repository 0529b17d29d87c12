"""The parts of `%dist scale` (issue 29) that need no engines: the size history's table, the
magic's arguments, the `@nd.on_scale` registry, re-batching the rest of an epoch, and the
argument checks of `cluster.scale` (tests/cluster/test_scale.py resizes real engines)."""

from __future__ import annotations

import pytest
import torch
from IPython.core.error import UsageError
from torch.utils.data import DataLoader, TensorDataset

import nbdist as nd
from nbdist.cluster.errors import ClusterStoppedError
from nbdist.cluster.scaling import _keep_mode
from nbdist.cluster.size_history import SizeChange
from nbdist.cluster.status import EngineStatus, StatusTable
from nbdist.errors import InvalidArgumentError
from nbdist.input.following import epoch_rng, rebatched_loader, restore_rng
from nbdist.magics._scale import _parse, scale_command
from nbdist.widgets._data import DashboardData
from nbdist.widgets.engines import engines_html


def test_status_prints_the_size_history_once_resized():
    row = EngineStatus(0, 0, "h", 1, "cpu:0", "alive")
    start = SizeChange(0.0, 0, 2, "start", 3.0)
    assert "size history" not in str(StatusTable([row], history=[start]))
    grown = StatusTable([row], history=[start, SizeChange(60.0, 2, 3, "scale 2 → 3", 2.5)])
    text = str(grown)
    assert "size history" in text and "2 → 3  scale 2 → 3 (2.5 s)" in text
    data = DashboardData(size_history=list(grown.history))
    assert "nd-history" in engines_html(data) and "scale 2 → 3" in engines_html(data)


def test_magic_arguments():
    assert _parse(["3"]) == (3, "global-batch", False)
    assert _parse(["2", "--keep", "replica-batch"]) == (2, "replica-batch", False)
    assert _parse(["--survivors"]) == (None, "global-batch", True)
    with pytest.raises(UsageError, match="needs the number of engines"):
        _parse([])
    with pytest.raises(UsageError, match="unexpected 'x'"):
        _parse(["3", "x"])
    with pytest.raises(UsageError, match="no cluster is running"):
        scale_command(None, ["3"])


def test_keep_modes_and_scale_arguments_are_checked_first():
    assert _keep_mode("Replica_Batch") == "replica-batch"
    with pytest.raises(InvalidArgumentError, match="keep must be one of"):
        _keep_mode("all")
    cluster = nd.Cluster(n=2)
    with pytest.raises(InvalidArgumentError, match="at least 1"):
        cluster.scale(True)
    with pytest.raises(InvalidArgumentError, match="survivors=True"):
        cluster.scale()
    with pytest.raises(ClusterStoppedError, match=r"cluster\.start\(\)"):
        cluster.scale(3)


def test_on_scale_registers_once_per_name():
    def hook(event):
        return event

    first = nd.on_scale(hook)
    nd.on_scale(hook)
    try:
        assert first is hook
        assert [f for f in nd.on_scale.registered() if f.__qualname__ == hook.__qualname__] == [
            hook
        ]
    finally:
        nd.on_scale.discard(hook)
    assert hook not in nd.on_scale.registered()


def test_rest_of_an_epoch_rebatched_in_the_same_order():
    data = TensorDataset(torch.arange(20))
    loader = DataLoader(
        data, batch_size=6, shuffle=True, generator=torch.Generator().manual_seed(3)
    )
    states = epoch_rng(loader)
    order = [int(v) for (batch,) in loader for v in batch]
    restore_rng(loader, states)
    bigger = rebatched_loader(loader, 9)
    bigger.batch_sampler.skip = 6  # one batch of 6 was given before
    rest = [[int(v) for v in batch] for (batch,) in bigger]
    assert [len(b) for b in rest] == [9, 5]
    assert [v for b in rest for v in b] == order[6:]
    assert rebatched_loader([torch.arange(3)], 9) is None
