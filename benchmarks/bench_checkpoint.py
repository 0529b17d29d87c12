"""Cost of nd.checkpoint.save / restore against an atomic torch.save / torch.load of the same state.

`MirroredStrategy(["cpu:0", "cpu:1"])`; a model made in `scope()` (an MLP of 4 `Linear` layers,
~4.2 M float32 parameters, ~17 MB; or `--width`), Adam stepped once (two state tensors per
parameter, so ~50 MB in all) and a distributed iterator one step in.

- save: `nd.checkpoint.save(path, model=, optimizer=, iterator=)` vs the anchor: the same
  states (`model.state_dict()`, `optimizer.state_dict()`, the iterator's position) written
  with `torch.save` to a temporary file in the same directory, flushed (`fsync`) and renamed
  over the target, which is what a careful hand-written save does. A plain `torch.save` to
  the target (no fsync, not atomic) is timed too, for information.
- restore: `nd.checkpoint.restore(path, model=, optimizer=)` vs the anchor:
  `torch.load(path, weights_only=True)` then `model.load_state_dict` and
  `optimizer.load_state_dict`.

Variants alternate trial by trial (order reversed every other trial); one call per trial.
Target (ours: the checks and the one writer must cost little next to the disk): save and
restore each <= 1.2x the anchor.

Run: `python benchmarks/bench_checkpoint.py [--quick] [--threads N] [--width N]`.
"""

from __future__ import annotations

import os
import tempfile

import torch
from _common import (
    benchmark_parser,
    check,
    finish,
    interleaved,
    median,
    paired_ratios,
    parse_in_process_args,
    ratio_table,
    summarize,
    summary_row,
    table,
)

import nbdist as nd

NAME = "checkpoint"
TARGET = 1.2


def atomic_torch_save(state: dict, path: str) -> None:
    """The anchor: torch.save to a temporary file, fsync, os.replace."""
    folder = os.path.dirname(path)
    handle, temporary = tempfile.mkstemp(dir=folder, prefix=".anchor.", suffix=".tmp")
    with os.fdopen(handle, "wb") as file:
        torch.save(state, file)
        file.flush()
        os.fsync(file.fileno())
    os.replace(temporary, path)


def main(argv: list[str] | None = None) -> int:
    parser = benchmark_parser(__doc__)
    parser.add_argument("--trials", type=int, default=31, help="trials per variant")
    parser.add_argument("--width", type=int, default=1024, help="hidden width of the MLP")
    args, env = parse_in_process_args(parser, argv, quick={"trials": 3, "width": 256})

    strategy = nd.MirroredStrategy(["cpu:0", "cpu:1"])
    width = args.width
    with strategy.scope():
        model = torch.nn.Sequential(
            torch.nn.Linear(width, width), torch.nn.ReLU(), torch.nn.Linear(width, width),
            torch.nn.ReLU(), torch.nn.Linear(width, width), torch.nn.ReLU(),
            torch.nn.Linear(width, width),
        )  # fmt: skip
        optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    batches = [(torch.randn(8, width), torch.randn(8, width)) for _ in range(3)]
    iterator = iter(strategy.experimental_distribute_dataset(batches))

    def step(batch):
        x, y = batch
        loss = torch.nn.functional.mse_loss(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()

    strategy.run(step, args=(next(iterator),))
    parameters = sum(p.numel() for p in model.parameters())

    folder = tempfile.mkdtemp(prefix="nbdist-bench-ckpt-")
    ours, anchor, plain = (os.path.join(folder, n) for n in ("nd.pt", "anchor.pt", "plain.pt"))

    def anchor_state() -> dict:
        return {
            "model": model.state_dict(),
            "optimizer": optimizer.state_dict(),
            "iterator": iterator.state_dict(),
        }

    saves = interleaved(
        {
            "nd.checkpoint.save": lambda: nd.checkpoint.save(
                ours, model=model, optimizer=optimizer, iterator=iterator
            ),
            "atomic torch.save (anchor)": lambda: atomic_torch_save(anchor_state(), anchor),
            "plain torch.save (info)": lambda: torch.save(anchor_state(), plain),
        },
        trials=args.trials,
        inner=1,
        warmup=1,
    )
    size = os.path.getsize(ours)

    def anchor_restore() -> None:
        state = torch.load(anchor, map_location="cpu", weights_only=True)
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])

    restores = interleaved(
        {
            "nd.checkpoint.restore": lambda: nd.checkpoint.restore(
                ours, model=model, optimizer=optimizer
            ),
            "torch.load + load_state_dict (anchor)": anchor_restore,
        },
        trials=args.trials,
        inner=1,
        warmup=1,
    )
    for path in (ours, anchor, plain):
        os.unlink(path)
    os.rmdir(folder)

    save_a, save_b = saves["nd.checkpoint.save"], saves["atomic torch.save (anchor)"]
    restore_a, restore_b = (
        restores["nd.checkpoint.restore"],
        restores["torch.load + load_state_dict (anchor)"],
    )
    save_ratio, save_paired = median(save_a) / median(save_b), median(paired_ratios(save_a, save_b))
    restore_ratio = median(restore_a) / median(restore_b)
    restore_paired = median(paired_ratios(restore_a, restore_b))

    print(f"== {NAME}: MLP width {width}, {parameters:,} parameters, Adam, 2 replicas")
    print(
        f"file {size / 2**20:.1f} MiB, {args.trials} trials, torch threads "
        f"{env['torch_num_threads']}, load {env['loadavg_at_start']}"
    )
    stats = {name: summarize(samples) for name, samples in {**saves, **restores}.items()}
    print(table(["variant", "median", "IQR", "min"], [summary_row(n, s) for n, s in stats.items()]))
    print()
    print(
        ratio_table(
            [
                ["save / atomic torch.save", save_ratio, save_paired],
                ["restore / torch.load + load_state_dict", restore_ratio, restore_paired],
            ]
        )
    )
    print()
    checks = [
        check("save / atomic torch.save", save_ratio, "<=", TARGET, cross_check=save_paired),
        check(
            "restore / torch.load + load_state_dict",
            restore_ratio,
            "<=",
            TARGET,
            cross_check=restore_paired,
        ),
    ]
    return finish(
        NAME,
        checks,
        {
            "description": "nd.checkpoint save/restore vs atomic torch.save / torch.load",
            "parameters": {"width": width, "trials": args.trials, "model_parameters": parameters},
            "file_bytes": size,
            "environment": env,
            "stats": stats,
            "ratios": {
                "save": {"ratio_of_medians": save_ratio, "paired_median": save_paired},
                "restore": {"ratio_of_medians": restore_ratio, "paired_median": restore_paired},
            },
        },
    )


if __name__ == "__main__":
    raise SystemExit(main())
