"""Worker script of tests/dist/test_checkpoint_sharded.py (`PHASE`, `DIR`).

- `train2`: 2 workers, sharded: 5 steps, save `DIR/c1` (DCP), 5 more steps.
- `resume3`: 3 workers, sharded: restore `c1`, 5 steps (the same global batches), save `c2`.
- `mirror4`: 4 workers: a mirrored model restores `c2` and saves `c3` (one file); then a
  sharded model restores `c3` and saves `c4`.
- `shard2`: 2 workers, sharded: restore `c4`.

Each reports the whole parameters (gathered) at each point. Run in each worker process by
`nbdist.testing.run_workers` as `__main__`; importing it runs nothing."""

import os

import torch
import torch.nn.functional as F

if "report" not in globals():  # run_workers predefines it
    from nbdist.testing import report

WIDTH, GLOBAL_BATCH = 24, 12


def make(strategy):
    torch.manual_seed(strategy.cluster_resolver.task_id)
    with strategy.scope():
        model = torch.nn.Sequential(
            *[torch.nn.Sequential(torch.nn.Linear(WIDTH, WIDTH), torch.nn.Tanh())
              for _ in range(4)], torch.nn.Linear(WIDTH, 4))  # fmt: skip
        optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    return model, optimizer


def train(strategy, model, optimizer, first, steps):
    rank, world = strategy.cluster_resolver.task_id, strategy.num_replicas_in_sync
    g = torch.Generator().manual_seed(3)
    x = torch.randn(20, GLOBAL_BATCH, WIDTH, generator=g)
    y = torch.randint(0, 4, (20, GLOBAL_BATCH), generator=g)
    per = GLOBAL_BATCH // world
    mine = slice(rank * per, (rank + 1) * per)
    for i in range(first, first + steps):
        optimizer.zero_grad()
        F.cross_entropy(model(x[i, mine]), y[i, mine]).backward()
        optimizer.step()


def whole(strategy, model):
    return [strategy.gather(p, axis=None).tolist() if hasattr(p, "to_local")
            else p.detach().tolist() for p in model.parameters()]  # fmt: skip


if __name__ == "__main__":
    torch.set_num_threads(1)
    import nbdist as nd

    phase, folder = os.environ["PHASE"], os.environ["DIR"]
    out = {}

    def path(name):
        return os.path.join(folder, name)

    if phase == "mirror4":
        mirrored = nd.MultiWorkerMirroredStrategy()
        model, optimizer = make(mirrored)
        nd.checkpoint.restore(path("c2"), model=model, optimizer=optimizer)
        out["mirrored_restored"] = whole(mirrored, model)
        out["mirrored_state_steps"] = [float(s["step"]) for s in optimizer.state.values()]
        nd.checkpoint.save(path("c3"), model=model, optimizer=optimizer)
        out["c3_is_file"] = os.path.isfile(path("c3"))
        mirrored.shutdown()
    strategy = nd.experimental.FullyShardedStrategy(min_shard_bytes=0)
    model, optimizer = make(strategy)
    progress = {"step": 0}
    if phase == "train2":
        train(strategy, model, optimizer, 0, 5)
        progress["step"] = 5
        nd.checkpoint.save(path("c1"), model=model, optimizer=optimizer, progress=progress)
        out["saved"] = whole(strategy, model)
        out["c1_files"] = sorted(os.listdir(path("c1")))
        train(strategy, model, optimizer, 5, 5)
        out["uninterrupted"] = whole(strategy, model)
    elif phase == "resume3":
        nd.checkpoint.restore(path("c1"), model=model, optimizer=optimizer, progress=progress)
        out["restored"] = whole(strategy, model)
        out["progress"] = progress
        out["rows"] = [[p.to_local().shape[0], p.shape[0]] for p in model.parameters()]
        train(strategy, model, optimizer, progress["step"], 5)
        out["resumed"] = whole(strategy, model)
        nd.checkpoint.save(path("c2"), model=model, optimizer=optimizer)
    elif phase == "mirror4":
        nd.checkpoint.restore(path("c3"), model=model, optimizer=optimizer)
        out["sharded_restored"] = whole(strategy, model)
        out["sharded_state_local"] = all(
            hasattr(v, "to_local") for s in optimizer.state.values() for k, v in s.items()
            if k != "step"
        )  # fmt: skip
        nd.checkpoint.save(path("c4"), model=model, optimizer=optimizer)
    elif phase == "shard2":
        nd.checkpoint.restore(path("c4"), model=model, optimizer=optimizer)
        out["restored"] = whole(strategy, model)
        try:  # another model: refused, nothing changed
            other = nd.experimental.FullyShardedStrategy(min_shard_bytes=0)
            with other.scope():
                wrong = torch.nn.Sequential(torch.nn.Linear(WIDTH, 8))
            nd.checkpoint.restore(path("c4"), model=wrong)
            out["wrong"] = "no error"
        except nd.checkpoint.CheckpointMismatchError as error:
            out["wrong"] = str(error)
        try:
            nd.checkpoint.read(path("c4"))
        except nd.checkpoint.CheckpointError as error:
            out["read"] = str(error)
    strategy.shutdown()
    report(out)
