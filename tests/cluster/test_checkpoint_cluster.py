"""nd.checkpoint on real engines: a run saved on 2 engines resumes on 3.

The cells run on every engine as `%%distribute` runs them (engine namespace, outside
`strategy.run`), through ipyparallel's `DirectView.execute`; one uses `cluster.strategy.run`
(replica context on the engines). The resumed run ends at the parameters of an uninterrupted
2-engine run within 1e-6, and a truncated checkpoint is an error on every engine that leaves
the cluster usable.
"""

from __future__ import annotations

import os

import pytest
import torch
from ipyparallel import interactive

import nbdist as nd
from nbdist.cluster import Cluster, RemoteError
from tests.cluster.conftest import stop_and_check

pytestmark = pytest.mark.cluster

STEPS, SAVE_AT, GLOBAL_BATCH = 8, 3, 12

SETUP = f"""
import torch
from torch.utils.data import DataLoader, TensorDataset
data = torch.Generator().manual_seed(0)
x = torch.randn({STEPS * GLOBAL_BATCH}, 5, generator=data)
y = x @ torch.randn(5, 2, generator=data)
loader = DataLoader(TensorDataset(x, y), batch_size={GLOBAL_BATCH}, shuffle=True,
                    generator=torch.Generator().manual_seed(7))
torch.manual_seed(1)
with strategy.scope():
    model = torch.nn.Sequential(torch.nn.Linear(5, 8), torch.nn.Tanh(), torch.nn.Linear(8, 2))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    seen = nd.Variable(0.0, synchronization="ON_READ", aggregation="SUM")
iterator = iter(strategy.experimental_distribute_dataset(loader))

def step(batch):
    inputs, targets = batch
    loss = torch.nn.functional.mse_loss(model(inputs), targets)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    seen.assign_add(float(len(inputs)))

def train(steps):
    for _ in range(steps):
        strategy.run(step, args=(next(iterator),))
"""

RESULTS = """
params = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
total = float(seen.read_value())
left = sum(1 for _ in iterator)
"""


@interactive
def save_on_engine(path: str) -> str:
    """Runs on each engine inside `strategy.run` (one replica per engine); the objects are
    the engine's (its namespace is this function's globals)."""
    names = ("model", "optimizer", "seen", "iterator")
    return nd.checkpoint.save(path, **{name: globals()[name] for name in names})


def _execute(cluster: Cluster, code: str) -> None:
    cluster.client[:].execute(code, block=True)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    folder = tmp_path_factory.mktemp("ckpt")
    path = str(folder / "run.pt")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("IPYTHONDIR", str(tmp_path_factory.mktemp("ipython")))
        two = Cluster(n=2, timeout=90.0)
        try:
            two.start()
            _execute(two, SETUP + f"train({STEPS})" + RESULTS)
            uninterrupted = two.pull("params").values
            _execute(two, SETUP + f"train({SAVE_AT})")
            saved = two.strategy.run(save_on_engine, args=(path,)).values
        finally:
            stop_and_check(two)
        three = Cluster(n=3, timeout=90.0)
        try:
            three.start()
            _execute(three, SETUP + f"nd.checkpoint.restore({path!r}, model=model, "
                     "optimizer=optimizer, seen=seen, iterator=iterator)\n"
                     f"train({STEPS - SAVE_AT})" + RESULTS)  # fmt: skip
            resumed = three.pull("params").values
            totals, lefts = three.pull("total").values, three.pull("left").values
            truncated = str(folder / "truncated.pt")
            with open(path, "rb") as file:
                data = file.read()
            with open(truncated, "wb") as file:
                file.write(data[: len(data) // 2])
            with pytest.raises(Exception) as info:  # ipyparallel's CompositeError
                _execute(three, f"nd.checkpoint.restore({truncated!r}, model=model)")
            (folder / "afile").write_text("x")  # a file where a directory should be
            try:
                three.strategy.run(save_on_engine, args=(folder / "afile" / "c.pt",))
                missing_dir = None
            except RemoteError as error:
                missing_dir = error
            usable = three.strategy.run(lambda: 1).values
            managed = str(folder / "managed")  # missing: the writing engine creates it
            _execute(three, f"manager = nd.checkpoint.CheckpointManager({managed!r}, "
                     "max_to_keep=1, model=model)\n"
                     "saved = [manager.save(), manager.save()]\n"
                     "kept = manager.checkpoints")  # fmt: skip
            manager = {
                "saved": three.pull("saved").values, "kept": three.pull("kept").values,
                "files": sorted(os.listdir(managed)),
            }  # fmt: skip
        finally:
            stop_and_check(three)
    return {
        "uninterrupted": uninterrupted, "saved": saved, "resumed": resumed, "totals": totals,
        "lefts": lefts, "truncated": info.value, "missing_dir": missing_dir, "usable": usable,
        "manager": manager,
    }  # fmt: skip


def test_a_run_saved_on_two_engines_resumes_on_three(runs):
    expected = runs["uninterrupted"][0]
    assert torch.equal(runs["uninterrupted"][1], expected)
    assert len(runs["resumed"]) == 3
    for params in runs["resumed"]:
        assert torch.allclose(params, expected, atol=1e-6, rtol=0), (params - expected).abs().max()
    assert runs["totals"] == (STEPS * GLOBAL_BATCH,) * 3
    assert runs["lefts"] == (0, 0, 0)
    assert len(set(runs["saved"])) == 1


def test_engine_errors_name_the_problem_on_every_engine_and_keep_the_cluster(runs):
    text = str(runs["truncated"])
    assert text.count("CheckpointError") >= 3, text
    assert "was not completely written" in text
    error = runs["missing_dir"]
    assert error is not None and error.replicas == (0, 1, 2)
    assert "is a file, not a directory" in str(error)
    assert runs["usable"] == (1, 1, 1)


def test_checkpoint_manager_on_three_engines_one_writes_every_engine_knows(runs):
    manager = runs["manager"]
    folder = os.path.dirname(manager["saved"][0][0])
    expected = [os.path.join(folder, "ckpt-1"), os.path.join(folder, "ckpt-2")]
    assert manager["saved"] == (expected,) * 3
    assert manager["kept"] == ([expected[1]],) * 3  # max_to_keep=1, on every engine
    assert manager["files"] == ["checkpoint", "ckpt-2"]  # ckpt-1 deleted once
