"""The notebook's half of `%%distribute`: run one cell on the engines at once.

`distribute_cell` checks the cell's syntax here (one SyntaxError, not one per engine), sends it
to the engines' `engine_side.cell.run_cell` on the one engine-call path
(`nbdist.cluster.supervisor.supervise`: an engine that failed while its peers are blocked in a
collective releases them; Ctrl-C and timeouts interrupt the engines), and shows the engines'
output live through a printer: `CellPrinter` (`[N] line`, plus `nd.progress` bars), or one tab
per replica with `--output tabs` (`magics._tabs`).

Each engine's reply carries the fingerprint of its mirrored parameters (Note [Replica check]
in `nbdist.strategies._replica_check`), and the notebook compares them once the cell has run
everywhere: no collective among the engines (a cell that failed on one engine cannot leave the
others waiting in it), and parameters that differ raise `ReplicasDivergedError` here.

Example (needs engines, so not run here)::

    distribute_cell(cluster, "rank = strategy.cluster_resolver.task_id\nrank")
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from IPython import get_ipython

from nbdist.cluster import cell_names
from nbdist.cluster.engine_side.cell import run_cell
from nbdist.cluster.output import OutputPrinter
from nbdist.cluster.supervisor import Call, supervise
from nbdist.core.values import PerReplica
from nbdist.magics import _visual_debugger
from nbdist.magics._cell_printer import CellPrinter
from nbdist.magics._modes import OUTPUT_MODES, PREFIXED_UP_TO

if TYPE_CHECKING:
    from nbdist.cluster.engines import Cluster

__all__ = ["OUTPUT_MODES", "CellPrinter", "check_replicas", "distribute_cell", "python_source"]

_CELL = Call(
    what="a %%distribute cell",
    fix="`%dist restart`",
    subject="The cell",
    longer="Raise --timeout for longer work.",
    advice="End the cell with tensors, numbers or containers of them.",
)
_counter = itertools.count(1)


def python_source(cell: str) -> str:
    """The cell as plain Python (IPython syntax such as `%time` or `!ls` transformed)."""
    from IPython.core.inputtransformer2 import TransformerManager

    return TransformerManager().transform_cell(cell)


def resolve_output(output: str, targets: int) -> str:
    """The mode `output` means for a cell on `targets` replicas (`auto` decided; see
    `OUTPUT_MODES`).

    Example:
        >>> resolve_output("auto", 2), resolve_output("first", 8)
        ('all', 'first')
    """
    if output not in OUTPUT_MODES:
        from nbdist.errors import InvalidArgumentError

        raise InvalidArgumentError(
            f"output must be one of {OUTPUT_MODES}, got {output!r}; e.g. output='all'."
        )
    if output != "auto":
        return output
    return "tabs" if targets > PREFIXED_UP_TO and _widgets_shown() else "all"


def _widgets_shown() -> bool:
    """True inside a Jupyter kernel with ipywidgets (a front end can draw the tabs there)."""
    from IPython import get_ipython

    shell = get_ipython()
    if shell is None or type(shell).__name__ != "ZMQInteractiveShell":
        return False
    try:
        import ipywidgets  # noqa: F401
    except ImportError:
        return False
    return True


def printer_for(output: str) -> OutputPrinter:
    """The printer of a resolved `--output` mode (`resolve_output`)."""
    if output == "tabs":
        from nbdist.magics._tabs import TabsPrinter

        return TabsPrinter()
    return CellPrinter(output)


def distribute_cell(
    cluster: Cluster,
    cell: str,
    *,
    targets: Sequence[int] | None = None,
    output: str = "all",
    timeout: float | None = None,
) -> PerReplica | None:
    """Run `cell` on the engines of replicas `targets` (default: all) at once.

    `output` is one of `OUTPUT_MODES` (`auto`: one tab per replica for more than 2 targets in
    a Jupyter kernel, else every replica's lines prefixed `[N]`).

    Returns:
        The last expression's values as a `PerReplica` carrying the targets' replica ids, in
        replica order (`--targets 1,0` gives `PerReplica:{0: ..., 1: ...}`, `--targets 1`
        gives `PerReplica:{1: ...}`), or None when the cell ends with a statement (or every
        engine's value is None).

    Raises:
        SyntaxError: the cell is not valid Python (checked here, before sending).
        WorkerLostError: an engine is dead; `%dist restart` recovers.
        RemoteError: one or more engines raised (one error for all of them).
        ClusterUnusableError: an earlier fault left the cluster unusable (nothing was sent).
        EngineTimeoutError: not finished within `timeout` s (the engines were interrupted;
            the message says whether the cluster is still usable).
        ClusterInterrupted: (a `KeyboardInterrupt`) Ctrl-C; the engines were interrupted, and
            the one-line message says what each was doing and whether the cluster is usable.
    """
    resolve_output(output, 0)  # a bad mode fails before anything else
    filename = f"<distribute-cell-{next(_counter)}>"
    source = cell_names.numbered_like_the_editor(filename, cell, python_source(cell))
    compile(source, filename, "exec")  # raised once, here, not by every engine
    lines = _visual_debugger.breakpoints_for(get_ipython(), filename, cell)
    extra = (filename, lines) if lines else (filename,)  # JupyterLab's breakpoints, if any
    with cluster.turn("The cell", timeout) as deadline:  # Note [One call at a time]
        engines = list(cluster.engines)
        if targets is not None:
            by_rank = {info.rank: info for info in engines}
            engines = [by_rank[rank] for rank in sorted(targets)]
        cluster.require_alive("the cell", fix="`%dist restart`")
        left = cluster.time_left("The cell", timeout, deadline)
        cluster.require_usable("The cell", fix="`%dist restart`", wait=left)
        cluster.time_left("The cell", timeout, deadline)
        printer = printer_for(resolve_output(output, len(engines)))
        chosen = {info.rank for info in engines}
        replies = supervise(
            cluster, engines, run_cell, source, *extra, call=_CELL, timeout=timeout,
            deadline=deadline, printer=printer,
            bystanders=[info for info in cluster.engines if info.rank not in chosen],
        )  # fmt: skip
        check_replicas(cluster, [info.rank for info in engines], replies)
    values = [reply["value"] for reply in replies]
    if all(value is None for value in values):
        return None
    return PerReplica(values, replica_ids=[info.rank for info in engines])


def check_replicas(cluster: Cluster, ranks: list[int], replies: list[dict[str, Any]]) -> None:
    """Compare the engines' fingerprints of their mirrored parameters (Note [Replica check]);
    record the outcome for the dashboard on `cluster.last_replica_check`.

    Raises:
        ReplicasDivergedError: some replica's parameters differ from the others'.
    """
    prints = [reply.get("fingerprint") for reply in replies]
    if len(prints) < 2 or any(p is None for p in prints):
        return
    names, numels = prints[0][0], prints[0][1]
    if any(p[0] != names for p in prints):
        return  # different models on different engines: nothing to compare
    import torch

    from nbdist.errors import ReplicasDivergedError
    from nbdist.strategies._replica_check import differing, diverged_message

    values = torch.tensor([p[2] for p in prints], dtype=torch.float64)
    bad = differing(values.amax(0), values.amin(0), numels)
    if not bad:
        cluster.last_replica_check = (time.time(), True, "")
        return
    first = values[0]
    others = [
        rank
        for rank, mine in zip(ranks[1:], values[1:])
        if differing(torch.maximum(first, mine), torch.minimum(first, mine), numels)
    ]
    message = diverged_message(
        names, bad, "at the end of the %%distribute cell",
        f" (replica(s) {others} differ from replica {ranks[0]})",
    )  # fmt: skip
    cluster.last_replica_check = (time.time(), False, message)
    raise ReplicasDivergedError(message)
