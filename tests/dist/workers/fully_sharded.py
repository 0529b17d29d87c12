"""Worker script of tests/dist/test_fully_sharded.py.

In one process: a 4-block MLP trained `STEPS` steps with `MultiWorkerMirroredStrategy`, then
the same model on the same data with `FullyShardedStrategy` (its own group, after the first
is shut down); reports both models' final parameters (the sharded ones gathered), each sharded
parameter's local rows, the bytes held per worker, the telemetry's collectives, and, with
`EXTRA=1`, mixed precision, the DTensor reduction rules and the bad inputs.

Run in each worker process by `nbdist.testing.run_workers` as `__main__`; importing it runs
nothing."""

import os
import warnings

import torch
import torch.nn.functional as F

if "report" not in globals():  # run_workers predefines it
    from nbdist.testing import report


WIDTH, BATCH = 32, 8


class Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(WIDTH, WIDTH)

    def forward(self, x):
        return torch.tanh(self.lin(x))


def make_model():
    return torch.nn.Sequential(*[Block() for _ in range(4)], torch.nn.Linear(WIDTH, 4))


def data(steps, world):
    g = torch.Generator().manual_seed(7)
    x = torch.randn(steps, BATCH * world, WIDTH, generator=g)
    y = torch.randint(0, 4, (steps, BATCH * world), generator=g)
    return x, y


def train(strategy, steps, rank, world, **kw):
    torch.manual_seed(rank)  # different initial values: the scope broadcasts worker 0's
    with strategy.scope():
        model = make_model()
        optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    x, y = data(steps, world)
    mine = slice(rank * BATCH, (rank + 1) * BATCH)

    def step(xb, yb):
        optimizer.zero_grad()
        loss = F.cross_entropy(model(xb), yb)
        loss.backward()
        optimizer.step()
        return loss.detach()

    losses = [float(strategy.run(step, args=(x[i, mine], y[i, mine]))) for i in range(steps)]
    return model, optimizer, losses


def held_bytes(model, optimizer):
    def nbytes(t):
        t = t.to_local() if hasattr(t, "to_local") else t
        return t.numel() * t.element_size()

    params = list(model.parameters())
    state = [v for p in params for v in optimizer.state[p].values()
             if isinstance(v, torch.Tensor) and v.dim() > 0]  # fmt: skip
    return sum(nbytes(p) for p in params) + sum(nbytes(p.grad) for p in params) + sum(
        nbytes(v) for v in state
    )


if __name__ == "__main__":
    torch.set_num_threads(1)
    import nbdist as nd
    from nbdist.errors import NotShardedError

    steps = int(os.environ.get("STEPS", "20"))
    out = {}

    mirrored = nd.MultiWorkerMirroredStrategy()
    rank, world = mirrored.cluster_resolver.task_id, mirrored.num_replicas_in_sync
    model, optimizer, out["mirrored_losses"] = train(mirrored, steps, rank, world)
    out["mirrored"] = [p.detach().tolist() for p in model.parameters()]
    out["mirrored_bytes"] = held_bytes(model, optimizer)
    mirrored.shutdown()

    strategy = nd.experimental.FullyShardedStrategy(min_shard_bytes=1024)
    model, optimizer, out["sharded_losses"] = train(strategy, steps, rank, world)
    out["sharded"] = [strategy.gather(p).tolist() for p in model.parameters()]
    out["rows"] = [
        [p.to_local().shape[0], p.shape[0]] for p in model.parameters() if hasattr(p, "to_local")
    ]
    out["sharded_bytes"] = held_bytes(model, optimizer)
    out["local_bytes"] = strategy.local_bytes(model, optimizer)
    out["units"] = [type(m).__name__ for m in strategy.units]
    from nbdist.telemetry.holdings import holdings

    out["holdings"] = [(r["kind"], r["bytes"]) for r in holdings({"model": model})]
    out["optimizer_on_shards"] = all(
        hasattr(p, "to_local") for g in optimizer.param_groups for p in g["params"]
    )
    ops = [r.op for r in strategy.extended.telemetry.records()]
    out["ops"] = sorted({op for op in ops if ":" in op and op.split(":")[1] in ("shards", "SUM",
                                                                                "AVG")})
    out["all_gathers"] = ops.count("all_gather:shards")
    out["recorded"] = sorted({e["op"] for e in strategy.process_group.recorder.entries()})

    if os.environ.get("EXTRA") == "1":
        with torch.no_grad():  # an evaluation forward, no backward after it
            model(torch.ones(2, WIDTH))
        out["sharded_after_eval"] = all(hasattr(p, "to_local") for p in model.parameters())
        torch.manual_seed(0)
        with nd.experimental.FullyShardedStrategy().scope():  # 1 MiB: no subtree reaches it
            small = make_model()
        out["small_units"] = [type(m).__name__ for m in small.modules()
                              if type(m).__name__.startswith("FSDP")]  # fmt: skip
        weight = model[0].lin.weight
        whole = strategy.gather(weight)
        out["reduce_sum_is_n_times"] = bool(
            torch.allclose(strategy.reduce("sum", weight, axis=None), world * whole)
        )
        out["reduce_mean_is_whole"] = bool(
            torch.allclose(strategy.reduce("mean", weight, axis=None), whole)
        )
        result = strategy.run(lambda: model[0].lin.weight)
        out["run_returns"] = type(result).__name__

        # a module created outside scope, passed to run
        outside = make_model()
        try:
            strategy.run(lambda m: m(torch.ones(1, WIDTH)), args=(outside,))
            out["outside"] = "no error"
        except NotShardedError as error:
            out["outside"] = str(error)
        # an optimizer stepping it inside run
        opt_outside = torch.optim.SGD(outside.parameters(), lr=0.1)

        def step_outside():
            outside(torch.ones(2, WIDTH)).sum().backward()
            opt_outside.step()

        try:
            strategy.run(step_outside)
            out["outside_step"] = "no error"
        except NotShardedError as error:
            out["outside_step"] = type(error).__name__

        # a policy that chooses no module: a warning
        nothing = nd.experimental.FullyShardedStrategy(shard=lambda m: False)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            with nothing.scope():
                lone = make_model()
        out["nothing_warning"] = [str(w.message) for w in caught]
        out["nothing_sharded"] = all(hasattr(p, "to_local") for p in lone.parameters())

        # a parameter tied across two blocks: "auto" puts it in the root unit, training works
        torch.manual_seed(0)
        before = len(strategy.units)
        with strategy.scope():
            tied = make_model()
            tied[3].lin.weight = tied[0].lin.weight
            tied_opt = torch.optim.SGD(tied.parameters(), lr=0.1)
        x, y = data(3, world)
        for i in range(3):
            tied_opt.zero_grad()
            F.cross_entropy(tied(x[i, :BATCH]), y[i, :BATCH]).backward()
            tied_opt.step()
        out["tied_same_object"] = tied[3].lin.weight is tied[0].lin.weight
        out["tied_units"] = [type(m).__name__ for m in strategy.units[before:]]
        # a callable that picks one owner of the tied parameter: named
        picky = nd.experimental.FullyShardedStrategy(shard=lambda m: isinstance(m, Block))
        try:
            with picky.scope():
                bad = make_model()
                bad[3].lin.weight = bad[0].lin.weight
            out["tied_callable"] = "no error"
        except nd.errors.InvalidArgumentError as error:
            out["tied_callable"] = str(error)

        # mixed precision: bfloat16 compute, float32 shards and gradient reduction
        mixed = nd.experimental.FullyShardedStrategy(
            min_shard_bytes=1024, mixed_precision=torch.bfloat16
        )
        mixed_model, _, out["mixed_losses"] = train(mixed, 5, rank, world)
        out["mixed_param_dtype"] = str(mixed_model[0].lin.weight.dtype)
        out["mixed_grad_dtype"] = str(mixed_model[0].lin.weight.grad.dtype)
        out["mixed_output_dtype"] = str(mixed_model(torch.ones(1, WIDTH)).dtype)

        # torch.compile of a sharded model
        try:
            compiled = torch.compile(model, backend="aot_eager")
            loss = compiled(torch.ones(2, WIDTH)).sum()
            loss.backward()
            reference = model(torch.ones(2, WIDTH)).sum()
            out["compile"] = abs(float(loss) - float(reference)) < 1e-5
        except Exception as error:  # noqa: BLE001 - reported, the test names what it expects
            out["compile"] = f"{type(error).__name__}: {str(error)[:300]}"

    strategy.shutdown()
    report(out)
