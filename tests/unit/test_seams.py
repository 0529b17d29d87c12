"""The public seams through which one part of nbdist reads another (issue 25 item 5): what each
returns, checked against the state it exposes, so that no caller needs a private member."""

from __future__ import annotations

import torch

import nbdist as nd
from nbdist.core.values import select_replica
from nbdist.input import distribute_dataset
from nbdist.strategies.base import module_registration_hooks


def test_distributed_iterator_position_counts_what_it_delivered():
    it = iter(distribute_dataset([torch.arange(4)] * 3, devices=("cpu:0",), num_replicas_in_sync=1))
    assert it.position is not None
    assert (it.position.batches, it.position.examples) == (0, 0)
    it.get_next()
    assert (it.position.batches, it.position.examples) == (1, 4)
    assert it.state_dict()["batches"] == it.position.batches


def test_extended_replicas_and_placement_describe_the_strategy():
    mirrored = nd.MirroredStrategy(["cpu:0", "cpu:1"])
    with mirrored.scope():
        layer = torch.nn.Linear(2, 1)
    replicas = mirrored.extended.replicas
    assert replicas is not None and any(t is layer.weight for t in replicas.originals)
    assert len(replicas.components) == len(replicas.originals)
    assert mirrored.extended.placement.local_replica_ids == (0, 1)
    assert nd.MultiWorkerMirroredStrategy().extended.replicas is None  # one replica a process


def test_extended_create_variable_is_what_a_variable_in_scope_becomes():
    strategy = nd.MirroredStrategy(["cpu:0", "cpu:1"])
    made = strategy.extended.create_variable(2.0, name="w")
    assert isinstance(made, nd.MirroredVariable) and made.name == "w"
    assert made.distribute_strategy is strategy
    with strategy.scope():
        v = nd.Variable(1.0)
    assert type(v) is type(made) and v.distribute_strategy is strategy


def test_read_value_no_copy_is_the_variables_own_tensor():
    v = nd.Variable([1.0, 2.0])
    tensor = v.read_value_no_copy()
    v.assign_add([1.0, 1.0])
    assert tensor.tolist() == [2.0, 3.0], "a copy: the write did not show in it"
    assert v.read_value().data_ptr() != tensor.data_ptr(), "read_value must stay a copy"


def test_a_distributed_variable_stays_whole_unless_unwrapping_is_asked():
    strategy = nd.MirroredStrategy(["cpu:0", "cpu:1"])
    with strategy.scope():
        v = nd.Variable(1.0)
    assert select_replica(1, v) is v
    assert select_replica(1, v, unwrap_variables=True) is v.values[1]
    mirrored = nd.core.values.Mirrored([torch.tensor(1.0), torch.tensor(1.0)])
    assert select_replica(1, mirrored) is mirrored.values[1]


def test_module_registration_hooks_see_parameters_buffers_and_submodules_only_inside():
    seen: list[str] = []

    def note(module, name, value):
        seen.append(name)

    with module_registration_hooks(note, buffers=True, submodules=True):
        torch.nn.Sequential(torch.nn.BatchNorm1d(2))
    assert {"weight", "bias", "running_mean", "0"} <= set(seen)
    seen.clear()
    with module_registration_hooks(note, buffers=False, submodules=False):
        torch.nn.BatchNorm1d(2)
    assert seen == ["weight", "bias"]
    seen.clear()
    torch.nn.Linear(2, 1)
    assert seen == [], "the hooks were not removed on exit"


def test_a_nested_scope_does_not_capture_twice():
    strategy = nd.MirroredStrategy(["cpu:0", "cpu:1"])
    with strategy.scope(), strategy.scope():
        torch.nn.Linear(2, 1)
    assert len(strategy.extended.replicas.originals) == 2  # weight and bias, once each
