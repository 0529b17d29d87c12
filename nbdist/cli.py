"""The `nbdist` command: `nbdist demo` (also `python -m nbdist demo`).

Front-end layer. Options are parsed with argparse; a bad option or device exits with status 2
and a one-line message (argparse's convention), a missing optional dependency with status 1
and the command that installs it, an interrupt with 130.

Example:
    >>> main(["--version"])  # doctest: +SKIP
    nbdist 0.1.0
    0
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

__all__ = ["build_parser", "main"]


def build_parser() -> argparse.ArgumentParser:
    """The `nbdist` argument parser with its subcommands."""
    from nbdist import __version__, demo

    parser = argparse.ArgumentParser(
        prog="nbdist",
        description="TensorFlow's tf.distribute programming model for PyTorch.",
    )
    parser.add_argument("--version", action="version", version=f"nbdist {__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")
    demo_parser = commands.add_parser(
        "demo",
        help="train a small classifier on 2 logical CPU replicas and save a dashboard picture",
        description=(
            "Train an MLP (64-128-10) on scikit-learn's digits images with a data-parallel "
            "strategy, print the test accuracy and write a picture of the loss, the accuracy "
            "and the collectives' timing."
        ),
    )
    demo.add_arguments(demo_parser)
    demo_parser.set_defaults(handler=_demo, parser=demo_parser)
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


def _demo(args: argparse.Namespace) -> int:
    from nbdist import demo

    demo.check_arguments(args.parser, args)  # exits 2 with argparse's message
    try:
        demo.train(
            strategy=args.strategy, devices=args.devices, epochs=args.epochs,
            optimizer=args.optimizer, lr=args.lr, seed=args.seed, out=args.out,
            progress=args.progress,
        )  # fmt: skip
    except demo.MissingDependencyError as error:
        print(f"nbdist demo: {error}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("nbdist demo: interrupted", file=sys.stderr)
        return 130
    return 0
