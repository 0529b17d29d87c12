"""strategy.extended.colocate_vars_with: variables made next to another variable (API.md §5)."""

from __future__ import annotations

import pytest
import torch

import nbdist as nd
from tests.unit.variables.helpers import components, mirrored


def test_colocate_vars_with_mirrored():
    strategy = mirrored()
    with strategy.scope():
        first = nd.Variable(1.0)
        with strategy.extended.colocate_vars_with(first):
            second = nd.Variable(2.0)
            third = nd.Variable(3.0, synchronization="ON_READ", aggregation="SUM")
    assert second.devices == first.devices == ("cpu:0", "cpu:1")
    assert third.devices == first.devices
    assert components(second) == [2.0, 2.0]


def test_colocate_vars_with_central_storage_uses_the_variable_devices():
    strategy = nd.CentralStorageStrategy(["cpu:0", "cpu:1"], parameter_device="cpu:1")
    with strategy.scope():
        central = nd.Variable(1.0)
        per_device = nd.Variable(0.0, synchronization="ON_READ", aggregation="SUM")
        with strategy.extended.colocate_vars_with(per_device):
            spread = nd.Variable(2.0)
        with strategy.extended.colocate_vars_with(central):
            gathered = nd.Variable(3.0, synchronization="ON_READ", aggregation="SUM")
        after = nd.Variable(4.0)
    assert spread.devices == ("cpu:0", "cpu:1")
    assert components(spread) == [2.0, 2.0]
    assert gathered.devices == ("cpu:1",)
    assert after.devices == ("cpu:1",)  # colocation ends with the block


def test_colocate_vars_with_a_tensor_raises():
    strategy = mirrored()
    with strategy.scope():
        with pytest.raises(ValueError, match=r"colocate_vars_with needs a variable created in"):
            with strategy.extended.colocate_vars_with(torch.tensor(1.0)):
                pass
