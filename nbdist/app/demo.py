"""`nbdist demo`: data-parallel training of a small classifier, and its dashboard picture.

Trains an MLP (64-128-10) on the digits images bundled with nbdist (1,797 8×8 images, no
download) with a `MirroredStrategy` over two logical CPU replicas by default, shows a progress
bar, prints the test accuracy per epoch and at the end, and saves a three-panel picture:
training loss per step, test accuracy per epoch, and the timing of every collective taken from
`strategy.extended.telemetry` (how long each took and how long each replica waited for the
others).

`examples/train_digits.py` spells out the same training loop as a script to read; this module
is what `python -m nbdist demo` runs, and it owns the pieces both share: the data, the
strategy, the command-line options and the picture. Front-end layer: imports matplotlib,
tqdm and the digits data bundled in `nbdist.app.data` (no scikit-learn needed).

Example:
    >>> from nbdist.app import demo
    >>> result = demo.train(epochs=1, out=None, progress=False)  # doctest: +SKIP
    >>> result["accuracy"] > 0.8  # doctest: +SKIP
    True
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NamedTuple, TextIO

import torch

import nbdist as nd
from nbdist.app.arguments import positive_int
from nbdist.app.interrupts import raise_if_interrupted
from nbdist.app.run_figure import plot_dashboard, summarize_telemetry, telemetry_line
from nbdist.core.devices import canonical_devices
from nbdist.errors import InvalidArgumentError, NbdistError

__all__ = [
    "DEFAULT_DEVICES",
    "DEFAULT_OUT",
    "GLOBAL_BATCH_SIZE",
    "STRATEGIES",
    "Digits",
    "MissingDependencyError",
    "add_arguments",
    "build_model",
    "build_optimizer",
    "check_arguments",
    "describe",
    "load_digits_data",
    "make_strategy",
    "plot_dashboard",
    "summarize_telemetry",
    "telemetry_line",
    "train",
]

GLOBAL_BATCH_SIZE = 64
DEFAULT_DEVICES = ("cpu:0", "cpu:1")
DEFAULT_OUT = Path("artifacts") / "demo.png"
STRATEGIES = ("mirrored", "central", "one")
_DEFAULT_LR = {"sgd": 0.1, "adam": 3e-3}


class MissingDependencyError(NbdistError, ImportError):
    """An optional dependency the demo needs is not installed; the message says what to install."""


class Digits(NamedTuple):
    """The digits images split for training: features scaled to [0, 1], labels 0-9."""

    x_train: torch.Tensor
    y_train: torch.Tensor
    x_test: torch.Tensor
    y_test: torch.Tensor


# -- data, strategy, model ------------------------------------------------------------------
def load_digits_data(seed: int = 0, test_size: float = 0.2) -> Digits:
    """The digits bundled with nbdist (`nbdist.app.data`), scaled by 1/16, split 80/20.

    The split is stratified (every digit in the same proportion on both sides) and fixed by
    `seed`. Needs no scikit-learn and no download.

    Example:
        >>> data = load_digits_data()
        >>> data.x_train.shape, data.x_test.shape
        (torch.Size([1437, 64]), torch.Size([360, 64]))
    """
    from nbdist.app.data import load_digits

    return Digits(*load_digits(seed, test_size))


def make_strategy(name: str, devices: Sequence[str] | None = None) -> nd.Strategy:
    """The strategy a `--strategy` name stands for, over `devices` (default: cpu:0, cpu:1).

    `"one"` runs on the first device; `"central"` keeps the variables on the CPU (its
    default parameter device) and computes on every device.

    Example:
        >>> make_strategy("mirrored")
        MirroredStrategy(devices=['cpu:0', 'cpu:1'])
    """
    devices = tuple(devices) if devices else DEFAULT_DEVICES
    if name == "mirrored":
        return nd.MirroredStrategy(list(devices))
    if name == "central":
        return nd.CentralStorageStrategy(list(devices))
    if name == "one":
        return nd.OneDeviceStrategy(devices[0])
    raise InvalidArgumentError(f"Unknown strategy {name!r}; choose one of {', '.join(STRATEGIES)}.")


def build_model() -> torch.nn.Module:
    """The classifier: 64 pixels → 128 hidden units (ReLU) → 10 digit logits."""
    return torch.nn.Sequential(
        torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 10)
    )  # fmt: skip


def build_optimizer(name: str, parameters: Any, lr: float | None = None) -> torch.optim.Optimizer:
    """SGD with momentum 0.9 (lr 0.1 by default) or Adam (lr 0.003 by default)."""
    lr = _DEFAULT_LR[name] if lr is None else lr
    if name == "sgd":
        return torch.optim.SGD(parameters, lr=lr, momentum=0.9)
    if name == "adam":
        return torch.optim.Adam(parameters, lr=lr)
    raise InvalidArgumentError(f"Unknown optimizer {name!r}; choose sgd or adam.")


def describe(strategy: nd.Strategy) -> str:
    """`MirroredStrategy on cpu:0, cpu:1 (2 replicas)`; long device lists are elided."""
    names = strategy.extended.worker_devices
    devices = ", ".join(names if len(names) <= 4 else (*names[:2], "…", names[-1]))
    count = strategy.num_replicas_in_sync
    return f"{type(strategy).__name__} on {devices} ({count} replica{'s' * (count != 1)})"


# -- command-line options -------------------------------------------------------------------
def _devices_arg(text: str) -> tuple[str, ...]:
    names = [part.strip() for part in text.split(",") if part.strip()]
    try:
        return canonical_devices(names)
    except (ValueError, TypeError) as error:
        raise argparse.ArgumentTypeError(str(error)) from None




def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be positive, got {text}")
    return value


def add_arguments(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Add the demo's options to `parser` (shared by `nbdist demo` and the example script)."""
    parser.add_argument(
        "--strategy", choices=STRATEGIES, default="mirrored",
        help="mirrored: a copy of the model per device; central: one copy on the CPU, "
        "computed on every device; one: a single device (default: %(default)s)",
    )  # fmt: skip
    parser.add_argument(
        "--devices", type=_devices_arg, default=None, metavar="DEV[,DEV...]",
        help="comma-separated devices, e.g. cpu:0,cpu:1 (logical CPU replicas) or cuda:0,cuda:1 "
        f"(default: {','.join(DEFAULT_DEVICES)}; the first of them for --strategy one)",
    )  # fmt: skip
    parser.add_argument(
        "--epochs", type=positive_int, default=8, help="passes over the training set "
        "(default: %(default)s)",
    )  # fmt: skip
    parser.add_argument(
        "--optimizer", choices=("sgd", "adam"), default="sgd",
        help="SGD with momentum 0.9, or Adam (default: %(default)s)",
    )  # fmt: skip
    parser.add_argument(
        "--lr", type=_positive_float, default=None,
        help="learning rate (default: 0.1 for sgd, 0.003 for adam)",
    )  # fmt: skip
    parser.add_argument(
        "--seed", type=int, default=0, help="seed of the split, the initial weights and the "
        "shuffling (default: %(default)s)",
    )  # fmt: skip
    parser.add_argument(
        "--out", type=Path, default=DEFAULT_OUT, metavar="PATH",
        help="where to write the dashboard picture (default: %(default)s)",
    )  # fmt: skip
    parser.add_argument(
        "--no-progress", dest="progress", action="store_false",
        help="do not show the progress bar",
    )  # fmt: skip
    return parser


def check_arguments(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Reject option combinations argparse cannot check alone (exits 2 via `parser.error`)."""
    if args.strategy == "one" and args.devices is not None and len(args.devices) != 1:
        parser.error(
            f"--strategy one runs on one device, got {len(args.devices)}: "
            f"{','.join(args.devices)}. Pass one device, or use --strategy mirrored."
        )
    if args.out is not None:
        from matplotlib.figure import Figure

        formats = Figure().canvas.get_supported_filetypes()
        suffix = args.out.suffix.lstrip(".").lower()
        if suffix not in formats:
            parser.error(
                f"--out {str(args.out)!r}: cannot tell the picture format from the extension "
                f"{args.out.suffix or '(none)'!r}; use .png (or one of "
                f"{', '.join('.' + f for f in sorted(formats))})."
            )


# -- training -------------------------------------------------------------------------------
def train(
    *,
    strategy: str = "mirrored",
    devices: Sequence[str] | None = None,
    epochs: int = 8,
    optimizer: str = "sgd",
    lr: float | None = None,
    seed: int = 0,
    out: str | Path | None = DEFAULT_OUT,
    progress: bool = True,
    stdout: TextIO | None = None,
) -> dict[str, Any]:
    """Train the digits classifier with a strategy, print progress and save the dashboard.

    The caller's random number generator state is left as it was.

    Args:
        strategy: `"mirrored"`, `"central"` or `"one"` (see `make_strategy`).
        devices: Devices of the strategy (default: cpu:0, cpu:1).
        epochs: Passes over the training set.
        optimizer: `"sgd"` (momentum 0.9) or `"adam"`.
        lr: Learning rate (None: 0.1 for SGD, 0.003 for Adam).
        seed: Seed of the split, the initial weights and the shuffling.
        out: Where to save the dashboard picture; None saves none.
        progress: Show a progress bar (on stderr).
        stdout: Where to print the per-epoch and final lines (default: `sys.stdout`).

    Returns:
        A dict with `accuracy` (final test accuracy), `epoch_losses`, `epoch_accuracies`,
        `step_losses`, `steps`, `seconds` (training and evaluation, not the picture),
        `telemetry` (see `summarize_telemetry`), `strategy`, `devices` and `out`.

    Raises:
        MissingDependencyError: an optional dependency is missing.
        ValueError: a device that does not exist, or `epochs` < 1.
    """
    from tqdm.auto import tqdm

    if not isinstance(epochs, int) or epochs < 1:
        raise InvalidArgumentError(
            f"epochs must be a whole number of at least 1, got {epochs!r}; e.g. epochs=3."
        )
    stdout = stdout or sys.stdout
    data = load_digits_data(seed)
    dist = make_strategy(strategy, devices)
    replicas = dist.num_replicas_in_sync

    # On a terminal, lines go through tqdm so the bar is redrawn below them; elsewhere (CI
    # logs, pipes) they are printed as they are, so the bar is not re-rendered for each one.
    redraw = progress and sys.stderr.isatty()

    def say(line: str) -> None:
        if redraw:
            tqdm.write(line, file=stdout)
        else:
            print(line, file=stdout)
        stdout.flush()

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        with dist.scope():
            model = build_model()
            opt = build_optimizer(optimizer, model.parameters(), lr)

        loader = torch.utils.data.DataLoader(
            torch.utils.data.TensorDataset(data.x_train, data.y_train),
            batch_size=GLOBAL_BATCH_SIZE, shuffle=True,
            generator=torch.Generator().manual_seed(seed),
        )  # fmt: skip
        dataset = dist.experimental_distribute_dataset(loader)

        def train_step(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
            losses = torch.nn.functional.cross_entropy(model(x), y, reduction="none")
            # Sum over this replica's slice divided by the per-replica share of the global
            # batch: nbdist averages gradients over replicas, so the step follows the mean
            # loss of the global batch (TF's compute_average_loss), and a replica whose slice
            # is empty contributes zero rather than NaN.
            loss = losses.sum() * replicas / GLOBAL_BATCH_SIZE
            opt.zero_grad()
            loss.backward()
            opt.step()
            return losses.detach()

        def evaluate() -> tuple[float, int]:
            device = next(model.parameters()).device
            with dist.scope(), torch.no_grad():  # cross-replica context: one model
                logits = model(data.x_test.to(device))
            correct = int((logits.argmax(dim=1).cpu() == data.y_test).sum())
            return correct / len(data.y_test), correct

        say(
            f"nbdist demo: MLP 64-128-10 on the digits "
            f"({len(data.x_train)} training / {len(data.x_test)} test images)"
        )
        say(
            f"strategy: {describe(dist)}, global batch {GLOBAL_BATCH_SIZE} "
            f"({_per_replica(replicas)} per replica), {_describe_optimizer(opt)}, "
            f"{epochs} epoch{'s' * (epochs != 1)}"
        )
        step_losses: list[float] = []
        epoch_losses: list[float] = []
        epoch_accuracies: list[float] = []
        correct = 0
        started = time.perf_counter()
        bar = tqdm(
            total=epochs * len(dataset), desc="training", unit="step", file=sys.stderr,
            mininterval=1.0, dynamic_ncols=True, disable=not progress,
        )  # fmt: skip
        try:
            for epoch in range(1, epochs + 1):
                total, count = 0.0, 0
                for x, y in dataset:
                    raise_if_interrupted()  # a Ctrl-C a finalizer swallowed still stops it
                    losses = dist.run(train_step, args=(x, y))
                    batch_sum = float(dist.reduce("sum", losses, axis=0))
                    batch_count = sum(len(c) for c in dist.experimental_local_results(y))
                    step_losses.append(batch_sum / batch_count)
                    total, count = total + batch_sum, count + batch_count
                    bar.update()
                    bar.set_postfix(loss=f"{step_losses[-1]:.3f}", refresh=False)
                accuracy, correct = evaluate()
                epoch_losses.append(total / count)
                epoch_accuracies.append(accuracy)
                say(
                    f"epoch {epoch:>{len(str(epochs))}}/{epochs}  loss {total / count:.4f}  "
                    f"test accuracy {accuracy:.2%}"
                )
        finally:
            bar.close()
        seconds = time.perf_counter() - started

    records = dist.extended.telemetry.records()
    summary = summarize_telemetry(records)
    steps = len(step_losses)
    say(
        f"final test accuracy: {epoch_accuracies[-1]:.2%} ({correct}/{len(data.y_test)}) "
        f"after {epochs} epoch{'s' * (epochs != 1)}, {steps} steps, {seconds:.1f} s"
    )
    line = telemetry_line(summary)
    if line:
        say(line)
    result: dict[str, Any] = {
        "accuracy": epoch_accuracies[-1],
        "epoch_losses": epoch_losses,
        "epoch_accuracies": epoch_accuracies,
        "step_losses": step_losses,
        "steps": steps,
        "seconds": seconds,
        "telemetry": summary,
        "strategy": type(dist).__name__,
        "devices": list(dist.extended.worker_devices),
        "out": None,
    }
    if out is not None:
        title = (
            f"nbdist demo — {describe(dist)}: test accuracy {epoch_accuracies[-1]:.1%} "
            f"after {epochs} epoch{'s' * (epochs != 1)} ({seconds:.1f} s)"
        )
        path = plot_dashboard(
            step_losses, epoch_accuracies, records, out, title=title, start=started,
            steps_per_epoch=len(dataset),
        )  # fmt: skip
        result["out"] = str(path)
        say(f"dashboard: {path}")
    return result


def _per_replica(replicas: int) -> str:
    share = GLOBAL_BATCH_SIZE / replicas
    return f"{share:g}" if share == int(share) else f"~{share:.1f}"


def _describe_optimizer(opt: torch.optim.Optimizer) -> str:
    group = opt.param_groups[0]
    if isinstance(opt, torch.optim.SGD):
        return f"SGD (lr {group['lr']:g}, momentum {group['momentum']:g})"
    return f"{type(opt).__name__} (lr {group['lr']:g})"


# -- telemetry --------------------------------------------------------------------------------
