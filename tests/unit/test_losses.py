"""`nd.compute_average_loss` and `nd.scale_regularization_loss`: TensorFlow's values (the
expected numbers are those of TensorFlow's own tests, nn_loss_scaling_utilities_test.py), and a
gradient that, after nbdist averages it over replicas, is the one-device gradient of the
global-batch mean (where TensorFlow's formula alone gives 1/N of it)."""

from __future__ import annotations

import warnings

import pytest
import torch
import torch.nn.functional as F

import nbdist as nd
from nbdist.errors import ArgumentTypeError, ContextError, InvalidArgumentError, NbdistError

GLOBAL_BATCH = 8


@pytest.fixture(scope="module")
def strategy():
    return nd.MirroredStrategy(["cpu:0", "cpu:1"])


def _sum(strategy, fn, *args, **kwargs):
    return float(strategy.reduce("sum", strategy.run(fn, args=args, kwargs=kwargs), axis=None))


# -- values, as TensorFlow computes them ----------------------------------------------------


def test_global_batch_size_divides_the_sum():
    loss = nd.compute_average_loss(torch.tensor([1.0, 2.0, 3.0, 4.0, 5.0]), global_batch_size=10)
    assert loss.item() == 1.5
    # integers are averaged as floats, as TF's test (a list of ints) expects
    assert nd.compute_average_loss([1, 2, 3, 4, 5], global_batch_size=10).item() == 1.5


def test_default_global_batch_size_is_the_replica_batch_times_the_replicas(strategy):
    per_example = torch.tensor([2.5, 6.2, 5.0])
    assert nd.compute_average_loss(per_example).item() == pytest.approx((2.5 + 6.2 + 5.0) / 3)
    # each replica divides by 3 * 2; the sum over both is the mean again
    assert _sum(strategy, nd.compute_average_loss, per_example) == pytest.approx(
        (2.5 + 6.2 + 5.0) / 3
    )


def test_sample_weights_scalar_per_example_and_per_time_step(strategy):
    assert _sum(
        strategy, nd.compute_average_loss, [2.0, 4.0, 6.0], sample_weight=2
    ) == pytest.approx((2.0 + 4.0 + 6.0) * 2.0 / 3)
    assert _sum(
        strategy, nd.compute_average_loss, [2.0, 4.0, 6.0], sample_weight=[0.3, 0.5, 0.2]
    ) == pytest.approx((2.0 * 0.3 + 4.0 * 0.5 + 6.0 * 0.2) / 3)
    assert _sum(
        strategy,
        nd.compute_average_loss,
        [[2.0, 0.5], [4.0, 1.0]],
        sample_weight=[[0.3, 0.7], [0.2, 0.8]],
    ) == pytest.approx((2.0 * 0.3 + 0.5 * 0.7 + 4.0 * 0.2 + 1.0 * 0.8) / 2)
    # one weight per example of a [batch, time] loss: added a last axis, as TF does
    loss = nd.compute_average_loss(
        torch.tensor([[2.0, 0.5], [4.0, 1.0]]), global_batch_size=2, sample_weight=[1.0, 0.0]
    )
    assert loss.item() == pytest.approx(2.5 / 2)


def test_dtype_is_kept(strategy):
    per_example = torch.tensor([2.0, 4.0, 6.0], dtype=torch.float64)
    losses = strategy.run(nd.compute_average_loss, args=(per_example,), kwargs={"sample_weight": 2})
    assert all(v.dtype == torch.float64 for v in losses.values)
    assert nd.scale_regularization_loss(per_example).dtype == torch.float64


def test_scale_regularization_loss_divides_by_the_replicas(strategy):
    reg = torch.tensor([2.5, 6.2, 5.0])
    assert nd.scale_regularization_loss(reg).item() == pytest.approx(2.5 + 6.2 + 5.0)
    assert _sum(strategy, nd.scale_regularization_loss, reg) == pytest.approx(2.5 + 6.2 + 5.0)


def test_an_empty_batch_gives_zero_as_tf_div_no_nan():
    assert nd.compute_average_loss(torch.zeros(0)).item() == 0.0
    assert nd.compute_average_loss(torch.tensor([1.0, 2.0]), global_batch_size=0).item() == 0.0


# -- gradients: the one-device gradient of the global-batch mean -----------------------------


def _data():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(GLOBAL_BATCH, 6, generator=g)
    return x, torch.randint(0, 3, (GLOBAL_BATCH,), generator=g)


def _one_device_gradient(x, y, l2=0.0):
    torch.manual_seed(0)
    model = torch.nn.Linear(6, 3)
    loss = F.cross_entropy(model(x), y)
    if l2:
        loss = loss + l2 * model.weight.square().sum()
    return [g for g in torch.autograd.grad(loss, list(model.parameters()))]


def _replica_gradients(strategy, loss_fn, x, y):
    """Gradients after one backward of `loss_fn(model, x, y)` inside strategy.run, per replica."""
    torch.manual_seed(0)
    with strategy.scope():
        model = torch.nn.Linear(6, 3)

    def step(x, y):
        model.zero_grad()
        loss_fn(model, x, y).backward()
        return [p.grad.clone() for p in model.parameters()]

    dataset = strategy.experimental_distribute_dataset([(x, y)])
    (batch,) = list(dataset)
    grads = strategy.run(step, args=batch)  # a list of PerReplica (or of tensors: one replica)
    locals_ = [strategy.experimental_local_results(g) for g in grads]
    return [list(per_replica) for per_replica in zip(*locals_)]


def _tf_recipe(model, x, y, global_batch_size=GLOBAL_BATCH):
    per_example = F.cross_entropy(model(x), y, reduction="none")
    return nd.compute_average_loss(per_example, global_batch_size=global_batch_size)


def test_tf_recipe_gives_the_one_device_gradient_of_the_global_mean(strategy):
    x, y = _data()
    expected = _one_device_gradient(x, y)
    for grads in _replica_gradients(strategy, _tf_recipe, x, y):
        for got, want in zip(grads, expected):
            torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-7)


def test_tf_formula_written_out_gives_half_the_gradient(strategy):
    """What the literal port did before these functions existed: 1/N of the step."""
    x, y = _data()
    expected = _one_device_gradient(x, y)

    def literal(model, x, y):
        return F.cross_entropy(model(x), y, reduction="none").sum() / GLOBAL_BATCH

    for grads in _replica_gradients(strategy, literal, x, y):
        ratios = [(got / want)[want.abs() > 1e-6] for got, want in zip(grads, expected)]
        torch.testing.assert_close(torch.cat(ratios), torch.full_like(torch.cat(ratios), 0.5))


def test_default_global_batch_size_gives_the_same_gradient(strategy):
    x, y = _data()
    expected = _one_device_gradient(x, y)

    def recipe(model, x, y):
        return nd.compute_average_loss(F.cross_entropy(model(x), y, reduction="none"))

    for grads in _replica_gradients(strategy, recipe, x, y):
        for got, want in zip(grads, expected):
            torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-7)


def test_regularization_loss_gradient_counts_once(strategy):
    x, y = _data()
    expected = _one_device_gradient(x, y, l2=0.1)

    def recipe(model, x, y):
        return _tf_recipe(model, x, y) + nd.scale_regularization_loss(
            0.1 * model.weight.square().sum()
        )

    for grads in _replica_gradients(strategy, recipe, x, y):
        for got, want in zip(grads, expected):
            torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-7)


def test_central_storage_strategy_too():
    strategy = nd.CentralStorageStrategy(["cpu:0", "cpu:1"])
    x, y = _data()
    expected = _one_device_gradient(x, y)
    for grads in _replica_gradients(strategy, _tf_recipe, x, y):
        for got, want in zip(grads, expected):
            torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-7)


def test_one_device_strategy_is_a_plain_average():
    strategy = nd.OneDeviceStrategy("cpu")
    x, y = _data()
    expected = _one_device_gradient(x, y)
    (grads,) = [_replica_gradients(strategy, _tf_recipe, x, y)[0]]
    for got, want in zip(grads, expected):
        torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-7)


def test_the_value_is_tensorflows_and_only_the_gradient_is_scaled(strategy):
    x, y = _data()
    torch.manual_seed(0)
    with strategy.scope():
        model = torch.nn.Linear(6, 3)
    (batch,) = list(strategy.experimental_distribute_dataset([(x, y)]))
    losses = strategy.run(lambda x, y: _tf_recipe(model, x, y).detach(), args=batch)
    with torch.no_grad():
        one_device = F.cross_entropy(model(x), y)
    assert float(strategy.reduce("sum", losses, axis=None)) == pytest.approx(float(one_device))


# -- bad input ------------------------------------------------------------------------------


def test_global_batch_size_smaller_than_the_batch_seen_scales_the_gradient_and_warns(strategy):
    """The per-replica batch passed by mistake (4 instead of 8): TF divides all the same, so
    the step is 2x; nbdist does the same and warns, since no replica can hold 4 of a global 4."""
    x, y = _data()
    expected = _one_device_gradient(x, y)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        per_replica = _replica_gradients(
            strategy, lambda m, x, y: _tf_recipe(m, x, y, global_batch_size=GLOBAL_BATCH // 2), x, y
        )
    for grads in per_replica:
        for got, want in zip(grads, expected):
            torch.testing.assert_close(got, 2 * want, rtol=1e-6, atol=1e-7)
    messages = [str(w.message) for w in caught if "compute_average_loss" in str(w.message)]
    assert messages and "not the per-replica one" in messages[0]
    assert "global_batch_size=4 over 2 replicas" in messages[0]


def test_a_short_last_batch_scales_the_gradient_as_tensorflow_does(strategy):
    """A last batch of 5 with GLOBAL_BATCH=8 (3 | 2): the step is 5/8 of the mean's gradient,
    TensorFlow's behaviour (its tutorial divides by the full global batch); no warning."""
    x, y = _data()
    x, y = x[:5], y[:5]
    expected = _one_device_gradient(x, y)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        per_replica = _replica_gradients(strategy, _tf_recipe, x, y)
    for grads in per_replica:
        for got, want in zip(grads, expected):
            torch.testing.assert_close(got, want * 5 / 8, rtol=1e-6, atol=1e-7)


def test_in_cross_replica_context_without_global_batch_size_is_a_runtime_error(strategy):
    with strategy.scope():
        with pytest.raises(ContextError, match="in cross replica context") as info:
            nd.compute_average_loss(torch.tensor([2.0, 3.0]))
        assert isinstance(info.value, RuntimeError)
        assert "strategy.run" in str(info.value) and "global_batch_size" in str(info.value)
        with pytest.raises(ContextError, match="`scale_regularization_loss` in cross replica"):
            nd.scale_regularization_loss(torch.tensor([2.0, 3.0]))
        # with global_batch_size TF computes it there too
        assert nd.compute_average_loss([2.0, 3.0], global_batch_size=4).item() == 1.25


def test_outside_every_scope_it_is_one_replica():
    """No strategy: TF's default replica context, one replica in sync."""
    assert nd.compute_average_loss(torch.tensor([2.0, 4.0])).item() == 3.0
    assert nd.scale_regularization_loss(torch.tensor([2.0, 4.0])).item() == 6.0
    w = torch.ones(2, requires_grad=True)
    nd.compute_average_loss(w * torch.tensor([2.0, 4.0])).backward()
    assert w.grad.tolist() == [1.0, 2.0]


@pytest.mark.parametrize("bad", [8.0, True, "8", torch.tensor(8.0)])
def test_global_batch_size_must_be_an_integer(bad):
    with pytest.raises(ArgumentTypeError, match="global_batch_size must be an integer") as info:
        nd.compute_average_loss(torch.ones(4), global_batch_size=bad)
    assert isinstance(info.value, TypeError) and "GLOBAL_BATCH_SIZE = 64" in str(info.value)


def test_sample_weight_in_tensorflows_position_is_refused_naming_the_order():
    """TF's second positional argument is sample_weight; API.md's is global_batch_size."""
    for weights in ([0.3, 0.5, 0.2], torch.tensor([0.3, 0.5, 0.2]), 0.5):
        with pytest.raises(
            (ArgumentTypeError, InvalidArgumentError), match=r"sample_weight=\.\.\. by name"
        ):
            nd.compute_average_loss(torch.tensor([2.0, 4.0, 6.0]), weights)


def test_global_batch_size_as_an_integer_tensor_is_accepted():
    loss = nd.compute_average_loss(torch.ones(4), global_batch_size=torch.tensor(8))
    assert loss.item() == 0.5


@pytest.mark.parametrize(
    ("bad", "text"),
    [(-1, "must be non-negative, got -1"), (torch.tensor([4, 4]), "must be a scalar")],
)
def test_global_batch_size_must_be_a_non_negative_scalar(bad, text):
    with pytest.raises(InvalidArgumentError, match=text) as info:
        nd.compute_average_loss(torch.ones(4), global_batch_size=bad)
    assert isinstance(info.value, ValueError)


def test_a_scalar_loss_is_refused():
    with pytest.raises(InvalidArgumentError, match="at least rank 1") as info:
        nd.compute_average_loss(torch.tensor(2.0))
    assert "reduction='none'" in str(info.value)


def test_a_sample_weight_that_does_not_broadcast_is_refused():
    with pytest.raises(InvalidArgumentError, match=r"sample_weight of shape \(2,\)"):
        nd.compute_average_loss([2.5, 6.2, 5.0], sample_weight=[0.2, 0.8], global_batch_size=10)


def test_a_per_replica_value_is_refused_with_the_fix(strategy):
    per_replica = strategy.run(lambda: torch.ones(2))
    with pytest.raises(ArgumentTypeError, match=r"inside the function given to strategy\.run"):
        nd.compute_average_loss(per_replica, global_batch_size=4)
    with pytest.raises(ArgumentTypeError, match="regularization_loss must be a tensor"):
        nd.scale_regularization_loss(object())


def test_every_error_is_an_nbdist_error():
    for call in (
        lambda: nd.compute_average_loss(torch.ones(2), global_batch_size=2.0),
        lambda: nd.compute_average_loss(torch.tensor(1.0)),
    ):
        with pytest.raises(NbdistError):
            call()
