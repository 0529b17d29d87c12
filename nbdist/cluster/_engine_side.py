"""Engine-side half of the cluster: bootstrap, and the entry points the notebook calls.

Runs inside ipyparallel engines, never in the notebook. `attach` is executed first (it learns
the engine's interactive namespace), `describe` reports where the engine runs, `bootstrap`
joins the `torch.distributed` group and puts `strategy` (a `MultiWorkerMirroredStrategy`), `nd`
and `torch` in the namespace. The other functions answer `EngineStrategy.run`/`run_steps` and
`Cluster.push`/`pull`: they take pickled requests (`_wire`) and return reply dicts, never raise.
"""

from __future__ import annotations

import contextlib
import os
import socket
import time
from typing import Any

from nbdist.cluster import _wire

__all__ = [
    "attach",
    "bootstrap",
    "call",
    "call_steps",
    "describe",
    "failure_reply",
    "fetch",
    "reform",
    "release_peers",
    "store",
    "where",
]

_state: dict[str, Any] = {"namespace": None, "strategy": None, "rank": None}


def attach(namespace: dict[str, Any]) -> None:
    """Remember the engine's interactive namespace (IPython's `user_ns`)."""
    _state["namespace"] = namespace


def describe(controller: str = "127.0.0.1") -> dict[str, Any]:
    """Where this engine runs: host, pid, its address as peers reach it, and a free port.

    `controller` is the controller's address; the engine's own address is the one its
    traffic to the controller leaves from (127.0.0.1 when the controller is local), so the
    rendezvous uses an interface the other engines can reach.
    """
    address = _address_towards(controller)
    bind = "127.0.0.1" if address.startswith("127.") else ""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((bind, 0))
        port = sock.getsockname()[1]
    return {
        "host": socket.gethostname(),
        "address": address,
        "pid": os.getpid(),
        "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
        "free_port": port,
        "cores": _cores(),
    }


def _address_towards(peer: str) -> str:
    """This machine's IPv4 address on the route to `peer` (no packet is sent)."""
    try:
        target = socket.gethostbyname(peer)
    except OSError:
        return socket.gethostbyname(socket.gethostname())
    if target.startswith("127."):
        return "127.0.0.1"
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        try:
            probe.connect((target, 9))
            return str(probe.getsockname()[0])
        except OSError:
            return socket.gethostbyname(socket.gethostname())


def bootstrap(config: dict[str, Any]) -> dict[str, Any]:
    """Join the engines' process group and create the engine's strategy.

    `config` holds `rank`, `world_size`, `local_rank`, `local_world_size`, `master_addr`,
    `master_port` and `implementation`. Sets the torchrun variables (so code on the engine,
    and `nd.MultiWorkerMirroredStrategy()` with no arguments, see the same cluster), drops
    `TF_CONFIG` (it would take precedence), sets torch's intra-op threads to this machine's
    cores divided among its engines, and stores `strategy`, `nd` and `torch` in the namespace.
    """
    namespace = _namespace()
    env = {
        "RANK": str(config["rank"]),
        "WORLD_SIZE": str(config["world_size"]),
        "LOCAL_RANK": str(config["local_rank"]),
        "LOCAL_WORLD_SIZE": str(config["local_world_size"]),
        "MASTER_ADDR": str(config["master_addr"]),
        "MASTER_PORT": str(config["master_port"]),
    }
    os.environ.pop("TF_CONFIG", None)
    os.environ.update(env)
    # the store listens on the rendezvous address only (Note [A store on one address])
    os.environ["NBDIST_BIND_STORE"] = "1"
    if config["master_addr"] in ("127.0.0.1", "localhost") and "GLOO_SOCKET_IFNAME" not in (
        os.environ
    ):
        loopback = _loopback_interface()
        if loopback:
            os.environ["GLOO_SOCKET_IFNAME"] = loopback
    import torch

    threads = max(1, _cores() // max(1, int(config["local_world_size"])))
    torch.set_num_threads(threads)
    import nbdist as nd
    from nbdist.cluster_resolver import TorchrunClusterResolver
    from nbdist.communication import CommunicationImplementation, CommunicationOptions

    options = CommunicationOptions(
        implementation=CommunicationImplementation.from_value(config["implementation"])
    )
    strategy = nd.MultiWorkerMirroredStrategy(
        TorchrunClusterResolver(environ=env), communication_options=options
    )
    _state["strategy"] = strategy
    _state["rank"] = int(config["rank"])
    from nbdist.metrics import set_home_replica

    set_home_replica(int(config["rank"]), engine=True)
    from nbdist.cluster.feed import start_publisher

    start_publisher()
    namespace.update(nd=nd, torch=torch, strategy=strategy)
    return {
        "device": str(strategy.extended.worker_devices[0]),
        "backend": strategy.process_group_backend,
        "threads": threads,
        "num_replicas_in_sync": strategy.num_replicas_in_sync,
        "prefix": group_prefix(),
    }


def call(payload: bytes) -> dict[str, Any]:
    """Run a pickled `_wire.Call` once, inside the engine strategy's `run` (replica context).

    Unpickling, rebuilding the function and resolving `nd.remote` references all happen inside
    `run`, so a failure there is published to the other engines like any replica error and
    releases them from collectives they are waiting in.
    """
    start = time.perf_counter()
    try:
        strategy = _strategy()
        namespace = _namespace()

        def replica_fn() -> Any:
            request: _wire.Call = _wire.loads(payload)
            fn = request.function(namespace)
            args, kwargs = _resolve((request.args, request.kwargs), namespace)
            return fn(*args, **kwargs)

        value = strategy.run(replica_fn)
    except BaseException as error:  # reported to the notebook, never raised here
        return failure_reply(error, "run")
    return _reply(value, start)


def call_steps(payload: bytes, steps: int) -> dict[str, Any]:
    """Run `fn(next(iterator))` for up to `steps` steps; reply with the last step's value.

    The payload is a `_wire.Call` whose `args` are `(iterator_ref,)`. Stops early when the
    iterator is exhausted; the reply's `"steps"` says how many steps ran.
    """
    start = time.perf_counter()
    done = 0
    value = None
    try:
        strategy = _strategy()
        namespace = _namespace()
        request: _wire.Call = _wire.loads(payload)
        fn = request.function(namespace)
        (iterator,), _ = _resolve((request.args, {}), namespace)
        if not hasattr(iterator, "__next__"):
            raise TypeError(
                f"run_steps needs an iterator on the engine, but {request.args[0]!r} is a "
                f"{type(iterator).__name__}. Create one there first, e.g. "
                "`it = iter(strategy.experimental_distribute_dataset(data))`."
            )
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
    reply = _reply(value, start)
    reply["steps"] = done
    return reply


def store(payload: bytes) -> dict[str, Any]:
    """Assign pickled `{name: value}` pairs in the engine's namespace (`Cluster.push`)."""
    try:
        values = _wire.loads(payload)
        _namespace().update(values)
    except BaseException as error:
        return _wire.failure(error, "push")
    return {"ok": True, "value": _wire.dumps(None), "elapsed": 0.0}


def fetch(payload: bytes) -> dict[str, Any]:
    """Reply with the values of the pickled list of names (`Cluster.pull`)."""
    start = time.perf_counter()
    try:
        from nbdist.cluster.remote import RemoteRef

        names = _wire.loads(payload)
        namespace = _namespace()
        value = [RemoteRef(name).resolve(namespace, _state["rank"]) for name in names]
    except BaseException as error:
        return _wire.failure(error, "pull")
    return _reply(value, start)


def release_peers(who: str) -> dict[str, Any]:
    """Abandon the process group if peers wait in a collective this engine will not join.

    Called by the notebook on an engine that finished (or failed) its cell or function while
    others still run (Note [Releasing blocked peers] in `calls`). `who` says what this engine
    did, e.g. "replica 1 finished a %%distribute cell". Peers that entered more collectives
    than this engine, or sit in a `torch.distributed` call of their own, wait for it in vain:
    the group is abandoned on every rank (Note [Waking a blocked collective] in
    `nbdist.collectives.abort`), which fails their call within a heartbeat with an error that
    names this replica; every engine keeps its Python state, and the notebook forms the group
    again once all are idle. Returns `{"waiting": [...], "left": bool}`.
    """
    group = getattr(_state["strategy"], "_group", None)
    if group is None or group.aborted is not None:
        return {"waiting": [], "left": False}
    waiting = group.peers_waiting()
    if not waiting:
        return {"waiting": [], "left": False}
    rank = _state["rank"]
    group.request_abort(
        f"{who} without entering the collective that replica(s) {waiting} wait in "
        f"(replica {rank} never arrived)",
        missing=[rank],
        secondary="failed" in who,
    )
    return {"waiting": waiting, "left": True}


def reform(generation: str) -> dict[str, Any]:
    """Form the engines' process group again under `generation` (all engines, all idle).

    The engine keeps its namespace and its `strategy` object; only the connections are new.
    """
    try:
        group = getattr(_strategy(), "_group", None)
        if group is not None:
            group.reform(generation)
    except BaseException as error:
        return _wire.failure(error, "re-forming the process group")
    return {"ok": True, "value": _wire.dumps(None), "elapsed": 0.0}


def group_prefix() -> str | None:
    """The current group generation's key prefix in the rendezvous store."""
    group = getattr(_state["strategy"], "_group", None)
    return None if group is None else group.prefix


def failure_reply(error: BaseException, stage: str) -> dict[str, Any]:
    """`_wire.failure`, knowing one more consequence: a `torch.distributed` call the user made
    directly that failed because a peer that failed left the group (Note [Raw collectives] in
    `nbdist.collectives.torch_dist`) is secondary, and its message names that peer."""
    reply = _wire.failure(error, stage)
    reply["where"] = where(error)
    if reply["secondary"]:
        return reply
    from nbdist.collectives.torch_dist import raised_in_torch_distributed

    group = getattr(_state["strategy"], "_group", None)
    if group is None or not raised_in_torch_distributed(error):
        return reply
    abandoned = group.abandoned
    if abandoned is not None:
        reason, _, secondary = abandoned
        reply["secondary"] = secondary
        reply["evalue"] = (
            f"released from a torch.distributed call: {reason}; the process group was "
            f"abandoned. Original error: {reply['evalue']}"
        )
        return reply
    with contextlib.suppress(Exception):
        failures = group.peer_failures()
        if failures:
            rank, message = min(failures.items())
            reply["secondary"] = True
            reply["evalue"] = (
                f"released from a torch.distributed call because replica {rank} failed "
                f"({message}); the process group is unusable until a restart. Original error: "
                f"{reply['evalue']}"
            )
    return reply


def where(error: BaseException) -> str:
    """Where the user's code was when `error` was raised, in a few words: the innermost frame
    outside nbdist, torch and ipyparallel (a cell's line with its source), and the
    `torch.distributed` function it was in, if any.

    Example: `"at line 3 (dist.recv(t, src=1)), in torch.distributed.recv"`.
    """
    import traceback as traceback_module

    from nbdist.collectives.liveness import C10D_FILE

    frames = traceback_module.extract_tb(error.__traceback__)
    library = f"{os.sep}torch{os.sep}"
    user = [f for f in frames if not _wire.is_internal(f.filename) and library not in f.filename]
    text = ""
    if user:
        frame = user[-1]
        source = (frame.line or "").strip()
        text = f"at line {frame.lineno}" + (f" ({source[:60]})" if source else "")
    inside = [f for f in frames if f.filename.endswith(C10D_FILE)]
    if inside:
        text += f", in torch.distributed.{inside[-1].name}"
    return text.lstrip(", ")


# -- helpers -------------------------------------------------------------------------------
def _reply(value: Any, start: float) -> dict[str, Any]:
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
    from nbdist._private_api import pytree
    from nbdist.cluster.remote import RemoteRef

    def leaf(item: Any) -> Any:
        return item.resolve(namespace, _state["rank"]) if isinstance(item, RemoteRef) else item

    return pytree.tree_map(leaf, structure, is_leaf=lambda item: isinstance(item, RemoteRef))


def _namespace() -> dict[str, Any]:
    namespace = _state["namespace"]
    if namespace is None:
        raise RuntimeError(
            "This engine was not attached to an nbdist Cluster (its namespace is unknown). "
            "Start engines with nd.Cluster(...).start()."
        )
    return namespace


def _strategy() -> Any:
    strategy = _state["strategy"]
    if strategy is None:
        raise RuntimeError(
            "This engine has no strategy yet: it did not finish joining the cluster. Restart "
            "the cluster with cluster.restart()."
        )
    return strategy


def _cores() -> int:
    with contextlib.suppress(AttributeError, OSError):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def _loopback_interface() -> str | None:
    try:
        import psutil
    except ImportError:  # pragma: no cover - psutil comes with ipyparallel
        return None
    for name, addresses in psutil.net_if_addrs().items():
        if any(getattr(a, "address", None) == "127.0.0.1" for a in addresses):
            return name
    return None
