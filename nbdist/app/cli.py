"""The `nbdist` command: `nbdist demo` (also `python -m nbdist demo`).

Front-end layer. `nbdist demo` starts engines (`nd.Cluster`), trains a small CNN on the digits
with their `MultiWorkerMirroredStrategy`, writes `metrics.json` and `dashboard.png` into
`--out` and stops the engines, also on Ctrl-C or an error. `--in-process` runs the same kind
of training with a `MirroredStrategy` over thread replicas instead (no engines). A bad option
exits with status 2 and a one-line message (argparse's convention), a demo that cannot run
(unwritable folder, engines that fail to start) with 1, an interrupt with 130.

Example:
    >>> main(["--version"])  # doctest: +SKIP
    nbdist 0.1.0
    0
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Iterable, Sequence
from pathlib import Path

from nbdist.app.arguments import positive_int

__all__ = ["MAX_ENGINES_PER_CORE", "build_parser", "close_abandoned_event_loops", "main"]

MAX_ENGINES_PER_CORE = 4
"""More engines than this many per core is refused: each would get too little CPU to be useful."""




def build_parser() -> argparse.ArgumentParser:
    """The `nbdist` argument parser with its subcommands."""
    from nbdist import __version__

    parser = argparse.ArgumentParser(
        prog="nbdist",
        description="TensorFlow's tf.distribute programming model for PyTorch.",
    )
    parser.add_argument("--version", action="version", version=f"nbdist {__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")
    demo = commands.add_parser(
        "demo",
        help="train a small CNN on nbdist engines and write its metrics and dashboard",
        description=(
            "Start engines (one per GPU, else 2 CPU engines), train a small CNN on the digits "
            "data bundled with nbdist with the engines' MultiWorkerMirroredStrategy, print the "
            "loss and test accuracy per epoch, write metrics.json and dashboard.png into --out "
            "and stop the engines."
        ),
    )
    demo.add_argument("--engines", type=positive_int, default=None, metavar="N",
                      help="engines (= replicas) to start (default: one per GPU, else 2)")
    demo.add_argument("--epochs", type=positive_int, default=6,
                      help="passes over the training set (default: %(default)s)")
    demo.add_argument("--out", type=Path, default=Path("nbdist-demo"), metavar="DIR",
                      help="folder for metrics.json and dashboard.png (default: ./nbdist-demo)")
    demo.add_argument("--seed", type=int, default=0,
                      help="seed of the split, the weights and the shuffling (default: 0)")
    demo.add_argument("--no-progress", dest="progress", action="store_false",
                      help="do not show the progress bar")
    demo.add_argument("--in-process", action="store_true",
                      help="no engines: thread replicas (MirroredStrategy on cpu:0..N-1) in "
                      "this process")  # fmt: skip
    demo.set_defaults(handler=_demo, parser=demo)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the `nbdist` command with `argv` (default: `sys.argv[1:]`); return the exit status."""
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
        if args.command is None:
            parser.print_help(sys.stderr)
            return 2
        return args.handler(args)
    except SystemExit as exit_:  # argparse: --help, --version (0) or a bad option (2)
        return exit_.code if isinstance(exit_.code, int) else 2


def _default_engines() -> int:
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 2


def _demo(args: argparse.Namespace) -> int:
    from nbdist.app.engine_demo import DemoError, check_out_dir
    from nbdist.app.interrupts import remembered_interrupts
    from nbdist.errors import NbdistError

    engines = args.engines or _default_engines()
    cores = os.cpu_count() or 1
    if engines > MAX_ENGINES_PER_CORE * cores:
        args.parser.error(
            f"--engines {engines} is more than {MAX_ENGINES_PER_CORE} per core on this "
            f"{cores}-core machine; pass --engines {cores} or fewer"
        )
    if engines > cores:
        print(f"nbdist demo: warning: {engines} engines on {cores} cores share the CPUs; "
              "training will be slower than with fewer engines", file=sys.stderr)  # fmt: skip
    try:
        folder = check_out_dir(args.out)
        print(f"nbdist demo: writing into {folder.resolve()}", flush=True)
        with remembered_interrupts():  # a Ctrl-C swallowed in a finalizer still stops the demo
            if args.in_process:
                from nbdist.app import demo

                devices = [f"cpu:{i}" for i in range(engines)]
                demo.train(devices=devices, epochs=args.epochs, seed=args.seed,
                           out=folder / "dashboard.png", progress=args.progress)  # fmt: skip
            else:
                from nbdist.app.engine_demo import run_demo

                run_demo(engines, args.epochs, folder, seed=args.seed, progress=args.progress)
    except KeyboardInterrupt:
        # A Ctrl-C during start also lands in ipyparallel's controller-start task; asyncio
        # would print that task's traceback at exit, after the engines are already stopped.
        import logging

        logging.getLogger("asyncio").setLevel(logging.CRITICAL)
        close_abandoned_event_loops()
        print("nbdist demo: interrupted; the engines were stopped", file=sys.stderr)
        return 130
    except (DemoError, NbdistError, OSError) as error:
        message = str(error).splitlines()[0] if str(error) else type(error).__name__
        print(f"nbdist demo: error: {message}", file=sys.stderr)
        return 1
    return 0


def close_abandoned_event_loops(candidates: Iterable[object] | None = None) -> int:
    """Close the event loops nobody runs or closed any more; how many were closed.

    Each synchronous ipyparallel call (`start_controller_sync`, ...) makes an event loop and
    closes it when done. A Ctrl-C that lands while one is being made or closed leaves it open,
    referenced by tornado's map of loops, so it is closed only by its finalizer at interpreter
    exit, after its socket pair: Python then prints an "Exception ignored in
    BaseEventLoop.__del__" traceback ("Invalid file descriptor: -1") under the demo's clean
    "interrupted" line. Closing such loops before exit, while their sockets are open, is what
    their finalizer would have done. Only for a process about to exit: by default it looks at
    every object (`gc.get_objects()`) and closes every loop that is not running, whoever made
    it; `candidates` limits it to those objects.

    Example:
        >>> import asyncio
        >>> loop = asyncio.new_event_loop()
        >>> close_abandoned_event_loops([loop, "not a loop"]), loop.is_closed()
        (1, True)
    """
    import asyncio
    import contextlib
    import gc

    closed = 0
    for thing in gc.get_objects() if candidates is None else candidates:
        # type(), not isinstance(): that reads `__class__`, which raises for a dead weak proxy
        # and warns for some deprecated objects
        if not issubclass(type(thing), asyncio.AbstractEventLoop):
            continue
        with contextlib.suppress(Exception):  # a half-made loop: left to its finalizer
            if not (thing.is_running() or thing.is_closed()):
                thing.close()
                closed += 1
    return closed
