"""torchmetrics on 2 real gloo workers (`MultiWorkerMirroredStrategy` under torchrun
variables): metrics made in `strategy.scope()` (as TF's tutorials make theirs) and updated
inside `strategy.run` on each worker's share of every global batch; `compute()` gives both
workers the one-device value (torchmetrics gathers the states over nbdist's process group).
The per-replica recipe of docs/metrics.md gives the same in several processes.
"""

from __future__ import annotations

import pytest

from nbdist.testing import assert_all_ok, free_port, run_workers, torchrun_env

pytestmark = pytest.mark.dist

METRICS = r"""
import torch
torch.set_num_threads(1)
import torchmetrics
import nbdist as nd

strategy = nd.MultiWorkerMirroredStrategy()
data = torch.Generator().manual_seed(0)
logits = torch.randn(50, 4, generator=data)
labels = torch.randint(0, 4, (50,), generator=data)
batches = [(logits[i : i + 16], labels[i : i + 16]) for i in range(0, 50, 16)]  # 16,16,16,2
with strategy.scope():
    accuracy = torchmetrics.classification.MulticlassAccuracy(num_classes=4, average="micro")
    mean_loss = torchmetrics.MeanMetric()
    devices = strategy.extended.worker_devices
    per_replica = strategy.experimental_distribute_values_from_function(
        lambda ctx: torchmetrics.MeanMetric().to(devices[ctx.replica_id_in_sync_group % len(devices)]))
seen = []


def step(per_replica, batch):
    x, y = batch
    seen.append(len(y))
    if len(y):
        accuracy.update(x, y)
        losses = torch.nn.functional.cross_entropy(x, y, reduction="none")
        mean_loss.update(losses)
        per_replica.update(losses)


for batch in strategy.experimental_distribute_dataset(batches):
    strategy.run(step, args=(per_replica, batch))
local = list(strategy.experimental_local_results(per_replica))
merged = local[0].clone()
for other in local[1:]:
    merged.merge_state(other)
report({
    "seen": seen,
    "accuracy": accuracy.compute().item(),
    "mean_loss": mean_loss.compute().item(),
    "per_replica": merged.compute().item(),
    "one_device_accuracy": (logits.argmax(1) == labels).float().mean().item(),
    "one_device_loss": torch.nn.functional.cross_entropy(logits, labels).item(),
})
strategy.shutdown()
"""


def test_torchmetrics_agree_across_workers_and_equal_one_device():
    port = free_port()
    results = run_workers(METRICS, [torchrun_env(rank, 2, port) for rank in range(2)], timeout=90)
    assert_all_ok(results)
    outs = [result.result for result in results]
    assert [out["seen"] for out in outs] == [[8, 8, 8, 1], [8, 8, 8, 1]]  # each a share
    for out in outs:
        assert out["accuracy"] == out["one_device_accuracy"]
        assert abs(out["mean_loss"] - out["one_device_loss"]) < 1e-6
        assert abs(out["per_replica"] - out["one_device_loss"]) < 1e-6
    assert outs[0]["accuracy"] == outs[1]["accuracy"]
    assert outs[0]["mean_loss"] == outs[1]["mean_loss"]
