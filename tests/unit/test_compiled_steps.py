"""Compiled steps (`torch.compile`) on every in-process strategy (docs/compile.md).

`aot_eager` compiles the forward and backward graphs through AOTAutograd without a C++
compiler (fast); one test uses the default inductor backend. Each checks what eager training
checks: gradients averaged, replicas bit-identical after every step, and the final parameters
equal (to 1e-5) to the same compiled training on one device.
"""

import shutil

import pytest
import torch

import nbdist as nd
from nbdist.errors import CompiledCollectiveError, ParameterInRunError
from nbdist.strategies._replicas import iterate_components

TWO = ["cpu:0", "cpu:1"]
STEPS, BATCH = 6, 32

STRATEGIES = [
    pytest.param(lambda: nd.MirroredStrategy(TWO), id="mirrored"),
    pytest.param(lambda: nd.CentralStorageStrategy(TWO), id="central_storage"),
    pytest.param(lambda: nd.OneDeviceStrategy("cpu"), id="one_device"),
    pytest.param(lambda: nd.get_strategy(), id="default"),
]


@pytest.fixture(autouse=True)
def fresh_compile_caches():
    torch.compiler.reset()
    yield
    torch.compiler.reset()


def batches():
    generator = torch.Generator().manual_seed(1)
    x = torch.randn(STEPS, BATCH, 12, generator=generator)
    y = torch.randint(0, 4, (STEPS, BATCH), generator=generator)
    return list(zip(x, y))


def make_model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(12, 16), torch.nn.Tanh(), torch.nn.Linear(16, 4))


def train_one_device(backend, compile_what):
    model = make_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.2, momentum=0.9)
    net = torch.compile(model, backend=backend) if compile_what == "model" else model

    def step(x, y):
        optimizer.zero_grad()
        loss = torch.nn.functional.cross_entropy(net(x), y)
        loss.backward()
        optimizer.step()
        return loss

    if compile_what == "step":
        step = torch.compile(step, backend=backend)
    for x, y in batches():
        step(x, y)
    return [p.detach().clone() for p in model.parameters()]


def assert_replicas_identical(strategy):
    replicas = getattr(strategy, "_replicas", None)
    if replicas is None or strategy.num_replicas_in_sync == 1:
        return
    for components in iterate_components(replicas):
        assert len(components) == strategy.num_replicas_in_sync
        for other in components[1:]:
            assert torch.equal(components[0], other)


def train_with(strategy, backend, compile_what):
    with strategy.scope():
        model = make_model()
        optimizer = torch.optim.SGD(model.parameters(), lr=0.2, momentum=0.9)
        net = torch.compile(model, backend=backend) if compile_what == "model" else model
    grads = []

    def step(x, y):
        optimizer.zero_grad()
        loss = torch.nn.functional.cross_entropy(net(x), y)
        loss.backward()
        grads.append(next(iter(model.parameters())).grad)
        optimizer.step()
        return loss

    if compile_what == "step":
        step = torch.compile(step, backend=backend)
    for x, y in strategy.experimental_distribute_dataset(batches()):
        grads.clear()
        strategy.run(step, args=(x, y))
        assert_replicas_identical(strategy)
    return model


@pytest.mark.slow  # Dynamo traces each variant: 20-55 s apiece under load
@pytest.mark.parametrize("compile_what", ["step", "model"])
@pytest.mark.parametrize("make_strategy", STRATEGIES)
def test_compiled_training_equals_one_device(make_strategy, compile_what):
    expected = train_one_device("aot_eager", compile_what)
    strategy = make_strategy()
    model = train_with(strategy, "aot_eager", compile_what)
    for want, got in zip(expected, model.parameters()):
        torch.testing.assert_close(got.detach(), want, atol=1e-5, rtol=0)


@pytest.mark.slow  # 20 s under load
def test_compiled_step_averages_gradients_over_replicas():
    """The replicas' gradients after backward are the mean of their own (never unsynced)."""
    strategy = nd.MirroredStrategy(TWO)
    with strategy.scope():
        model = torch.nn.Linear(3, 1, bias=False)
        torch.nn.init.zeros_(model.weight)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.0)

    @torch.compile(backend="aot_eager")
    def step(x):
        # optimizer.zero_grad, not model.zero_grad: see docs/compile.md (known limits).
        optimizer.zero_grad()
        model(x).sum().backward()
        return model.weight.grad.clone()

    x = strategy.experimental_distribute_values_from_function(
        lambda ctx: torch.full((1, 3), float(ctx.replica_id_in_sync_group + 1))
    )
    for _ in range(2):  # the second call runs the cached graphs
        grads = strategy.experimental_local_results(strategy.run(step, args=(x,)))
        for grad in grads:
            assert torch.equal(grad, torch.full((1, 3), 1.5))


@pytest.mark.skipif(
    shutil.which("g++") is None and shutil.which("c++") is None,
    reason="inductor needs a C++ compiler (.ci/run installs g++)",
)
@pytest.mark.slow  # a third of the unit run: 290 s of 868 s (pytest tests/unit --durations=15)
@pytest.mark.timeout(360)  # inductor compiles C++ for the forward and backward: minutes under load
def test_inductor_compiled_step_on_mirrored_equals_one_device():
    expected = train_one_device("inductor", "step")
    model = train_with(nd.MirroredStrategy(TWO), "inductor", "step")
    for want, got in zip(expected, model.parameters()):
        torch.testing.assert_close(got.detach(), want, atol=1e-5, rtol=0)


@pytest.mark.parametrize("fullgraph", [False, True])
def test_collective_in_a_compiled_step(fullgraph):
    """fullgraph=False: the collective runs between graphs; True: a clear error, no hang."""
    strategy = nd.MirroredStrategy(TWO)

    def body(t, ctx):
        total = ctx.all_reduce("sum", t * 2)
        return total + 1

    def step_with_context(t):
        return step(t, nd.get_replica_context())  # the lookup outside the compiled function

    step = torch.compile(body, backend="aot_eager", fullgraph=fullgraph)
    value = strategy.experimental_distribute_values_from_function(
        lambda ctx: torch.tensor([float(ctx.replica_id_in_sync_group)])
    )
    if not fullgraph:
        out = strategy.experimental_local_results(strategy.run(step_with_context, args=(value,)))
        assert [o.item() for o in out] == [3.0, 3.0]
        return
    with pytest.raises(
        CompiledCollectiveError, match=r"ReplicaContext.all_reduce.*fullgraph=True.*without"
    ):
        strategy.run(step_with_context, args=(value,))
    # The strategy is still usable: no replica was left waiting.
    out = strategy.run(lambda t: nd.get_replica_context().all_reduce("sum", t), args=(value,))
    assert [o.item() for o in strategy.experimental_local_results(out)] == [1.0, 1.0]


def test_context_lookup_in_a_fullgraph_step_is_refused_on_one_replica_too():
    step = torch.compile(
        lambda: nd.get_replica_context().merge_call(lambda s: 1),
        backend="aot_eager",
        fullgraph=True,
    )
    with pytest.raises(CompiledCollectiveError, match=r"get_replica_context.*outside the compiled"):
        nd.OneDeviceStrategy("cpu").run(step)


def test_context_lookup_and_merge_call_in_a_compiled_step_break_the_graph():
    strategy = nd.MirroredStrategy(TWO)

    @torch.compile(backend="aot_eager")
    def step(t):
        ctx = nd.get_replica_context()
        doubled = ctx.merge_call(lambda s, v: s.reduce("sum", v, axis=None), args=(t * 2,))
        return doubled + ctx.replica_id_in_sync_group

    value = strategy.experimental_distribute_values_from_function(
        lambda ctx: torch.tensor(float(ctx.replica_id_in_sync_group + 1))
    )
    out = strategy.experimental_local_results(strategy.run(step, args=(value,)))
    assert [o.item() for o in out] == [6.0, 7.0]


@pytest.mark.parametrize("compiled", [False, True])
def test_a_step_that_creates_parameters_is_refused(compiled):
    strategy = nd.MirroredStrategy(TWO)

    def step(x):
        layer = torch.nn.Linear(2, 2)
        return layer(x)

    if compiled:
        step = torch.compile(step, backend="aot_eager")
    with pytest.raises(ParameterInRunError, match=r"Linear registered parameter 'weight'.*scope"):
        strategy.run(step, args=(torch.ones(1, 2),))
    # A module created in scope still trains afterwards.
    with strategy.scope():
        layer = torch.nn.Linear(2, 2)
    out = strategy.run(lambda x: layer(x).sum(), args=(torch.ones(1, 2),))
    assert len(strategy.experimental_local_results(out)) == 2


@pytest.mark.parametrize(
    "make_strategy",
    [
        pytest.param(lambda: nd.MirroredStrategy(TWO), id="mirrored"),
        pytest.param(lambda: nd.CentralStorageStrategy(TWO), id="central_storage"),
    ],
)
def test_model_zero_grad_in_a_compiled_step_clears_every_replica(make_strategy):
    # Traced, Module.zero_grad read replica 0's gradients on every replica, so the others kept
    # theirs every other step and the averaged gradient grew (4, 4, 6, 4 here).
    strategy = make_strategy()
    with strategy.scope():
        model = torch.nn.Sequential(torch.nn.Linear(2, 1, bias=False))
    torch.nn.init.ones_(model[0].weight)

    def step(x):
        model.zero_grad()
        model(x).sum().backward()
        return model[0].weight.grad.clone()

    compiled = torch.compile(step, backend="aot_eager")
    x = torch.ones(4, 2)
    for _ in range(4):
        grads = strategy.experimental_local_results(strategy.run(compiled, args=(x,)))
        for grad in grads:
            assert grad.tolist() == [[4.0, 4.0]]  # 4 rows of ones, summed
