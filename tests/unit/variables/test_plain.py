"""nd.Variable outside any strategy scope and under OneDeviceStrategy or the default strategy: a
plain variable (API.md §5).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

import nbdist as nd
from tests.unit.variables.helpers import AGG, SYNC


def test_plain_variable_attributes():
    v = nd.Variable([1.0, 2.0], name="w")
    assert type(v) is nd.Variable
    assert not isinstance(v, nd.DistributedValues)
    assert v.device == "cpu:0"
    assert v.dtype == torch.float32
    assert v.shape == torch.Size([2])
    assert v.name == "w"
    assert v.trainable is True
    assert v.synchronization is SYNC.AUTO
    assert v.aggregation is AGG.NONE
    assert torch.equal(v.value(), torch.tensor([1.0, 2.0]))
    assert torch.equal(v.read_value(), torch.tensor([1.0, 2.0]))
    array = v.numpy()
    assert isinstance(array, np.ndarray)
    np.testing.assert_array_equal(array, np.array([1.0, 2.0], dtype=np.float32))


def test_plain_variable_default_name_and_dtypes():
    assert nd.Variable(1.0).name == "Variable"
    assert nd.Variable(1.5).dtype == torch.float32  # Python floats take torch's default dtype
    assert nd.Variable(3, dtype=torch.int64).dtype == torch.int64
    assert nd.Variable(torch.zeros(2, 3, dtype=torch.float64)).dtype == torch.float64
    assert nd.Variable(torch.zeros(2, 3)).shape == torch.Size([2, 3])
    assert torch.equal(nd.Variable(lambda: torch.ones(2)).value(), torch.ones(2))


def test_plain_variable_copies_its_initial_value():
    source = torch.tensor([1.0, 2.0])
    v = nd.Variable(source)
    source.add_(10.0)
    assert torch.equal(v.value(), torch.tensor([1.0, 2.0]))


def test_read_value_is_a_snapshot():
    v = nd.Variable([1.0, 2.0])
    snapshot = v.read_value()
    snapshot.add_(100.0)
    assert torch.equal(v.value(), torch.tensor([1.0, 2.0]))
    v.assign([5.0, 6.0])
    assert torch.equal(snapshot, torch.tensor([101.0, 102.0]))


def test_assign_methods_return_the_variable_and_write():
    v = nd.Variable([1.0, 2.0])
    assert v.assign([3.0, 4.0]) is v
    assert torch.equal(v.value(), torch.tensor([3.0, 4.0]))
    assert v.assign_add(torch.tensor([1.0, 1.0])) is v
    assert torch.equal(v.value(), torch.tensor([4.0, 5.0]))
    assert v.assign_sub(0.5) is v
    assert torch.equal(v.value(), torch.tensor([3.5, 4.5]))


def test_assign_keeps_the_variable_dtype():
    v = nd.Variable([1, 2], dtype=torch.int64)
    v.assign_add(torch.tensor([1, 1], dtype=torch.int32))
    assert v.dtype == torch.int64
    assert torch.equal(v.value(), torch.tensor([2, 3]))


def test_variable_works_in_torch_operations():
    v = nd.Variable([1.0, 2.0])
    left = v + 1
    assert type(left) is torch.Tensor
    assert torch.equal(left, torch.tensor([2.0, 3.0]))
    right = torch.tensor(1.0) + v
    assert type(right) is torch.Tensor
    assert torch.equal(right, torch.tensor([2.0, 3.0]))
    assert torch.equal(torch.matmul(v, torch.tensor([3.0, 4.0])), torch.tensor(11.0))
    assert torch.equal(v @ torch.tensor([3.0, 4.0]), torch.tensor(11.0))
    assert torch.equal(torch.tensor([3.0, 4.0]) @ v, torch.tensor(11.0))
    assert torch.equal(torch.add(v, v), torch.tensor([2.0, 4.0]))
    assert torch.equal(v * v, torch.tensor([1.0, 4.0]))
    assert torch.equal(2 - v, torch.tensor([1.0, 0.0]))
    assert torch.equal(-v, torch.tensor([-1.0, -2.0]))
    assert torch.equal(v[1], torch.tensor(2.0))
    assert torch.equal(torch.nn.functional.relu(v - 1.5), torch.tensor([0.0, 0.5]))
    assert torch.equal(v > 1.5, torch.tensor([False, True]))
    assert float(nd.Variable(2.5)) == 2.5


def test_unknown_synchronization_name():
    with pytest.raises(ValueError, match=r"Unknown synchronization 'bogus'.*ON_READ"):
        nd.Variable(1.0, synchronization="bogus")


def test_unknown_aggregation_name():
    with pytest.raises(ValueError, match=r"Unknown aggregation 'median'.*ONLY_FIRST_REPLICA"):
        nd.Variable(1.0, aggregation="median")


def test_enum_names_are_accepted():
    v = nd.Variable(1.0, synchronization="on_read", aggregation="sum")
    assert v.synchronization is SYNC.ON_READ
    assert v.aggregation is AGG.SUM
    assert v.trainable is False


def test_one_device_scope_gives_a_plain_variable():
    strategy = nd.OneDeviceStrategy("cpu")
    with strategy.scope():
        v = nd.Variable([1.0, 2.0], aggregation=AGG.SUM)
    assert type(v) is nd.Variable
    assert v.device == "cpu:0"
    assert v.aggregation is AGG.SUM
    assert v.synchronization is SYNC.AUTO
    out = strategy.run(lambda: v.assign_add([1.0, 1.0]) + 0)
    assert torch.equal(out, torch.tensor([2.0, 3.0]))


def test_default_strategy_scope_gives_a_plain_variable():
    with nd.get_strategy().scope():
        v = nd.Variable(1.0)
    assert type(v) is nd.Variable
