"""`%dist` and `%%distribute`: the notebook's magics over an `nbdist.cluster.Cluster`.

`%load_ext nbdist` registers `DistMagics` on the shell. `%dist start` creates and starts a
cluster and keeps it on the magics object (`current_cluster()` returns it, and it is `cluster`
in the notebook's namespace unless that name is taken); `%%distribute` runs a cell on its
engines (`_cell.distribute_cell`); `%dist auto on` makes every following cell a
`%%distribute` cell (a cleanup input transformer prepends the magic; cells that start with `%`
still run here, so `%dist auto off` works).
"""

from __future__ import annotations

import argparse
import ast
import math
import shlex
import sys
import time
from typing import TYPE_CHECKING, Any

from IPython.core.error import UsageError
from IPython.core.magic import Magics, cell_magic, line_magic, magics_class

from nbdist.cluster import session
from nbdist.magics import _scale, _stack
from nbdist.magics._modes import OUTPUT_MODES

if TYPE_CHECKING:  # imported when a command needs them (Note [Lazy public API] in nbdist)
    from nbdist.cluster import Cluster

__all__ = ["DistMagics", "current_cluster"]

LAUNCHERS = ("local", "ssh", "mpi", "slurm")
BACKENDS = ("auto", "gloo", "nccl")
STRATEGIES = ("mirrored", "multi_worker", "parameter_server", "fully_sharded")
_NAMESPACE_NAME = "cluster"
_instances = session.holders  # every shell's DistMagics (weakly)


def current_cluster() -> Cluster | None:
    """The cluster started with `%dist start` (None when none is running)."""
    return session.notebook_cluster()


class _Parser(argparse.ArgumentParser):
    """argparse that raises `UsageError` (IPython prints it without a traceback)."""

    def error(self, message: str) -> Any:
        raise UsageError(f"{self.prog}: {message}\n{self.format_usage().strip()}")

    def exit(self, status: int = 0, message: str | None = None) -> Any:
        if message:
            raise UsageError(message)
        raise UsageError(self.format_help())


def _start_parser() -> _Parser:
    parser = _Parser(prog="%dist start", add_help=False)
    parser.add_argument("-n", type=int, default=None, help="number of engines")
    parser.add_argument("--gpus", default=None, help="all, none, or GPU indices such as 0,1")
    parser.add_argument("--hosts", default=None, help="h1:2,h2:2")
    parser.add_argument("--launcher", choices=LAUNCHERS, default="local")
    parser.add_argument("--backend", choices=BACKENDS, default="auto")
    parser.add_argument("--strategy", choices=STRATEGIES, default="mirrored")
    parser.add_argument("--timeout", type=float, default=120.0, help="seconds to start")
    parser.add_argument(
        "--collective-timeout",
        type=float,
        default=None,
        metavar="S",
        help="seconds a collective on the engines waits for every engine (default 300)",
    )
    parser.add_argument(
        "--ps", type=int, default=None, help="engines that are ps tasks (parameter_server)"
    )
    parser.add_argument(
        "--variable-partitioner",
        default=None,
        metavar="fixed:K|min_size:BYTES[:MAX]|max_size:BYTES[:MAX]|NAME",
        help="how a parameter_server cluster splits variables (or a partitioner's name in "
        "the notebook)",
    )
    parser.add_argument(
        "--launcher-option",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a setting of ipyparallel's engine launcher, e.g. remote_python=/opt/venv/bin/python",
    )
    return parser


def _print_progress(line: str) -> None:
    print(f"  {line}", flush=True)


def _launcher_options(items: list[str]) -> dict[str, Any] | None:
    """`["remote_python=/x/python", "ssh_args=['-p', '2222']"]` → a dict (values as literals
    where they parse as Python literals, else as strings)."""
    if not items:
        return None
    options: dict[str, Any] = {}
    for item in items:
        key, equals, text = item.partition("=")
        if not equals or not key.strip():
            raise UsageError(
                f"%dist start: --launcher-option {item!r} is not KEY=VALUE; write e.g. "
                "--launcher-option remote_python=/opt/venv/bin/python"
            )
        try:
            value: Any = ast.literal_eval(text)
        except (ValueError, SyntaxError):
            value = text
        options[key.strip()] = value
    return options


def partitioner_option(text: str, namespace: dict[str, Any]) -> Any:
    """`--variable-partitioner` of `%dist start` → a partitioner.

    `fixed:K` is `FixedShardsPartitioner(K)`, `min_size:BYTES[:MAX_SHARDS]` is
    `MinSizePartitioner(BYTES, MAX_SHARDS)`, `max_size:BYTES[:MAX_SHARDS]` is
    `MaxSizePartitioner(BYTES, MAX_SHARDS)`; a Python name is looked up in the notebook (any
    callable `(shape, dtype) -> [k, 1, ...]`).

    Example:
        >>> partitioner_option("fixed:2", {})
        FixedShardsPartitioner(num_shards=2)
    """
    from nbdist.experimental import partitioners

    kind, _, rest = text.partition(":")
    makers = {
        "fixed": partitioners.FixedShardsPartitioner,
        "min_size": partitioners.MinSizePartitioner,
        "max_size": partitioners.MaxSizePartitioner,
    }
    fix = (
        "write fixed:K, min_size:BYTES[:MAX_SHARDS], max_size:BYTES[:MAX_SHARDS], or the name of "
        "a partitioner defined in the notebook, e.g. --variable-partitioner fixed:2"
    )
    if kind in makers and rest:
        try:
            numbers = [int(part) for part in rest.split(":")]
            if (kind == "fixed" and len(numbers) != 1) or len(numbers) > 2:
                raise UsageError(
                    f"%dist start: --variable-partitioner {text!r}: {len(numbers)} numbers; {fix}."
                )
            return makers[kind](*numbers)
        except ValueError as error:
            raise UsageError(
                f"%dist start: --variable-partitioner {text!r}: {error}; {fix}."
            ) from None
    if text.isidentifier() and text in namespace:
        return namespace[text]
    raise UsageError(f"%dist start: --variable-partitioner {text!r} is not understood: {fix}.")


def _distribute_parser() -> _Parser:
    parser = _Parser(prog="%%distribute", add_help=False)
    parser.add_argument("--targets", default=None, help="replica ids, e.g. 0,2")
    parser.add_argument("--output", choices=OUTPUT_MODES, default=None)  # `%dist output`
    parser.add_argument("--timeout", type=float, default=None, help="seconds")
    parser.add_argument("--stack-after", type=float, default=_stack.DEFAULT_STACK_AFTER)
    return parser


_DIST_USAGE = (
    "%dist start [-n N] [--gpus all|0,1] [--hosts h1:2,h2:2] [--launcher local|ssh|mpi|slurm] "
    "[--backend auto|gloo|nccl] [--strategy mirrored|multi_worker|parameter_server|fully_sharded] "
    "[--ps N] [--variable-partitioner fixed:K|min_size:B|max_size:B|NAME] [--timeout S] "
    "[--collective-timeout S] [--launcher-option KEY=VALUE ...]\n"
    "%dist status | stop | restart | auto on|off | warm [on|off] | dashboard | traceback | "
    "stack [--all] [--collectives] | debug [N]\n"
    f"{_scale.SCALE_USAGE}\n"
    "%dist output all|first|none|tabs|auto"
)


@magics_class
class DistMagics(Magics):
    """`%dist` (cluster lifecycle) and `%%distribute` (run a cell on every engine)."""

    def __init__(self, shell: Any = None):
        super().__init__(shell)
        self.cluster: Cluster | None = None
        self.auto = False
        self.output = "all"
        """The `--output` of cells that give none (`%dist output MODE`): the prefixed stream,
        as API.md §9 fixes ("output streams live, prefixed by replica id"); `auto` opts in to
        tabs for more than 2 replicas."""
        self.last_result: Any = None
        self.board: Any = None  # the dashboard `%dist dashboard` opened last
        self.last_error: Any = None  # the last RemoteError of a cell (`%dist debug`)
        _instances.add(self)

    # -- %dist --------------------------------------------------------------------------
    @line_magic
    def dist(self, line: str = "") -> None:
        """Manage the engines: %dist start|status|stop|restart|scale|warm|auto on|off|dashboard|
        traceback|stack|debug."""
        words = _split(line, "%dist")
        if not words:
            raise UsageError(f"%dist needs a command:\n{_DIST_USAGE}")
        command, rest = words[0], words[1:]
        handler = {
            "start": self._start,
            "status": self._status,
            "stop": self._stop,
            "restart": self._restart,
            "auto": self._auto,
            "warm": self._warm,
            "dashboard": self._dashboard,
            "traceback": self._traceback,
            "output": self._output,
            "stack": lambda words: _stack.stack_command(self.cluster, words),
            "scale": lambda words: _scale.scale_command(self.cluster, words),
            "debug": self._debug,
        }.get(command)
        if handler is None:
            raise UsageError(f"%dist: unknown command {command!r}. Use:\n{_DIST_USAGE}")
        handler(rest)

    def _start(self, words: list[str]) -> None:
        began = time.perf_counter()  # the start's report counts from here (the user waits)
        args = _start_parser().parse_args(words)
        if args.n is not None and args.n < 1:
            raise UsageError(
                f"%dist start: -n {args.n} asks for no engines; pass at least 1, e.g. "
                "`%dist start -n 2`."
            )
        wait = args.collective_timeout
        if wait is not None and not (wait > 0 and math.isfinite(wait)):
            raise UsageError(
                f"%dist start: --collective-timeout must be a positive number of seconds, got "
                f"{wait:g}; e.g. `%dist start -n 2 --collective-timeout 600` (default 300)."
            )
        extra: dict[str, Any] = {}
        if args.ps is not None:
            if args.strategy != "parameter_server":
                raise UsageError(
                    f"%dist start: --ps {args.ps} is for --strategy parameter_server; e.g. "
                    "`%dist start --strategy parameter_server -n 3 --ps 1`."
                )
            extra["num_ps"] = args.ps
        if args.variable_partitioner is not None and args.strategy != "parameter_server":
            raise UsageError(
                "%dist start: --variable-partitioner is for --strategy parameter_server; "
                "e.g. `%dist start --strategy parameter_server --variable-partitioner fixed:2`."
            )
        if self.cluster is not None and self.cluster.running:
            raise UsageError(
                f"%dist start: a cluster is already running ({self.cluster!r}). Use "
                "`%dist restart` for fresh engines, or `%dist stop` before starting another."
            )
        # Said before anything slow, the imports included (Note [Lazy public API] in nbdist).
        print(f"Starting {f'{args.n} ' if args.n else ''}engine(s)…", flush=True)
        if args.variable_partitioner is not None:
            namespace = self.shell.user_ns if self.shell is not None else {}
            extra["variable_partitioner"] = partitioner_option(args.variable_partitioner, namespace)
        from nbdist.cluster.launch import zygote

        zygote.start_spare(args.launcher, args.timeout)  # imports torch while this cell does
        try:  # the spare is stopped unless the cluster took it (a failed start stopped it)
            from nbdist.cluster import Cluster, ClusterStartError, EngineTimeoutError

            try:
                cluster = Cluster(
                    n=args.n, gpus=args.gpus, hosts=args.hosts, launcher=args.launcher,
                    backend=args.backend, strategy=args.strategy, timeout=args.timeout,
                    collective_timeout=wait,
                    launcher_options=_launcher_options(args.launcher_option), **extra,
                )  # fmt: skip
            except (ValueError, TypeError, NotImplementedError, RuntimeError) as error:
                raise UsageError(f"%dist start: {error}") from None
            try:
                cluster.start(progress=_print_progress, began=began)
            except (ClusterStartError, EngineTimeoutError) as error:
                # Everything started was stopped; the message names the cause and the fix.
                raise UsageError(f"%dist start: {error}") from None
        finally:
            zygote.discard_spare(unless_warm=True)
        self.cluster = cluster
        namespace = self.shell.user_ns if self.shell is not None else {}
        published = ""
        if isinstance(namespace.get(_NAMESPACE_NAME, cluster), Cluster):
            namespace[_NAMESPACE_NAME] = cluster
            published = f"; `{_NAMESPACE_NAME}` in this notebook"
        if args.strategy == "parameter_server":
            published += _publish_ps(namespace, cluster)
        print(f"Started in {cluster.start_seconds:.1f} s{published}.")  # since `began`
        self._print_status()

    def _status(self, words: list[str]) -> None:
        _no_arguments("status", words)
        if self.cluster is None:
            print("No cluster: start one with `%dist start -n 2`.")
            return
        self._print_status()

    def _stop(self, words: list[str]) -> None:
        _no_arguments("stop", words)
        if self.cluster is None:
            print("No cluster is running (nothing to stop).")
            return
        cluster, self.cluster = self.cluster, None
        if self.board is not None:
            self.board.freeze()  # its last state stays in the output as a picture
            self.board = None
        cluster.stop()
        namespace = self.shell.user_ns if self.shell is not None else {}
        if namespace.get(_NAMESPACE_NAME) is cluster:
            del namespace[_NAMESPACE_NAME]
        logs = getattr(cluster, "log_file", None)
        print("Cluster stopped: no engine is left." + (f" Engine logs: {logs}" if logs else ""))

    def _restart(self, words: list[str]) -> None:
        _no_arguments("restart", words)
        if self.cluster is None:
            raise UsageError("%dist restart: no cluster to restart. Start one: `%dist start`.")
        from nbdist.cluster import ClusterStartError, EngineTimeoutError

        print(
            f"Restarting {self.cluster.num_engines} engine(s) (engine state is lost)…", flush=True
        )
        try:
            self.cluster.restart(progress=_print_progress)
        except (ClusterStartError, EngineTimeoutError) as error:
            raise UsageError(f"%dist restart: {error}") from None
        print(f"Restarted in {self.cluster.start_seconds:.1f} s.")  # the stop included
        self._print_status()

    def _output(self, words: list[str]) -> None:
        """`%dist output MODE`: the output of every following `%%distribute` cell that names
        none (`auto` by default: tabs for more than 2 replicas in a notebook)."""
        if len(words) != 1 or words[0] not in OUTPUT_MODES:
            raise UsageError(
                f"%dist output takes one of {', '.join(OUTPUT_MODES)}, e.g. `%dist output tabs`;"
                f" got {' '.join(words) or 'nothing'}."
            )
        self.output = words[0]
        print(f"%%distribute cells show their output as `--output {self.output}` from now on.")

    def _auto(self, words: list[str]) -> None:
        if len(words) != 1 or words[0] not in ("on", "off"):
            raise UsageError("%dist auto takes `on` or `off`, e.g. `%dist auto on`.")
        on = words[0] == "on"
        cleanup = self.shell.input_transformers_cleanup
        if on and _auto_transform not in cleanup:
            cleanup.append(_auto_transform)
        elif not on and _auto_transform in cleanup:
            cleanup.remove(_auto_transform)
        self.auto = on
        if on:
            print(
                "Every following cell runs on the engines (as %%distribute); cells starting "
                "with % run here. `%dist auto off` to stop."
            )
        else:
            print("Cells run in this notebook again.")

    def _warm(self, words: list[str]) -> None:
        """`%dist warm on|off`: keep an engine zygote and a spare controller ready between
        clusters (or not); `%dist warm` says whether they wait, and their memory."""
        from nbdist.cluster.launch import zygote

        if len(words) > 1 or (words and words[0] not in ("on", "off")):
            raise UsageError("%dist warm takes `on`, `off` or nothing, e.g. `%dist warm on`.")
        if words and words[0] == "on" and not zygote.zygote_wanted("local"):
            raise UsageError(
                "%dist warm on: engines are not forked from a zygote here (NBDIST_ZYGOTE=0, "
                "or no os.fork); unset NBDIST_ZYGOTE to use one."
            )
        if words:
            zygote.keep_warm(words[0] == "on")
        waiting = zygote.warm_zygote()
        controller = zygote.spare_controller()
        if not zygote.keeps_warm():
            print("No engine zygote is kept warm (`%dist warm on` keeps one ready).")
        elif waiting is None:
            print("An engine zygote is kept warm: the running cluster has it until it stops.")
        else:
            spare = (
                f" and a spare controller (pid {controller.pid}, {_memory(controller.pid)})"
                if controller is not None
                else ""
            )
            print(
                f"An engine zygote is kept warm (pid {waiting.pid}, {_memory(waiting.pid)}){spare}"
                ": the next `%dist start` forks its engines from the zygote"
                + (" and makes the spare its controller" if spare else "")
                + ". `%dist warm off` stops them."
            )

    def _dashboard(self, words: list[str]) -> None:
        _no_arguments("dashboard", words)
        from nbdist.widgets.dashboard import dashboard

        if self.board is not None:
            self.board.freeze()  # one live dashboard per notebook: the old one keeps its picture
        self.board = dashboard(self.cluster).show()

    def _traceback(self, words: list[str]) -> None:
        """Print every replica's full traceback of the last `RemoteError` (Note [The cause
        first] in `nbdist.cluster.errors`): the frames of nbdist, torch and gloo the notebook
        leaves out."""
        _no_arguments("traceback", words)
        details = getattr(getattr(sys, "last_value", None), "details", None)
        if not isinstance(details, str):
            print(
                "No engine error to show: `%dist traceback` prints every replica's full "
                "traceback of the last cell that failed on the engines."
            )
            return
        print(details)

    def _debug(self, words: list[str]) -> None:
        """`%dist debug [N]`: the debugger in replica N's last failure (`magics._debug`)."""
        from nbdist.magics._debug import debug_command

        debug_command(self.cluster, words, self.last_error)

    def _print_status(self) -> None:
        cluster = self.cluster
        if cluster is None:
            return
        plan = cluster.plan
        kind = f"GPU {', '.join(plan.gpus)}" if plan.gpus else "CPU"
        state = "running" if cluster.running else "stopped"
        header = (
            f"nbdist cluster: {plan.n} {kind} engine(s), backend {plan.backend}, "
            f"{_communication(plan)}, {state}"
        )
        if getattr(cluster, "num_ps", None):
            header = (
                f"nbdist parameter-server cluster: {cluster.num_workers} worker and "
                f"{cluster.num_ps} ps engine(s) (the last {cluster.num_ps}), "
                f"{_communication(plan)}, {state}"
            )
        if cluster.broken:
            header += f"\nunusable: {cluster.broken}. Run `%dist restart` (engine state is lost)."
        elif cluster.repaired:
            header += (
                f"\nusable; the process group was formed again after: {cluster.repaired} "
                "(the engines kept their variables)"
            )
        table = cluster.status()
        dead = [row.rank for row in table if row.state == "dead"]
        print(header)
        if table:
            print(table)
        from nbdist.cluster.debug_prompt import debug_notes

        for rank, note in sorted(debug_notes(cluster).items()):
            print(f"Replica {rank} {note}.")
        for rank, note in sorted(cluster.busy_notes().items()):
            print(
                f"Replica {rank} {note}; cells wait until it finishes (`%dist restart` to stop "
                "waiting: engine state is lost)."
            )
        if dead and getattr(cluster, "num_ps", None):
            print(_ps_dead_note(cluster, dead))
        elif dead:
            print(
                f"Replica(s) {dead} are dead: run `%dist scale --survivors` to continue on the "
                "live engines with their state, or `%dist restart` (engine state is lost)."
            )

    # -- %%distribute -------------------------------------------------------------------
    @cell_magic
    def distribute(self, line: str, cell: str) -> Any:
        """Run the cell on every engine; its last expression comes back as a PerReplica."""
        args = _distribute_parser().parse_args(_split(line, "%%distribute"))
        cluster = self.cluster
        if cluster is None or not cluster.running:
            raise UsageError(
                "%%distribute needs running engines: run `%dist start` (e.g. `%dist start -n 2`) "
                "first."
            )
        if getattr(cluster, "num_ps", None):
            raise UsageError(
                "%%distribute runs a cell on every engine of a mirrored cluster; on a "
                "parameter_server cluster, schedule functions on the workers with "
                "`coordinator.schedule(fn, args=...)` (created by %dist start) instead."
            )
        targets = None
        if args.targets is not None:
            targets = _targets(args.targets, cluster.num_engines)
        if args.timeout is not None and not args.timeout > 0:
            raise UsageError(f"%%distribute: --timeout must be positive, got {args.timeout:g}.")
        if not args.stack_after >= 0:
            raise UsageError(
                f"%%distribute: --stack-after must be 0 (never) or a number of seconds, got "
                f"{args.stack_after:g}; e.g. `%%distribute --stack-after 60`."
            )
        from nbdist.cluster import RemoteError
        from nbdist.magics._cell import distribute_cell

        output = args.output or self.output
        with _stack.watch(cluster, args.stack_after) as watcher:
            try:
                value = distribute_cell(
                    cluster, cell, targets=targets, output=output, timeout=args.timeout
                )
            except RemoteError as error:
                self.last_error = error  # for `%dist debug`
                if watcher is not None and watcher.view is not None:
                    error.notes = (*error.notes, f"Stacks shown while it waited:\n{watcher.view}")
                raise
        self.last_result = value
        return None if output == "none" else value


def _communication(plan: Any) -> str:
    """The engines' communication settings for `%dist status`: the collective timeout, and
    the bucket size and compression where they are not the defaults."""
    options = plan.communication
    parts = [f"collective timeout {plan.collective_timeout:g} s"]
    if options.bytes_per_pack:
        parts.append(f"bytes_per_pack {options.bytes_per_pack}")
    if options.compression:
        parts.append(f"compression {options.compression}")
    return ", ".join(parts)


def _publish_ps(namespace: dict[str, Any], cluster: Any) -> str:
    """Put the cluster's `strategy` and `coordinator` in the notebook (not over other values)."""
    published = []
    for name, value in (("strategy", cluster.strategy), ("coordinator", cluster.coordinator)):
        if name not in namespace or type(namespace[name]).__name__ in (
            "ParameterServerStrategy",
            "ClusterCoordinator",
        ):
            namespace[name] = value
            published.append(f"`{name}`")
    return f", {' and '.join(published)}" if published else ""


def _memory(pid: int) -> str:
    """`"312 MiB"`: the resident memory of process `pid` (what it holds now)."""
    import psutil

    try:
        return f"{psutil.Process(pid).memory_info().rss / 2**20:.0f} MiB"
    except psutil.Error:
        return "gone"


def _auto_transform(lines: list[str]) -> list[str]:
    """Input transformer of `%dist auto on`: make the cell a `%%distribute` cell."""
    first = next((line for line in lines if line.strip()), None)
    if first is None or first.lstrip().startswith(("%", "!")):
        return lines
    return ["%%distribute\n", *lines]


def _split(line: str, prog: str) -> list[str]:
    try:
        return shlex.split(line)
    except ValueError as error:
        raise UsageError(f"{prog}: cannot parse {line!r}: {error}") from None


def _no_arguments(command: str, words: list[str]) -> None:
    if words:
        raise UsageError(f"%dist {command} takes no arguments, got {' '.join(words)!r}.")


def _targets(text: str, n: int) -> list[int]:
    try:
        targets = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        targets = []
    if not targets or len(set(targets)) != len(targets) or not all(0 <= t < n for t in targets):
        raise UsageError(
            f"%%distribute: --targets {text!r} must list distinct replica ids between 0 and "
            f"{n - 1}, e.g. --targets 0,1."
        )
    return targets


def load(shell: Any) -> DistMagics:
    """Register the magics on `shell` (once); return them."""
    for magics in list(_instances):
        if magics.shell is shell:
            return magics
    magics = DistMagics(shell)
    shell.register_magics(magics)
    from nbdist.magics import _complete

    _complete.install(shell, magics)  # Tab and Shift+Tab from replica 0's namespace
    from nbdist.magics import _visual_debugger

    _visual_debugger.install(shell)  # JupyterLab's debugger stops replicas too
    return magics


def unload(shell: Any) -> None:
    """Stop the cluster started from `shell` and turn `%dist auto` off."""
    from nbdist.magics import _complete

    _complete.uninstall(shell)
    from nbdist.magics import _visual_debugger

    _visual_debugger.uninstall(shell)
    for magics in list(_instances):
        if magics.shell is shell:
            if _auto_transform in shell.input_transformers_cleanup:
                shell.input_transformers_cleanup.remove(_auto_transform)
            if magics.cluster is not None:
                magics.cluster.stop()
                magics.cluster = None
            _instances.discard(magics)


def _ps_dead_note(cluster: Any, dead: list[int]) -> str:
    """What `%dist status` says of dead engines of a parameter_server cluster: a dead worker's
    functions run on the other workers (`%dist scale` refuses these clusters); a dead ps task's
    variables are lost."""
    roles = getattr(cluster, "roles", ())
    workers = [r for r in dead if r < len(roles) and roles[r] == "worker"]
    ps = [r for r in dead if r not in workers]
    notes = []
    if workers:
        notes.append(
            f"Worker replica(s) {workers} are dead: the coordinator runs their functions on the "
            "other workers; `cluster.restart_worker(i)` starts a fresh engine as worker i "
            "(engines on this machine), `%dist restart` a fresh cluster (the ps tasks' "
            "variables are lost)."
        )
    if ps:
        notes.append(
            f"ps replica(s) {ps} are dead: their variables are lost; `%dist restart` and "
            "restore the model from the last checkpoint (docs/parameter-server.md)."
        )
    return "\n".join(notes)
