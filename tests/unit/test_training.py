"""Modules created in `scope()`: data-parallel training equals one-device training (API.md §5).

The test that matters most: an MLP trained 20 steps on scikit-learn's digits with global batch
64 on two logical CPU replicas ends where the same MLP trained on one device ends, and the
replicas' parameters are bit-identical after every step.
"""

import pytest
import torch
from sklearn.datasets import load_digits

import nbdist as nd
from nbdist.strategies._replicas import iterate_components

TWO = ["cpu:0", "cpu:1"]
STEPS, BATCH = 20, 64


@pytest.fixture(scope="module")
def batches():
    features, labels = load_digits(return_X_y=True)
    x = torch.tensor(features, dtype=torch.float32) / 16
    y = torch.tensor(labels)
    return [(x[i * BATCH : (i + 1) * BATCH], y[i * BATCH : (i + 1) * BATCH]) for i in range(STEPS)]


def make_model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(64, 32), torch.nn.ReLU(), torch.nn.Linear(32, 10))


def make_optimizer(params, kind):
    if kind == "adam":
        return torch.optim.Adam(params, lr=0.01)
    return torch.optim.SGD(params, lr=0.1, momentum=0.9)


def train_single(batches, kind):
    model = make_model()
    optimizer = make_optimizer(model.parameters(), kind)
    for x, y in batches:
        optimizer.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        optimizer.step()
    return model


def assert_replicas_identical(strategy):
    for components in iterate_components(strategy._replicas):
        for other in components[1:]:
            assert torch.equal(components[0], other)


@pytest.mark.parametrize("kind", ["sgd", "adam"])
@pytest.mark.parametrize(
    "make_strategy",
    [lambda: nd.MirroredStrategy(TWO), lambda: nd.CentralStorageStrategy(TWO)],
    ids=["mirrored", "central_storage"],
)
def test_two_replicas_train_like_one_device(batches, make_strategy, kind):
    reference = train_single(batches, kind)
    strategy = make_strategy()
    with strategy.scope():
        model = make_model()
        optimizer = make_optimizer(model.parameters(), kind)

    def step(x, y):
        optimizer.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(x), y)
        loss.backward()
        optimizer.step()
        return loss

    for x, y in strategy.experimental_distribute_dataset(batches):
        strategy.run(step, args=(x, y))
        assert_replicas_identical(strategy)
    for expected, trained in zip(reference.parameters(), model.parameters()):
        torch.testing.assert_close(trained, expected, atol=1e-5, rtol=0)
    assert (
        optimizer.state[next(iter(model.parameters()))]["step"] == STEPS
        if kind == "adam"
        else (True)
    )


def test_gradients_are_averaged_right_after_backward():
    strategy = nd.MirroredStrategy(TWO)
    with strategy.scope():
        layer = torch.nn.Linear(1, 1, bias=False)
    with torch.no_grad():
        layer.weight.fill_(1.0)
    data = nd.PerReplica([torch.tensor([[1.0]]), torch.tensor([[3.0]])])

    def step(x):
        layer(x).sum().backward()
        return layer.weight.grad.clone()

    grads = strategy.run(step, args=(data,))
    assert [g.item() for g in grads.values] == [2.0, 2.0]  # mean of 1 and 3


def test_central_parameters_hold_the_averaged_gradient_once_backward_ends():
    """CentralStorage writes the average to its parameters inside the gradient exchange, where
    every replica waits (docs/compile.md: written at `optimizer.step`, it changed under replicas
    still compiling code that read `.grad`). Gradients then also accumulate across runs."""
    strategy = nd.CentralStorageStrategy(TWO)
    with strategy.scope():
        layer = torch.nn.Linear(1, 1, bias=False)
    with torch.no_grad():
        layer.weight.fill_(1.0)
    data = nd.PerReplica([torch.tensor([[1.0]]), torch.tensor([[3.0]])])

    def backward_only(x):
        layer(x).sum().backward()

    strategy.run(backward_only, args=(data,))
    assert layer.weight.grad is not None and layer.weight.grad.item() == 2.0  # mean of 1 and 3
    strategy.run(backward_only, args=(data,))
    assert layer.weight.grad.item() == 4.0  # accumulated, as on one device


def test_sync_gradients_false_leaves_gradients_local():
    strategy = nd.MirroredStrategy(TWO)
    with strategy.scope(sync_gradients=False):
        layer = torch.nn.Linear(1, 1, bias=False)
    data = nd.PerReplica([torch.tensor([[1.0]]), torch.tensor([[3.0]])])

    def step(x):
        layer(x).sum().backward()
        local = layer.weight.grad.clone()
        return local, nd.get_replica_context().all_reduce("mean", local)

    local, reduced = strategy.run(step, args=(data,))
    assert [g.item() for g in local.values] == [1.0, 3.0]
    assert [g.item() for g in reduced.values] == [2.0, 2.0]


def test_clip_and_zero_grad_act_on_each_replica():
    strategy = nd.MirroredStrategy(TWO)
    with strategy.scope():
        layer = torch.nn.Linear(2, 1, bias=False)
        optimizer = torch.optim.SGD(layer.parameters(), lr=1.0)
    data = nd.PerReplica([torch.ones(1, 2) * 10, torch.ones(1, 2) * 30])

    def step(x):
        optimizer.zero_grad()
        layer(x).sum().backward()
        norm = torch.nn.utils.clip_grad_norm_(layer.parameters(), max_norm=1.0)
        optimizer.step()
        return norm

    before = layer.weight.detach().clone()
    norms = strategy.run(step, args=(data,))
    assert torch.equal(norms.values[0], norms.values[1])
    assert (layer.weight - before).norm().item() == pytest.approx(1.0, rel=1e-4)
    assert_replicas_identical(strategy)
    strategy.run(step, args=(data,))  # grads were zeroed on both replicas, not accumulated
    assert (layer.weight - before).norm().item() == pytest.approx(2.0, rel=1e-4)


def test_parameters_changed_in_cross_replica_context_are_broadcast():
    strategy = nd.MirroredStrategy(TWO)
    with strategy.scope():
        layer = torch.nn.Linear(2, 2)
    layer.load_state_dict({"weight": torch.ones(2, 2), "bias": torch.zeros(2)})
    out = strategy.run(lambda: layer.weight.sum())
    assert [t.item() for t in out.values] == [4.0, 4.0]


def test_state_dict_from_replicas_is_one_consistent_checkpoint():
    strategy = nd.MirroredStrategy(TWO)
    with strategy.scope():
        layer = torch.nn.Linear(3, 2)
    expected = {k: v.clone() for k, v in layer.state_dict().items()}
    states = strategy.run(lambda: layer.state_dict())
    for replica in range(2):
        local = strategy.experimental_local_results(states)[replica]
        for name, tensor in expected.items():
            assert torch.equal(local[name], tensor)


def test_parameters_identical_on_every_replica_when_scope_exits():
    strategy = nd.MirroredStrategy(["cpu:0", "cpu:1", "cpu:2"])
    with strategy.scope():
        model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.BatchNorm1d(4))
    assert_replicas_identical(strategy)
    sums = strategy.run(lambda: sum(p.sum() for p in model.parameters()))
    assert len({t.item() for t in sums.values}) == 1


def test_module_made_outside_scope_is_shared_as_is():
    strategy = nd.MirroredStrategy(TWO)
    layer = torch.nn.Linear(2, 1)
    out = strategy.run(lambda: layer.weight.data_ptr())
    assert out == layer.weight.data_ptr() or len(set(out.values)) == 1
