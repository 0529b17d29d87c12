"""The engine's side of `%dist scale`: its state follows a resized cluster.

Runs on the engine; the notebook (`nbdist.cluster.scaling`) calls, in order:

1. `prepare` on every engine of the old group (not after a death): finds the strategy's state
   in the namespace, says what cannot follow (`problems`: nothing has changed yet), and
   aggregates every sync-on-read variable by its rule over the old replicas (a collective);
2. `regroup` on the engines that stay (joining engines run `joining.bootstrap`): the process
   group is formed at the new size, at a fresh rendezvous;
3. `snapshot` on replica 0, `adopt` on the joining engines: the strategy's state pickled once
   (so shared objects stay shared: a model's parameters and its optimizer's), the strategy
   itself, distributed datasets and iterators sent as references (Note [State that follows]);
4. `follow` on every engine: datasets and iterators continue at the new size
   (nbdist.input.following), sync-on-read variables get their share, the gradient layout and
   every mirrored parameter are compared across the workers, and `@nd.on_scale` functions run.

Note [State that follows]: the strategy's state is what its `scope()` made, found by name at
the top level of the engine's namespace: modules with captured parameters, optimizers over
them, `nd.Variable`s of the strategy, distributed datasets and their iterators. Other Python
values are not copied to joining engines; `@nd.on_scale` functions re-create them.

Example (what the notebook does, through ipyparallel)::

    view.apply_async(resize.prepare, "global-batch", 2, 3, False).get()
"""

from __future__ import annotations

import contextlib
import io
import pickle
import time
from collections.abc import Callable
from typing import Any

import cloudpickle

from nbdist.cluster import _wire
from nbdist.cluster.engine_side import state
from nbdist.cluster.engine_side.health import group_prefix
from nbdist.cluster.engine_side.joining import store_peers, torchrun_environment

__all__ = ["adopt", "follow", "prepare", "regroup", "settle", "snapshot"]

_SKIP = frozenset({"strategy", "nd", "torch", "In", "Out", "get_ipython", "exit", "quit"})
_pending: dict[str, Any] = {"sync": {}}
"""Sync-on-read values aggregated by `prepare` (or sent by `adopt`), applied by `follow`."""


def _tracked(namespace: dict[str, Any], strategy: Any) -> list[tuple[str, Any, str]]:
    """`(name, value, kind)` of the strategy's state in `namespace`, sorted by name (the same
    order on every engine: `prepare`'s collectives pair up)."""
    import torch

    from nbdist.core.variables import DistributedVariable
    from nbdist.input import DistributedDataset, DistributedIterator

    found = []
    for name in sorted(namespace):
        if name.startswith("_") or name in _SKIP:
            continue
        value = namespace[name]
        kind = None
        if isinstance(value, torch.nn.Module):
            tensors = [*value.parameters(), *value.buffers()]
            kind = "module" if tensors and strategy.tracks(tensors) else None
        elif isinstance(value, torch.optim.Optimizer):
            params = [p for group in value.param_groups for p in group["params"]]
            kind = "optimizer" if params and strategy.tracks(params) else None
        elif isinstance(value, DistributedVariable):
            kind = "variable" if value.distribute_strategy is strategy else None
        elif id(value) in _unmade:  # adopted, made by `follow`
            kind = _unmade[id(value)][0]
        elif isinstance(value, DistributedDataset):
            kind = "dataset" if value.recipe is not None else None
        elif isinstance(value, DistributedIterator):
            kind = "iterator" if value.origin is not None else None
        if kind is not None:
            found.append((name, value, kind))
    return found


def prepare(keep: str, old: int, new: int, survivors: bool) -> dict[str, Any]:
    """Step 1 (see the module): what follows, what cannot; sync-on-read values aggregated over
    the old group unless `survivors` (a dead engine took its part with it)."""
    try:
        from nbdist.core.variables import SyncOnReadVariable, VariableAggregation
        from nbdist.input.following import global_batch_size

        strategy = state.strategy()
        found = _tracked(state.namespace(), strategy)
        problems = []
        if keep == "replica-batch":
            for name, value, kind in found:
                if kind != "dataset" or value.recipe[0] != "dataset":
                    continue
                size = global_batch_size(value.recipe[1])
                if size is None or size % old:
                    problems.append(
                        f"{name} is not distributed from a DataLoader whose batch size "
                        f"divides over {old} replicas (its global batch: {size}), so its "
                        "per-replica batch cannot be kept"
                    )
        _pending["sync"] = {}
        if not problems and not survivors:
            for name, value, kind in found:
                if (
                    kind == "variable"
                    and isinstance(value, SyncOnReadVariable)
                    and value.aggregation is not VariableAggregation.NONE
                ):
                    _pending["sync"][name] = value.read_value().detach().clone()
        return _ok({"objects": [(name, kind) for name, _, kind in found], "problems": problems})
    except BaseException as error:
        return _wire.failure(error, "preparing the resize")


def regroup(config: dict[str, Any]) -> dict[str, Any]:
    """Step 2 on an engine that stays: form the group as `config["rank"]` of
    `config["world_size"]` at `config["master_addr"]:config["master_port"]`."""
    from nbdist.cluster.engine_side.health import _sigint_ignored

    try:
        with _sigint_ignored():
            from nbdist.cluster_resolver import TorchrunClusterResolver

            env = torchrun_environment(config)
            store_peers(config)  # the machines the store lets in (Note [Store peers])
            strategy = state.strategy()
            strategy.resize_group(
                rank=int(config["rank"]), world_size=int(config["world_size"]),
                master_addr=str(config["master_addr"]), master_port=int(config["master_port"]),
                generation="0", resolver=TorchrunClusterResolver(environ=env),
            )  # fmt: skip
            state.set_strategy(strategy, int(config["rank"]))
            from nbdist.cluster.engine_side.progress import EngineBar
            from nbdist.telemetry.metrics import set_home_replica

            set_home_replica(int(config["rank"]), engine=True, bar=EngineBar)
        return _ok({"prefix": group_prefix(), "device": str(strategy.extended.worker_devices[0])})
    except BaseException as error:
        return _wire.failure(error, "forming the process group at the new size")


# -- snapshot and adopt (Note [State that follows]) ----------------------------------------
class _Snapshotter(cloudpickle.CloudPickler):
    """Pickles replica 0's state (functions and classes of the engine's cells by value); the
    strategy, datasets and iterators go as references."""

    def __init__(self, file: io.BytesIO, strategy: Any):
        super().__init__(file, protocol=pickle.HIGHEST_PROTOCOL)
        self._strategy = strategy

    def persistent_id(self, obj: Any) -> Any:
        from nbdist.input import DistributedDataset, DistributedIterator

        if obj is self._strategy:
            return ("strategy",)
        if isinstance(obj, DistributedDataset) and obj.recipe is not None:
            return ("dataset", id(obj), obj.recipe)
        if isinstance(obj, DistributedIterator) and obj.origin is not None:
            dataset, rng = obj.origin
            return ("iterator", id(obj), dataset, rng, obj.state_dict())
        return None


class _Adopter(pickle.Unpickler):
    """Unpickles replica 0's state on a joining engine: the references become this engine's
    strategy, and datasets and iterators not made yet (`follow` makes them)."""

    def __init__(self, file: io.BytesIO, strategy: Any):
        super().__init__(file)
        self._strategy = strategy
        self._made: dict[Any, Any] = {}

    def persistent_load(self, pid: Any) -> Any:
        from nbdist.input import DistributedDataset, DistributedIterator

        if pid[0] == "strategy":
            return self._strategy
        key = pid[:2]
        if key not in self._made:
            if pid[0] == "dataset":
                made = DistributedDataset.__new__(DistributedDataset)
                _unmade[id(made)] = ("dataset", pid[2])
            else:
                made = DistributedIterator.__new__(DistributedIterator)
                _unmade[id(made)] = ("iterator", pid[2], pid[3], pid[4])
            self._made[key] = made
        return self._made[key]


_unmade: dict[int, tuple] = {}
"""Datasets and iterators adopted but not made yet: id -> what `follow` makes them from."""


def snapshot() -> dict[str, Any]:
    """Step 3 on replica 0: its strategy's state, pickled (`adopt` unpickles it)."""
    try:
        from nbdist.core.scale_hooks import on_scale

        strategy = state.strategy()
        found = _tracked(state.namespace(), strategy)
        payload = {
            "objects": {name: value for name, value, _ in found},
            "layout": strategy.resize_layout(),
            "hooks": [_wire.Call.of(fn, (), {}) for fn in on_scale.registered()],
            "sync": _pending["sync"],
        }
        buffer = io.BytesIO()
        try:
            _Snapshotter(buffer, strategy).dump(payload)
        except Exception as error:
            return _wire.failure(_unpicklable(found, strategy, error), "copying the state")
        return _ok({"blob": buffer.getvalue(), "names": [name for name, _, _ in found]})
    except BaseException as error:
        return _wire.failure(error, "copying the state")


def _unpicklable(found: list[tuple[str, Any, str]], strategy: Any, error: Exception) -> Exception:
    """A `SerializationError` naming the first object that cannot be copied to a new engine."""
    from nbdist.cluster.errors import SerializationError

    for name, value, kind in found:
        try:
            _Snapshotter(io.BytesIO(), strategy).dump(value)
        except Exception as inner:
            return SerializationError(
                f"The {kind} {name!r} on replica 0 cannot be copied to the new engines "
                f"({type(inner).__name__}: {inner}). Delete it (`del {name}` in a %%distribute "
                "cell) and re-create it in an @nd.on_scale function, then scale again."
            )
    return SerializationError(
        f"The strategy's state on replica 0 cannot be copied to the new engines "
        f"({type(error).__name__}: {error})."
    )


def adopt(blob: bytes) -> dict[str, Any]:
    """Step 3 on a joining engine: take replica 0's state into the namespace, and track its
    parameters as this engine's strategy's own (`resize_adopt`)."""
    try:
        from nbdist.core.scale_hooks import on_scale

        strategy = state.strategy()
        payload = _Adopter(io.BytesIO(blob), strategy).load()
        strategy.resize_adopt(payload["layout"])
        namespace = state.namespace()
        namespace.update(payload["objects"])
        on_scale.extend([call.function(namespace) for call in payload["hooks"]])
        _pending["sync"] = payload["sync"]
        return _ok({"names": sorted(payload["objects"])})
    except BaseException as error:
        return _wire.failure(error, "taking the state of replica 0")


# -- follow --------------------------------------------------------------------------------
def follow(keep: str, old: int, new: int, joined: bool, survivors: bool) -> dict[str, Any]:
    """Step 4a on every engine (no collective, so one engine's failure leaves no peer
    waiting): datasets, iterators and sync-on-read variables follow; what happened to each."""
    try:
        strategy = state.strategy()
        found = _tracked(state.namespace(), strategy)
        rank = int(state.rank() or 0)
        notes: dict[str, str] = {}
        datasets = _follow_datasets(found, strategy, keep, old, new, notes)
        _follow_iterators(found, datasets, keep, old, new, notes)
        _follow_sync_on_read(found, rank, joined, survivors)
        for name, _, kind in found:
            notes.setdefault(name, _KINDS.get(kind, kind))
        return _ok({"notes": notes})
    except BaseException as error:
        return _wire.failure(error, "following the resize")


_KINDS = {
    "module": "module, parameters from replica 0 (identical on every replica)",
    "optimizer": "optimizer, state from replica 0",
    "variable": "variable",
}


def settle(keep: str, old: int, new: int, reason: str, joined: bool, hooks: bytes) -> dict:
    """Step 4b on every engine at once: compare the gradient layout and every mirrored
    parameter across the workers (collectives), then run the `@nd.on_scale` functions."""
    try:
        strategy = state.strategy()
        strategy.check_resized()
        rank = int(state.rank() or 0)
        printed = io.StringIO()  # what the functions print goes into the scale's report
        with contextlib.redirect_stdout(printed):
            ran, failed = _run_hooks(strategy, keep, old, new, reason, joined, rank, hooks)
        return _ok({"hooks": ran, "hook_failures": failed, "printed": printed.getvalue()})
    except BaseException as error:
        return _wire.failure(error, "checking the replicas after the resize")


def _follow_datasets(
    found: list[tuple[str, Any, str]], strategy: Any, keep: str, old: int, new: int,
    notes: dict[str, str],
) -> dict[int, Any]:  # fmt: skip
    """Make every distributed dataset (named, or behind a named iterator) again at the new
    size, in place; `{id: dataset}` of those made."""
    from nbdist.input.following import global_batch_size, rebatched_loader

    datasets: dict[int, Any] = {}
    for _, value, kind in found:
        if kind == "iterator":
            origin = _unmade.get(id(value))
            dataset = origin[1] if origin else value.origin[0]
            datasets.setdefault(id(dataset), dataset)
        elif kind == "dataset":
            datasets.setdefault(id(value), value)
    names = {id(value): name for name, value, _ in found}
    for dataset in datasets.values():
        unmade = _unmade.pop(id(dataset), None)
        recipe = unmade[1] if unmade else dataset.recipe
        how, source, options = recipe
        detail = ""
        if how == "dataset" and keep == "replica-batch":
            size = global_batch_size(source)
            per_replica = (size or 0) // old
            rebatched = rebatched_loader(source, per_replica * new)
            if rebatched is not None and size:
                source = rebatched
                detail = f", global batch {size} → {per_replica * new}"
        if how == "dataset":
            made = strategy.experimental_distribute_dataset(source, options)
        else:
            made = strategy.distribute_datasets_from_function(source, options)
        dataset.take_over(made)
        if id(dataset) in names:
            notes[names[id(dataset)]] = f"dataset, re-sharded over {new} replicas{detail}"
    return datasets


def _follow_iterators(
    found: list[tuple[str, Any, str]], datasets: dict[int, Any], keep: str, old: int,
    new: int, notes: dict[str, str],
) -> None:  # fmt: skip
    """Continue every named iterator after the global batches (examples) it gave."""
    from nbdist.input.following import ResumingBatchSampler, restore_rng
    from nbdist.input.position import Resume

    for name, iterator, kind in found:
        if kind != "iterator":
            continue
        unmade = _unmade.pop(id(iterator), None)
        if unmade:
            dataset, rng, position = unmade[1], unmade[2], unmade[3]
        else:
            dataset, rng = iterator.origin
            position = iterator.state_dict()
        how, source, _ = dataset.recipe
        if how != "dataset":
            iterator.take_over(iter(dataset))
            notes[name] = (
                "iterator over distribute_datasets_from_function: its pipelines are built per "
                "worker, so it starts its epoch again"
            )
            continue
        restore_rng(source, rng)
        sampler = getattr(source, "batch_sampler", None)
        rebatched = keep == "replica-batch" and isinstance(sampler, ResumingBatchSampler)
        if rebatched:
            sampler.skip = int(position["examples"] or 0)
        fresh = iter(dataset)
        if rebatched:
            fresh.position.skipped(Resume(position["batches"], position["examples"]))
        else:
            fresh.load_state_dict(position)
        iterator.take_over(fresh)
        notes[name] = (
            f"iterator, continues after global batch {position['batches']} "
            f"({position['examples']} examples)"
        )


def _follow_sync_on_read(
    found: list[tuple[str, Any, str]], rank: int, joined: bool, survivors: bool
) -> None:
    """Give every sync-on-read variable its share of the aggregate `prepare` computed: SUM on
    replica 0 (0 elsewhere), MEAN and ONLY_FIRST_REPLICA on every replica. After a death
    (`survivors`) the survivors keep their values and joining engines start a SUM at 0."""
    import torch

    from nbdist.core.variables import SyncOnReadVariable, VariableAggregation

    values = _pending["sync"]
    for name, variable, kind in found:
        if kind != "variable" or not isinstance(variable, SyncOnReadVariable):
            continue
        is_sum = variable.aggregation is VariableAggregation.SUM
        if name in values:
            value = values[name]
            share = value if not is_sum or rank == 0 else torch.zeros_like(value)
        elif survivors and joined and is_sum:
            share = torch.zeros_like(variable.primary.read_value())
        else:
            continue
        with torch.no_grad():
            variable.primary.assign(share.to(variable.primary.read_value().device))
    _pending["sync"] = {}


def _run_hooks(
    strategy: Any, keep: str, old: int, new: int, reason: str, joined: bool, rank: int,
    sent: bytes,
) -> tuple[list[str], list[str]]:  # fmt: skip
    """Run the `@nd.on_scale` functions registered here, then those the notebook sent, in
    the strategy's scope; their names, and one line per failure."""
    from nbdist.core.scale_hooks import ScaleEvent, on_scale

    event = ScaleEvent(old=old, new=new, reason=reason, keep=keep, joined=joined, rank=rank)
    functions: list[Callable[..., Any]] = on_scale.registered()
    namespace = state.namespace()
    functions += [call.function(namespace) for call in (_wire.loads(sent) if sent else [])]
    ran, failed = [], []
    for fn in functions:
        name = getattr(fn, "__qualname__", repr(fn))
        ran.append(name)
        try:
            with strategy.scope():
                fn(event)
        except Exception as error:
            failed.append(f"{name}: {type(error).__name__}: {error}")
    return ran, failed


def _ok(value: Any) -> dict[str, Any]:
    return {"ok": True, "value": value, "elapsed": 0.0, "at": time.time()}
