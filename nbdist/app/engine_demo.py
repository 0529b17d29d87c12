"""`nbdist demo` on engines: start them, train the CNN with their strategy, report, stop them.

`run_demo` starts `engines` ipyparallel engines with `nd.Cluster` (one per GPU when there are
GPUs, else CPU engines), builds the model on each in its `MultiWorkerMirroredStrategy`'s scope,
drives the epochs from here with `cluster.strategy.run_steps` (a few steps per round trip, one
progress bar), evaluates after every epoch, checks that every replica ends with the same
parameters, and writes `metrics.json` and `dashboard.png` (the dashboard's views: placement,
reductions, training, engines) into `out`. The engines are stopped on the way out, whatever
happened (Ctrl-C and errors included).

Example:
    >>> from nbdist.app.engine_demo import run_demo
    >>> metrics = run_demo(engines=2, epochs=1, out="demo-out", progress=False)  # doctest: +SKIP
    >>> metrics["accuracy"] > 0.8  # doctest: +SKIP
    True
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any, TextIO

from nbdist.app import training
from nbdist.app.interrupts import raise_if_interrupted
from nbdist.errors import NbdistError

__all__ = ["DemoError", "check_out_dir", "run_demo"]

_CALL_TIMEOUT_S = 300
_STEPS_PER_CALL = 64  # steps per round trip at most: one call per epoch of the digits


class DemoError(NbdistError, RuntimeError):
    """The demo cannot run as asked; the message names the problem and the fix."""


def check_out_dir(out: str | os.PathLike[str]) -> Path:
    """Create `out` if needed and make sure a file can be written in it, before any engine starts.

    Raises:
        DemoError: `out` is a file, or the folder cannot be created or written.

    Example:
        >>> import tempfile
        >>> check_out_dir(tempfile.mkdtemp()).is_dir()
        True
    """
    path = Path(out)
    if path.exists() and not path.is_dir():
        raise DemoError(f"--out {str(path)!r} is a file, not a folder; pass a folder.")
    try:
        path.mkdir(parents=True, exist_ok=True)
        probe = path / ".nbdist-write-test"
        probe.write_text("")
        probe.unlink()
    except OSError as error:
        raise DemoError(
            f"cannot write into --out {str(path)!r} ({error.strerror or error}); "
            "pass a folder you can write to, e.g. --out ./nbdist-demo"
        ) from None
    return path


def run_demo(
    engines: int = 2,
    epochs: int = 6,
    out: str | os.PathLike[str] = "nbdist-demo",
    *,
    seed: int = 0,
    progress: bool = True,
    stdout: TextIO | None = None,
) -> dict[str, Any]:
    """Train the digits CNN on `engines` engines; return the metrics (also in metrics.json)."""
    import nbdist as nd

    stdout = stdout or sys.stdout
    folder = check_out_dir(out)

    def say(line: str) -> None:
        print(line, file=stdout, flush=True)

    begin = time.perf_counter()
    say(f"nbdist demo: starting {engines} engine(s)…")
    cluster = nd.Cluster(n=engines)
    timings: dict[str, float] = {}
    try:
        cluster.start()
        raise_if_interrupted()
        timings["start"] = time.perf_counter() - begin
        say(f"{engines} engines joined one process group ({_backend(cluster)}) "
            f"in {timings['start']:.1f} s")  # fmt: skip
        metrics = _train(cluster, epochs, seed, progress, say, timings)
        metrics["bytes_held"] = _picture(folder / "dashboard.png", cluster)
        metrics["dashboard"] = str((folder / "dashboard.png").resolve())
    finally:
        stopping = time.perf_counter()
        cluster.stop()
        timings["stop"] = time.perf_counter() - stopping
    timings["total"] = time.perf_counter() - begin
    metrics["timings"] = timings
    metrics["out"] = str(folder.resolve())
    (folder / "metrics.json").write_text(json.dumps(metrics, indent=2))
    say(
        f"timings: start {timings['start']:.1f} s, first step {timings['first_step']:.2f} s, "
        f"training {timings['training']:.1f} s, stop {timings['stop']:.1f} s, "
        f"total {timings['total']:.1f} s"
    )
    say(f"engines stopped; metrics and dashboard written to {folder.resolve()}")
    return metrics


def _backend(cluster: Any) -> str:
    devices = sorted({info.device for info in cluster.engines})
    return f"devices {', '.join(devices)}"


def _on_engines(cluster: Any, code: str) -> None:
    view = cluster.client[[info.id for info in cluster.engines]]
    view.execute(code, block=False).get(timeout=_CALL_TIMEOUT_S)


def _train(cluster, epochs, seed, progress, say, timings) -> dict[str, Any]:
    from tqdm.auto import tqdm

    strategy = cluster.strategy
    first = cluster.client[cluster.engines[0].id]
    _on_engines(cluster, "import nbdist.app.training as _nbdist_demo\n"
                f"_nbdist_demo_sizes = _nbdist_demo.setup(strategy, seed={int(seed)})\n"
                "digits_cnn = _nbdist_demo.trained_model()")  # fmt: skip
    sizes = strategy.experimental_local_results(cluster.pull("_nbdist_demo_sizes"))[0]
    steps = sizes["steps_per_epoch"]
    say(f"training a CNN on the digits ({sizes['train']} training / {sizes['test']} test "
        f"images), global batch {training.GLOBAL_BATCH_SIZE}, {epochs} epoch(s) × {steps} "
        "steps, with the engines' MultiWorkerMirroredStrategy")  # fmt: skip
    epoch_losses: list[float] = []
    epoch_accuracies: list[float] = []
    bar = tqdm(total=epochs * steps, desc="training", unit="step", file=sys.stderr,
               disable=not progress, dynamic_ncols=True)  # fmt: skip
    # One round trip per epoch (two for the first, whose first step is timed alone): the
    # engines walk one iterator over every epoch, and each epoch's last step returns the test
    # score and the epoch's loss instead of the step's totals.
    _on_engines(cluster, f"_nbdist_demo_it = _nbdist_demo.epochs_with_reports({int(epochs)})")
    started = time.perf_counter()
    try:
        for epoch in range(1, epochs + 1):
            done, last = 0, None
            while done < steps:
                raise_if_interrupted()  # a Ctrl-C a finalizer swallowed (app.interrupts)
                k = 1 if "first_step" not in timings else min(_STEPS_PER_CALL, steps - done)
                last = strategy.run_steps(training.train_and_report, "_nbdist_demo_it", steps=k)
                timings.setdefault("first_step", time.perf_counter() - started)
                done += k
                bar.update(k)
            reports = strategy.experimental_local_results(last)
            correct, count = (sum(float(r[i]) for r in reports) for i in (0, 1))
            accuracy = correct / count
            epoch_losses.append(float(reports[0][2]))  # the same on every replica
            epoch_accuracies.append(accuracy)
            line = (f"epoch {epoch:>{len(str(epochs))}}/{epochs}  loss {epoch_losses[-1]:.4f}  "
                    f"test accuracy {accuracy:.2%}")  # fmt: skip
            if progress:
                bar.write(line, file=sys.stdout)
            else:
                say(line)
    finally:
        bar.close()
    timings["training"] = time.perf_counter() - started
    raise_if_interrupted()
    checksums = [float(c) for c in
                 strategy.experimental_local_results(strategy.run(training.parameter_checksum))]
    identical = len(set(checksums)) == 1
    say(f"final test accuracy {epoch_accuracies[-1]:.2%}; replicas identical: {identical}")
    return {
        "engines": cluster.num_engines,
        "epochs": epochs,
        "steps": epochs * steps,
        "accuracy": epoch_accuracies[-1],
        "epoch_losses": epoch_losses,
        "epoch_accuracies": epoch_accuracies,
        "step_losses": first.apply_sync(training.step_losses),
        "replicas_identical": identical,
        "parameter_checksums": checksums,
        "steps_per_epoch": steps,
    }


def _picture(path: Path, cluster: Any) -> dict[int, int]:
    """The dashboard's four views (placement, reductions, training, engines) as one PNG; returns
    the bytes of parameters and buffers each replica holds, as the placement view shows them."""
    from nbdist.widgets.dashboard import Dashboard

    board = Dashboard(cluster, live=False)
    try:
        data = board.refresh()
        board.save(path)
    finally:
        board.close()
    return {int(r): sum(item["bytes"] for item in items) for r, items in data.holdings.items()}
