"""`nbdist demo`: data-parallel training of a small classifier, and its dashboard picture.

Trains an MLP (64-128-10) on scikit-learn's bundled digits images (1,797 8×8 images, no
download) with a `MirroredStrategy` over two logical CPU replicas by default, shows a progress
bar, prints the test accuracy per epoch and at the end, and saves a three-panel picture:
training loss per step, test accuracy per epoch, and the timing of every collective taken from
`strategy.extended.telemetry` (how long each took and how long each replica waited for the
others).

`examples/train_digits.py` spells out the same training loop as a script to read; this module
is what `python -m nbdist demo` runs, and it owns the pieces both share: the data, the
strategy, the command-line options and the picture. Front-end layer: imports matplotlib,
tqdm and (lazily) scikit-learn, which is an optional dependency (`pip install scikit-learn`
or the `examples` extra).

Example:
    >>> from nbdist import demo
    >>> result = demo.train(epochs=1, out=None, progress=False)  # doctest: +SKIP
    >>> result["accuracy"] > 0.8  # doctest: +SKIP
    True
"""

from __future__ import annotations

import argparse
import collections
import math
import statistics
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NamedTuple, TextIO

import torch

import nbdist as nd
from nbdist.devices import canonical_devices
from nbdist.errors import NbdistError
from nbdist.telemetry import CollectiveRecord

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
    """scikit-learn's digits (bundled with it, no download), scaled by 1/16, split 80/20.

    The split is stratified (every digit in the same proportion on both sides) and fixed by
    `seed`.

    Raises:
        MissingDependencyError: scikit-learn is not installed.

    Example:
        >>> data = load_digits_data()
        >>> data.x_train.shape, data.x_test.shape
        (torch.Size([1437, 64]), torch.Size([360, 64]))
    """
    try:
        from sklearn.datasets import load_digits
        from sklearn.model_selection import train_test_split
    except ImportError as error:
        raise MissingDependencyError(
            "The nbdist demo trains on scikit-learn's digits data set, and scikit-learn is not "
            f"installed ({error}). Install it with `pip install scikit-learn` (or "
            "`pip install 'nbdist[examples]'`)."
        ) from error
    digits = load_digits()
    x = torch.tensor(digits.data, dtype=torch.float32) / 16.0
    y = torch.tensor(digits.target, dtype=torch.int64)
    x_train, x_test, y_train, y_test = train_test_split(
        x.numpy(), y.numpy(), test_size=test_size, stratify=y.numpy(), random_state=seed
    )
    return Digits(*(torch.from_numpy(a) for a in (x_train, y_train, x_test, y_test)))


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
    raise ValueError(f"Unknown strategy {name!r}; choose one of {', '.join(STRATEGIES)}.")


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
    raise ValueError(f"Unknown optimizer {name!r}; choose sgd or adam.")


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


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


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
        "--epochs", type=_positive_int, default=8, help="passes over the training set "
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
        MissingDependencyError: scikit-learn is not installed.
        ValueError: a device that does not exist, or `epochs` < 1.
    """
    from tqdm.auto import tqdm

    if not isinstance(epochs, int) or epochs < 1:
        raise ValueError(f"epochs must be a whole number of at least 1, got {epochs!r}.")
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
            f"nbdist demo: MLP 64-128-10 on scikit-learn digits "
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
def summarize_telemetry(records: Sequence[CollectiveRecord]) -> dict[str, Any]:
    """What the collectives did, in numbers: per op and per replica.

    Returns:
        `{"collectives": n, "ops": {op: {"count", "nbytes", "implementation", "median_ms",
        "p90_ms", "max_ms", "total_s"}}, "replicas": {replica_id: {"mean_wait_ms",
        "total_wait_s", "last_to_arrive"}}}`; `last_to_arrive` counts the collectives that
        replica was the last to reach (the others waited for it).

    Example:
        >>> from nbdist.telemetry import Telemetry
        >>> t = Telemetry()
        >>> t.record("gradient_sync", 8, "local", (0, 1), 0.0, 0.002, (0.001, 0.0))
        >>> summarize_telemetry(t.records())["replicas"][1]["last_to_arrive"]
        1
    """
    ops: dict[str, list[CollectiveRecord]] = collections.defaultdict(list)
    waits: dict[int, list[float]] = collections.defaultdict(list)
    last: collections.Counter[int] = collections.Counter()
    for record in records:
        ops[record.op].append(record)
        for replica, wait in zip(record.replicas, record.waits):
            waits[replica].append(wait)
        if len(record.waits) > 1:
            last[record.replicas[min(range(len(record.waits)), key=record.waits.__getitem__)]] += 1
    by_op = {}
    for op, group in ops.items():
        durations = sorted(r.duration for r in group)
        by_op[op] = {
            "count": len(group),
            "nbytes": group[-1].nbytes,
            "implementation": ", ".join(sorted({r.implementation for r in group})),
            "median_ms": statistics.median(durations) * 1e3,
            "p90_ms": durations[int(0.9 * (len(durations) - 1))] * 1e3,
            "max_ms": durations[-1] * 1e3,
            "total_s": sum(durations),
        }
    by_replica = {
        replica: {
            "mean_wait_ms": statistics.fmean(values) * 1e3,
            "total_wait_s": sum(values),
            "last_to_arrive": last[replica],
        }
        for replica, values in sorted(waits.items())
    }
    return {"collectives": len(records), "ops": by_op, "replicas": by_replica}


def telemetry_line(summary: dict[str, Any]) -> str:
    """One line about the collectives (empty when there were none, e.g. one replica)."""
    if not summary["collectives"]:
        return ""
    parts = [
        f"{op}: {s['count']} × {_size(s['nbytes'])}, median {s['median_ms']:.2f} ms"
        for op, s in summary["ops"].items()
    ]
    replicas = summary["replicas"]
    if len(replicas) <= 4:
        waited = ", ".join(f"replica {r} {s['mean_wait_ms']:.2f} ms" for r, s in replicas.items())
    else:
        least = min(replicas, key=lambda r: replicas[r]["mean_wait_ms"])
        most = max(replicas, key=lambda r: replicas[r]["mean_wait_ms"])
        waited = (
            f"from {replicas[least]['mean_wait_ms']:.2f} ms (replica {least}) to "
            f"{replicas[most]['mean_wait_ms']:.2f} ms (replica {most})"
        )
    return "collectives: " + "; ".join(parts) + f"; mean wait per collective: {waited}"


def _size(nbytes: int) -> str:
    for unit in ("B", "KiB", "MiB"):
        if nbytes < 1024 or unit == "MiB":
            return f"{nbytes:.0f} {unit}" if unit == "B" else f"{nbytes:.1f} {unit}"
        nbytes /= 1024
    return f"{nbytes:.1f} GiB"  # pragma: no cover


# -- the picture ----------------------------------------------------------------------------
def plot_dashboard(
    step_losses: Sequence[float],
    epoch_accuracies: Sequence[float],
    records: Sequence[CollectiveRecord],
    path: str | Path,
    *,
    title: str = "nbdist training",
    start: float | None = None,
    steps_per_epoch: int | None = None,
) -> Path:
    """Save a three-panel picture of a training run and return its path.

    Panels: training loss per step (averaged over the global batch, all replicas), test
    accuracy per epoch, and each collective's duration with the time every replica waited in
    it for the others (the replica that waits least is the one the others waited for).
    Drawn on a `matplotlib.figure.Figure` with the Agg canvas, so no window opens and the
    user's pyplot state is untouched. The folder of `path` is created if needed.

    Args:
        step_losses: Mean training loss of each step.
        epoch_accuracies: Test accuracy (0-1) after each epoch.
        records: `strategy.extended.telemetry.records()`.
        path: Where to write; the extension chooses the format (`.png`, `.svg`, `.pdf`).
        title: The figure's title.
        start: `time.perf_counter()` when training began (the timeline's zero); default the
            first record's start.
        steps_per_epoch: Draws epoch boundaries on the loss panel when given.
    """
    from matplotlib.figure import Figure

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig = Figure(figsize=(12, 8.5), dpi=100, layout="constrained")
    fig.suptitle(title, fontsize=13, fontweight="bold")
    grid = fig.add_gridspec(2, 2, height_ratios=(1, 1.1))
    _plot_loss(fig.add_subplot(grid[0, 0]), step_losses, steps_per_epoch)
    _plot_accuracy(fig.add_subplot(grid[0, 1]), epoch_accuracies)
    _plot_collectives(fig.add_subplot(grid[1, :]), records, start)
    fig.savefig(path)
    return path


def _plot_loss(ax: Any, step_losses: Sequence[float], steps_per_epoch: int | None) -> None:
    from matplotlib import ticker

    steps = range(1, len(step_losses) + 1)
    ax.plot(steps, step_losses, color="tab:blue", linewidth=1.2, label="loss of each step")
    if steps_per_epoch and len(step_losses) >= 2 * steps_per_epoch:
        for boundary in range(steps_per_epoch, len(step_losses), steps_per_epoch):
            ax.axvline(boundary + 0.5, color="0.85", linewidth=0.8, zorder=0)
    ax.set_yscale("log")
    ax.yaxis.set_major_formatter(ticker.FuncFormatter(lambda value, _: f"{value:g}"))
    # Plain numbers (0.5, not 5×10⁻¹); minor ticks labelled at 2× and 5× a power of ten.
    ax.yaxis.set_minor_formatter(
        ticker.FuncFormatter(lambda value, _: f"{value:g}" if f"{value:.0e}"[0] in "25" else "")
    )
    ax.set_title("Training loss per step (global batch, reduced over replicas)")
    ax.set_xlabel("step" + (f"  ({steps_per_epoch} steps per epoch)" if steps_per_epoch else ""))
    ax.set_ylabel("cross-entropy (log scale)")
    ax.grid(True, which="major", alpha=0.3)


def _plot_accuracy(ax: Any, epoch_accuracies: Sequence[float]) -> None:
    epochs = range(1, len(epoch_accuracies) + 1)
    percent = [100 * a for a in epoch_accuracies]
    ax.plot(epochs, percent, marker="o", color="tab:green", linewidth=1.5)
    if percent:
        ax.annotate(
            f"{percent[-1]:.1f}%", (len(percent), percent[-1]), textcoords="offset points",
            xytext=(-8, 6), ha="right", fontsize=10, fontweight="bold", color="tab:green",
        )  # fmt: skip
    low = min(percent, default=0.0)
    ax.set_ylim(max(0.0, min(low - 5, 80.0)), 102)
    ax.set_xlim(0.5, max(len(percent), 1) + 0.5)
    ax.set_xticks(list(epochs))
    ax.set_title("Test accuracy after each epoch")
    ax.set_xlabel("epoch")
    ax.set_ylabel("accuracy (%)")
    ax.grid(True, alpha=0.3)


def _plot_collectives(ax: Any, records: Sequence[CollectiveRecord], start: float | None) -> None:
    ax.set_title("Collectives: duration and time each replica waited for the others")
    ax.set_xlabel("time since training started (s)")
    ax.set_ylabel("milliseconds (symlog scale)")
    if not records:
        ax.text(
            0.5, 0.5, "no collectives: a single replica does not communicate",
            ha="center", va="center", transform=ax.transAxes, fontsize=11, color="0.4",
        )  # fmt: skip
        ax.set_xticks([])
        ax.set_yticks([])
        return
    origin = records[0].start if start is None else start
    summary = summarize_telemetry(records)
    replica_ids = sorted(summary["replicas"])
    colors = _replica_colors(len(replica_ids))
    markers = dict(zip(summary["ops"], "o^sDvP*X"))
    times = [r.start - origin for r in records]
    ax.plot(
        times, [r.duration * 1e3 for r in records], color="0.25", linewidth=0.9,
        label="duration of the collective", zorder=3,
    )  # fmt: skip
    for index, replica in enumerate(replica_ids):
        stats = summary["replicas"][replica]
        for op, marker in markers.items():
            points = [
                (t, r.waits[r.replicas.index(replica)] * 1e3)
                for t, r in zip(times, records)
                if r.op == op and replica in r.replicas
            ]
            if not points:
                continue
            first_op = op == next(iter(markers))
            if not first_op:
                label = None
            elif len(replica_ids) <= 8:
                label = (
                    f"replica {replica} waited (mean {stats['mean_wait_ms']:.2f} ms; the others "
                    f"waited for it {stats['last_to_arrive']}×)"
                )
            else:  # one legend entry for them all
                label = f"time each replica waited (one colour each, {len(replica_ids)} replicas)"
                label = label if index == 0 else None
            ax.scatter(
                *zip(*points), s=14, marker=marker, color=colors[index], alpha=0.75,
                linewidths=0, label=label, zorder=4,
            )  # fmt: skip
    # Symlog: the last replica to arrive waits 0, which a log axis cannot show. The linear
    # part spans up to the smallest power of ten that most non-zero waits exceed.
    values = [w * 1e3 for r in records for w in (*r.waits, r.duration)]
    positive = sorted(v for v in values if v > 0)
    floor = positive[len(positive) // 10] if positive else 1.0
    ax.set_yscale("symlog", linthresh=10 ** math.floor(math.log10(floor)), linscale=0.5)
    ax.set_ylim(0, max(values, default=1.0) * 10)
    ax.grid(True, alpha=0.3)
    ops_text = "\n".join(
        f"{op} ({markers[op]}): {s['count']} × {_size(s['nbytes'])} via {s['implementation']}, "
        f"median {s['median_ms']:.2f} ms, p90 {s['p90_ms']:.2f} ms"
        for op, s in summary["ops"].items()
    )
    ax.text(
        0.01, 0.97, ops_text, transform=ax.transAxes, va="top", ha="left", fontsize=9,
        bbox={"boxstyle": "round", "facecolor": "white", "edgecolor": "0.8", "alpha": 0.9},
        zorder=5,
    )  # fmt: skip
    ax.legend(loc="upper right", fontsize=9, framealpha=0.9)


def _replica_colors(count: int) -> list[Any]:
    from matplotlib import colormaps

    cmap = colormaps["tab10" if count <= 10 else "tab20"]
    return [cmap(i % cmap.N) for i in range(count)]
