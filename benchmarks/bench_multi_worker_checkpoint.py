"""2 workers: nd.checkpoint.save / restore vs a DDP-style save on rank 0 plus a barrier.

Setup: 2 worker processes (torchrun variables, `nd.MultiWorkerMirroredStrategy()`, one CPU
replica and one torch thread each); an MLP of four `Linear(1024, 1024)` made in `scope()`
(~4.2 M parameters), Adam stepped once (48 MiB file). Variants, interleaved block by block
in the same processes and group, one call per block:

- save: `nd.checkpoint.save(path, model=, optimizer=)` on both workers (worker 0 writes to a
  temporary file, fsyncs, renames; then one small all-gather tells both workers the outcome)
  vs the anchor, what hand-written DDP code does: rank 0 `torch.save`s the same
  `state_dict()`s to a temporary file, fsyncs and renames it, then `dist.barrier()` on both.
- restore: `nd.checkpoint.restore(path, model=, optimizer=)` on both workers (each reads and
  checks the file, then one small all-gather agrees on the outcome before anything is loaded)
  vs `torch.load(weights_only=True)` + `load_state_dict` on each worker (no collective at all,
  so an error on one worker would leave the workers with different states).

Targets (ours): save <= 1.2x the anchor; restore at most 10 ms slower than its anchor (the
agreement is one checked collective, a few ms on a loaded 2-core machine, whatever the size).

Run: `python benchmarks/bench_multi_worker_checkpoint.py [--quick]`.
"""

from __future__ import annotations

import sys
from typing import Any

from _common import check, finish, median, paired_ratios, ratio_table, summarize, table
from bench_multi_worker_common import (
    launch,
    lockstep,
    machine_line,
    parse_multi_worker_args,
    rank_summaries,
    worker_setup,
)

NAME = "multi_worker_checkpoint"
WIDTH = 1024
SAVE_TARGET, RESTORE_EXTRA_MS = 1.2, 10.0
TRIALS = 15


def worker(params: dict[str, Any]) -> dict[str, Any]:
    """One rank: time both saves and both restores; return the samples."""
    worker_setup()
    import os
    import tempfile

    import torch
    import torch.distributed as dist

    import nbdist as nd

    strategy = nd.MultiWorkerMirroredStrategy()
    rank = dist.get_rank()
    with strategy.scope():
        layers = [torch.nn.Linear(WIDTH, WIDTH) for _ in range(4)]
        model = torch.nn.Sequential(*layers)
        optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)

    def step() -> None:
        loss = model(torch.randn(8, WIDTH)).square().mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()

    strategy.run(step)
    folder = params["folder"]
    ours, anchor = os.path.join(folder, "nd.pt"), os.path.join(folder, "anchor.pt")

    def anchor_save() -> None:
        if rank == 0:
            state = {"model": model.state_dict(), "optimizer": optimizer.state_dict()}
            handle, temporary = tempfile.mkstemp(dir=folder, suffix=".tmp")
            with os.fdopen(handle, "wb") as file:
                torch.save(state, file)
                file.flush()
                os.fsync(file.fileno())
            os.replace(temporary, anchor)
        dist.barrier()

    def anchor_restore() -> None:
        state = torch.load(anchor, map_location="cpu", weights_only=True)
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])

    samples = lockstep(
        {
            "nd.checkpoint.save": lambda: nd.checkpoint.save(
                ours, model=model, optimizer=optimizer
            ),
            "rank 0 atomic torch.save + barrier (anchor)": anchor_save,
        },
        trials=params["trials"],
        inner=1,
        barrier=dist.barrier,
    )
    samples.update(
        lockstep(
            {
                "nd.checkpoint.restore": lambda: nd.checkpoint.restore(
                    ours, model=model, optimizer=optimizer
                ),
                "torch.load + load_state_dict (anchor)": anchor_restore,
            },
            trials=params["trials"],
            inner=1,
            barrier=dist.barrier,
        )
    )
    size = os.path.getsize(ours)
    strategy.shutdown()
    return {"samples": samples, "file_bytes": size}


def main(argv: list[str] | None = None) -> int:
    import tempfile

    args, env = parse_multi_worker_args(
        __doc__, argv, timeout=240.0, timeout_help="seconds for the workers"
    )
    trials = 3 if args.quick else TRIALS
    with tempfile.TemporaryDirectory(prefix="nbdist-bench-ckpt-") as folder:
        ranks = launch(
            "bench_multi_worker_checkpoint",
            {"trials": trials, "folder": folder},
            timeout=args.timeout,
        )
    samples = ranks[0]["samples"]
    save_a, save_b = (
        samples["nd.checkpoint.save"],
        samples["rank 0 atomic torch.save + barrier (anchor)"],
    )
    rest_a, rest_b = (
        samples["nd.checkpoint.restore"],
        samples["torch.load + load_state_dict (anchor)"],
    )
    save_ratio, save_paired = median(save_a) / median(save_b), median(paired_ratios(save_a, save_b))
    rest_ratio, rest_paired = median(rest_a) / median(rest_b), median(paired_ratios(rest_a, rest_b))

    print(f"== {NAME}: 2 gloo workers, MLP 4 x Linear({WIDTH}, {WIDTH}) with Adam state")
    print(machine_line(env, f", trials {trials}, file {ranks[0]['file_bytes'] / 2**20:.1f} MiB"))
    rows = [
        [name, f"{summarize(s)['median_s'] * 1e3:.2f} ms", f"{min(s) * 1e3:.2f} ms"]
        for name, s in samples.items()
    ]
    print(table(["variant (rank 0)", "median", "min"], rows))
    print()
    print(
        ratio_table(
            [
                ["save / (rank 0 atomic torch.save + barrier)", save_ratio, save_paired],
                ["restore / (torch.load + load_state_dict)", rest_ratio, rest_paired],
            ]
        )
    )
    print()
    extra_ms = (median(rest_a) - median(rest_b)) * 1e3
    extra_paired_ms = median([(a - b) * 1e3 for a, b in zip(rest_a, rest_b)])
    print(f"restore - anchor: {extra_ms:.2f} ms (paired median {extra_paired_ms:.2f} ms)\n")
    checks = [
        check("2 workers: save / DDP-style save", save_ratio, "<=", SAVE_TARGET,
              cross_check=save_paired),
        check("2 workers: restore - (torch.load + load_state_dict)", extra_ms, "<=",
              RESTORE_EXTRA_MS, unit=" ms", cross_check=extra_paired_ms),
    ]  # fmt: skip
    return finish(
        NAME,
        checks,
        {
            "description": "2 workers: nd.checkpoint save/restore vs DDP-style save and load",
            "environment": env,
            "parameters": {"width": WIDTH, "workers": 2, "trials": trials},
            "file_bytes": ranks[0]["file_bytes"],
            "variants": rank_summaries(samples),
            "rank1_variants": rank_summaries(ranks[1]["samples"]),
            "ratios": {
                "save": {"ratio_of_medians": save_ratio, "paired_median": save_paired},
                "restore": {
                    "ratio_of_medians": rest_ratio,
                    "paired_median": rest_paired,
                    "extra_ms": extra_ms,
                    "extra_paired_ms": extra_paired_ms,
                },
            },
        },
    )


if __name__ == "__main__":
    sys.exit(main())
