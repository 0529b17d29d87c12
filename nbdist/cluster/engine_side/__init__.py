"""The engine-side half of the cluster: code that runs inside the ipyparallel engines.

The notebook sends these functions by reference (cloudpickle pickles a module-level function
as its module and name), so each engine imports this package and runs its own copy: the
notebook and the engines must have the same nbdist. None of these modules runs in the
notebook, and none imports the notebook side (`engines`, `supervisor`, `remote` import them,
never the other way round; `calls` reads `nd.remote` references from `nbdist.cluster.refs`,
which imports no notebook code). All code that runs on the engines lives here: the notebook
passes these functions (not their names) to `nbdist.cluster.supervisor.supervise`.

One module per job:

- `state`: what the engine knows about itself (its namespace, strategy, rank, group).
- `joining`: joining the cluster (`describe`, `bootstrap`), run once per engine start.
- `calls`: the entry points behind `strategy.run`, `run_steps`, `push` and `pull`.
- `cell`: the entry point behind `%%distribute` (`run_cell`: one notebook cell, run here).
- `health`: releasing blocked peers and forming the process group again.
- `failures`: failure replies that say where the user's code was and which peer failed first.
- `guards`: what a cell must not do to its engine (`exit()`), and what a busy engine tells
  the notebook (a `KeyboardInterrupt` it caught, a process group it destroyed).
- `publisher`: the telemetry feed the engine publishes while a cell runs (`cluster.feed`
  is its notebook half).
- `stacks`: the stack server, a thread that answers `cluster.stacks()` while a cell runs
  (`cluster.stacks` is its notebook half).
- `progress`: the state of an `nd.progress` bar, sent to the notebook (which draws it) instead
  of tqdm's text (`magics._progress` is its notebook half).

Example (on an engine, after `bootstrap`)::

    from nbdist.cluster.engine_side import state
    state.strategy().num_replicas_in_sync
"""
