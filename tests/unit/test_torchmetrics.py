"""torchmetrics under the in-process strategies (docs/metrics.md): one metric per replica,
updated inside `strategy.run` on the replica's share of each global batch, merged with
torchmetrics' `merge_state`, equals the one-device value, however the batches were split.

tests/dist/test_torchmetrics_workers.py covers several processes (torchmetrics' own sync).
"""

from __future__ import annotations

import pytest
import torch
import torchmetrics

import nbdist as nd


def metric_per_replica(strategy, make_metric):
    devices = strategy.extended.worker_devices
    return strategy.experimental_distribute_values_from_function(
        lambda ctx: make_metric().to(devices[ctx.replica_id_in_sync_group % len(devices)])
    )


def metric_result(strategy, metrics):
    local = list(strategy.experimental_local_results(metrics))
    merged = local[0].clone()
    for other in local[1:]:
        merged.merge_state(other.clone().to(merged.device))
    return merged.compute()


STRATEGIES = {
    "default": lambda: nd.get_strategy(),
    "one_device": lambda: nd.OneDeviceStrategy("cpu"),
    "mirrored_3": lambda: nd.MirroredStrategy(["cpu:0", "cpu:1", "cpu:2"]),
    "central_storage_2": lambda: nd.CentralStorageStrategy(["cpu:0", "cpu:1"]),
    "multi_worker_single": lambda: nd.MultiWorkerMirroredStrategy(),
}


@pytest.mark.parametrize("kind", list(STRATEGIES))
# 50 rows in batches of 16: the last batch (2 rows) leaves a replica of 3 empty, by design
@pytest.mark.filterwarnings("ignore::nbdist.input.batches.EmptyReplicaBatchWarning")
def test_per_replica_metrics_equal_the_one_device_value(kind):
    strategy = STRATEGIES[kind]()
    data = torch.Generator().manual_seed(0)
    logits = torch.randn(50, 4, generator=data)
    labels = torch.randint(0, 4, (50,), generator=data)
    batches = [(logits[i : i + 16], labels[i : i + 16]) for i in range(0, 50, 16)]
    with strategy.scope():  # as TF's tutorials make their metrics
        accuracy = metric_per_replica(
            strategy,
            lambda: torchmetrics.classification.MulticlassAccuracy(num_classes=4, average="micro"),
        )
        mean_loss = metric_per_replica(strategy, torchmetrics.MeanMetric)

    def step(accuracy, mean_loss, batch):
        x, y = batch
        if len(y):
            accuracy.update(x, y)
            mean_loss.update(torch.nn.functional.cross_entropy(x, y, reduction="none"))

    for batch in strategy.experimental_distribute_dataset(batches):
        strategy.run(step, args=(accuracy, mean_loss, batch))
    assert metric_result(strategy, accuracy) == (logits.argmax(1) == labels).float().mean()
    one_device = torch.nn.functional.cross_entropy(logits, labels)
    assert torch.allclose(metric_result(strategy, mean_loss), one_device, atol=1e-6, rtol=0)
    replicas = len(strategy.extended.worker_devices)
    assert len(strategy.experimental_local_results(accuracy)) == replicas  # one each
