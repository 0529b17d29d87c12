"""The engine's entry points for the notebook's calls: `strategy.run`, `run_steps`, `push`, `pull`.

Runs on the engine: the notebook passes `call`, `call_steps`, `store` or `fetch` itself (a
function, sent by reference, so the engine imports this module: the same nbdist on both sides)
to `nbdist.cluster.supervisor.supervise`, with a pickled request (`_wire`). Each returns a
reply dict and never raises, so the notebook can say which replica failed and why.

Example (what the notebook does, through ipyparallel)::

    reply = view.apply_async(calls.call, _wire.encode(step, (), {})).get()
    reply["ok"], _wire.loads(reply["value"])
"""

from __future__ import annotations

import time
from typing import Any

from nbdist.cluster import _wire
from nbdist.cluster.engine_side import guards, state
from nbdist.cluster.engine_side.failures import failure_reply

__all__ = ["call", "call_steps", "fetch", "store"]


def call(payload: bytes) -> dict[str, Any]:
    """Run a pickled `_wire.Call` once, inside the engine strategy's `run` (replica context).

    Unpickling, rebuilding the function and resolving `nd.remote` references all happen inside
    `run`, so a failure there is published to the other engines like any replica error and
    releases them from collectives they are waiting in.
    """
    start = time.perf_counter()
    try:
        strategy = state.strategy()
        namespace = state.namespace()

        def replica_fn() -> Any:
            request: _wire.Call = _wire.loads(payload)
            fn = request.function(namespace)
            args, kwargs = _resolve((request.args, request.kwargs), namespace)
            return fn(*args, **kwargs)

        with guards.watched_call():
            value = strategy.run(replica_fn)
    except BaseException as error:  # reported to the notebook, never raised here
        return failure_reply(error, "run")
    return guards.noting_the_group(_reply(value, start))


def call_steps(payload: bytes, steps: int) -> dict[str, Any]:
    """Run `fn(next(iterator))` for up to `steps` steps; reply with the last step's value.

    The payload is a `_wire.Call` whose `args` are `(iterator_ref,)`. Stops early when the
    iterator is exhausted; the reply's `"steps"` says how many steps ran.
    """
    start = time.perf_counter()
    done = 0
    value = None
    try:
        strategy = state.strategy()
        namespace = state.namespace()
        request: _wire.Call = _wire.loads(payload)
        fn = request.function(namespace)
        (iterator,), _ = _resolve((request.args, {}), namespace)
        if not hasattr(iterator, "__next__"):
            from nbdist.errors import ArgumentTypeError

            raise ArgumentTypeError(
                f"run_steps needs an iterator on the engine, but {request.args[0]!r} is a "
                f"{type(iterator).__name__}. Create one there first, e.g. "
                "`it = iter(strategy.experimental_distribute_dataset(data))`."
            )
        with guards.watched_call():
            for _ in range(steps):
                try:
                    batch = next(iterator)
                except StopIteration:
                    break
                value = strategy.run(fn, args=(batch,))
                done += 1
    except BaseException as error:
        reply = failure_reply(error, f"step {done + 1}")
        reply["steps"] = done
        return reply
    reply = guards.noting_the_group(_reply(value, start))
    reply["steps"] = done
    return reply


def store(payload: bytes) -> dict[str, Any]:
    """Assign pickled `{name: value}` pairs in the engine's namespace (`Cluster.push`)."""
    try:
        values = _wire.loads(payload)
        state.namespace().update(values)
    except BaseException as error:
        return _wire.failure(error, "push")
    return {"ok": True, "value": _wire.dumps(None), "elapsed": 0.0}


def fetch(payload: bytes) -> dict[str, Any]:
    """Reply with the values of the pickled list of names (`Cluster.pull`)."""
    start = time.perf_counter()
    try:
        from nbdist.cluster.refs import RemoteRef

        names = _wire.loads(payload)
        namespace = state.namespace()
        value = [_read(RemoteRef(name).resolve(namespace, state.rank())) for name in names]
    except BaseException as error:
        return _wire.failure(error, "pull")
    return _reply(value, start)


def _read(value: Any) -> Any:
    """What `cluster.pull` sends back for an object: an `nd.Variable` as its value read here,
    outside any replica function, so by the one rule for reading (docs/notebooks.md) a
    sync-on-read variable comes back aggregated over the replicas (every engine reads it at
    once: a collective), a mirrored one as its value."""
    from nbdist.core.variables import Variable

    return value.read_value() if isinstance(value, Variable) else value


def _reply(value: Any, start: float) -> dict[str, Any]:
    """A success reply carrying `value` (tensors moved to the CPU), or a failure naming why
    the value cannot travel back."""
    try:
        data = _wire.dumps(_wire.portable(value))
    except Exception as error:
        message = (
            f"The function ran, but its result (a {type(value).__name__}) cannot be sent back: "
            f"{type(error).__name__}: {error}. Return tensors, numbers or containers of them, "
            "and keep other objects on the engine (assign them to a global)."
        )
        reply = _wire.failure(error, "sending the result back")
        reply.update(ename="SerializationError", evalue=message, traceback="")
        return reply
    return {"ok": True, "value": data, "elapsed": time.perf_counter() - start}


def _resolve(structure: Any, namespace: dict[str, Any]) -> Any:
    """`structure` with every `nd.remote` reference replaced by the engine's value."""
    from nbdist._private_api import pytree
    from nbdist.cluster.refs import RemoteRef

    def leaf(item: Any) -> Any:
        return item.resolve(namespace, state.rank()) if isinstance(item, RemoteRef) else item

    return pytree.tree_map(leaf, structure, is_leaf=lambda item: isinstance(item, RemoteRef))
