"""Worker script of tests/dist/test_torchmetrics_workers.py (`METRICS`)."""

import torch

from tests.dist.workers._prelude import start

if "report" not in globals():  # run_workers predefines it (a test may pass its own)
    from nbdist.testing import report


if __name__ == "__main__":
    import torchmetrics


    strategy, _ = start()
    data = torch.Generator().manual_seed(0)
    logits = torch.randn(50, 4, generator=data)
    labels = torch.randint(0, 4, (50,), generator=data)
    batches = [(logits[i : i + 16], labels[i : i + 16]) for i in range(0, 50, 16)]  # 16,16,16,2
    with strategy.scope():
        accuracy = torchmetrics.classification.MulticlassAccuracy(num_classes=4, average="micro")
        mean_loss = torchmetrics.MeanMetric()
        devices = strategy.extended.worker_devices
        per_replica = strategy.experimental_distribute_values_from_function(
            lambda ctx: torchmetrics.MeanMetric().to(
                devices[ctx.replica_id_in_sync_group % len(devices)]
            )
        )
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
