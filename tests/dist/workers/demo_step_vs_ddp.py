"""Worker script of tests/dist/test_demo_step_vs_ddp.py.

Trains the demo's CNN (`nbdist.app.training`: built in `strategy.scope()`, Adam) with the
demo's own step and distributed iterator for two epochs, and alongside it a hand-written
`DistributedDataParallel` copy of the same model on exactly the batches each worker's replica
received. Reports both models' parameters, the telemetry's gradient records and the
collective recorder's entries. Run in each worker process by `nbdist.testing.run_workers` as
`__main__`; importing it runs nothing."""

import torch

if "report" not in globals():  # run_workers predefines it (a test may pass its own)
    from nbdist.testing import report


if __name__ == "__main__":
    torch.set_num_threads(1)
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    import nbdist as nd
    from nbdist.app import training

    EPOCHS = 2
    strategy = nd.MultiWorkerMirroredStrategy()
    sizes = training.setup(strategy, seed=0)
    model = training.trained_model()
    twin = training.build_model()
    twin.load_state_dict(model.state_dict())  # the weights worker 0 broadcast
    ddp = DistributedDataParallel(twin)
    ddp_opt = torch.optim.Adam(ddp.parameters(), lr=training.LEARNING_RATE)
    size = dist.get_world_size()
    steps, rows = 0, []
    for item in training.epochs_with_reports(EPOCHS):
        (x, y), _ = item
        strategy.run(training.train_and_report, args=(item,))
        losses = torch.nn.functional.cross_entropy(ddp(x), y, reduction="none")
        loss = losses.sum() * size / training.GLOBAL_BATCH_SIZE
        ddp_opt.zero_grad()
        loss.backward()
        ddp_opt.step()
        steps += 1
        rows.append(len(y))
    records = strategy.extended.telemetry.records()
    report({
        "steps": steps,
        "steps_per_epoch": sizes["steps_per_epoch"],
        "rows": rows,
        "nbdist": [p.detach().tolist() for p in model.parameters()],
        "ddp": [p.detach().tolist() for p in ddp.module.parameters()],
        "gradient_records": [(r.op, r.nbytes) for r in records if r.op == "gradient_sync"],
        "recorded": [e["op"] for e in strategy.process_group.recorder.entries()],
        "parameter_bytes": sum(p.numel() * p.element_size() for p in model.parameters()),
    })
    strategy.shutdown()
