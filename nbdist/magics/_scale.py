"""`%dist scale N [--keep global-batch|replica-batch] [--survivors]`: resize the running cluster.

The magic's side of `cluster.scale` (nbdist.cluster.scaling): parses the line, prints each
stage as it happens and then the report (what state followed, what did not, the time).

Example (in a notebook with a running cluster)::

    %dist scale 3
    %dist scale 2 --keep replica-batch
    %dist scale --survivors
"""

from __future__ import annotations

from typing import Any

from IPython.core.error import UsageError

__all__ = ["SCALE_USAGE", "scale_command"]

SCALE_USAGE = "%dist scale N [--keep global-batch|replica-batch] [--survivors]"


def scale_command(cluster: Any, words: list[str]) -> Any:
    """Run `%dist scale` on `cluster` (None: no cluster); returns the `ScaleReport`."""
    if cluster is None:
        raise UsageError("%dist scale: no cluster is running. Start one: `%dist start -n 2`.")
    n, keep, survivors = _parse(words)
    from nbdist.cluster.errors import ScaleFailedError, ScaleRefusedError
    from nbdist.errors import InvalidArgumentError

    what = f"to {n} engine(s)" if n is not None else "on the surviving engines"
    print(f"Resizing {what} (keep {keep})…", flush=True)
    try:
        report = cluster.scale(n, keep, survivors=survivors, progress=_print)
    except (ScaleRefusedError, ScaleFailedError, InvalidArgumentError) as error:
        raise UsageError(f"%dist scale: {error}") from None
    print(report)
    return report


def _parse(words: list[str]) -> tuple[int | None, str, bool]:
    n: int | None = None
    keep = "global-batch"
    survivors = False
    rest = list(words)
    while rest:
        word = rest.pop(0)
        if word == "--survivors":
            survivors = True
        elif word == "--keep" and rest:
            keep = rest.pop(0)
        elif word.startswith("--keep="):
            keep = word.split("=", 1)[1]
        elif word.isdigit() and n is None:
            n = int(word)
        else:
            raise UsageError(f"%dist scale: unexpected {word!r}. Use: {SCALE_USAGE}")
    if n is None and not survivors:
        raise UsageError(
            f"%dist scale needs the number of engines, e.g. `%dist scale 3`. Use: {SCALE_USAGE}"
        )
    return n, keep, survivors


def _print(line: str) -> None:
    print(line, flush=True)
