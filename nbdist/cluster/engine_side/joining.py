"""Joining the cluster: where an engine runs (`describe`) and its one-time setup (`bootstrap`).

Runs on the engine, once per engine start: the notebook calls `describe` on every engine to
choose the rendezvous address and port, then `bootstrap` with each engine's rank. Sent by
reference, so the engine imports this module (the same nbdist on both sides).

Example (what the notebook does, through ipyparallel)::

    info = view.apply_async(joining.describe, "127.0.0.1").get()   # host, pid, free port, ...
    view.apply_async(joining.bootstrap, config).get()               # joins the group
"""

from __future__ import annotations

import contextlib
import os
import socket
from typing import Any

from nbdist.cluster.engine_side import state
from nbdist.cluster.engine_side.health import group_prefix

__all__ = ["bootstrap", "cores", "describe", "torchrun_environment"]


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
        "cores": cores(),
    }


def torchrun_environment(config: dict[str, Any]) -> dict[str, str]:
    """The torchrun variables of this engine's place in the group (`rank`, `world_size`,
    `local_rank`, `local_world_size`, `master_addr`, `master_port` of `config`), set in
    `os.environ` too; at bootstrap and again at each resize (`resize.regroup`).

    Example (changes this process's environment, so not run here)::

        env = torchrun_environment({"rank": 0, "world_size": 2, ...})
        env["RANK"], os.environ["WORLD_SIZE"]       # ('0', '2')
    """
    env = {
        "RANK": str(config["rank"]),
        "WORLD_SIZE": str(config["world_size"]),
        "LOCAL_RANK": str(config["local_rank"]),
        "LOCAL_WORLD_SIZE": str(config["local_world_size"]),
        "MASTER_ADDR": str(config["master_addr"]),
        "MASTER_PORT": str(config["master_port"]),
    }
    os.environ.update(env)
    return env


def bootstrap(config: dict[str, Any]) -> dict[str, Any]:
    """Join the engines' process group and create the engine's strategy.

    `config` holds `rank`, `world_size`, `local_rank`, `local_world_size`, `master_addr`,
    `master_port`, `implementation` and the strategy's other `CommunicationOptions`
    (`timeout_seconds`, `bytes_per_pack`, `compression`; absent: the defaults). Sets the
    torchrun variables (so code on the engine, and `nd.MultiWorkerMirroredStrategy()` with no
    arguments, see the same cluster), drops `TF_CONFIG` (it would take precedence), sets
    torch's intra-op threads to this machine's cores divided among its engines, and stores
    `strategy`, `nd` and `torch` in the namespace. `strategy` is a `MultiWorkerMirroredStrategy`,
    or with `config["strategy"] == "fully_sharded"` a `FullyShardedStrategy`.
    """
    namespace = state.namespace()
    os.environ.pop("TF_CONFIG", None)
    env = torchrun_environment(config)
    # the store listens on the rendezvous address only (Note [A store on one address])
    os.environ["NBDIST_BIND_STORE"] = "1"
    store_peers(config)
    if config["master_addr"] in ("127.0.0.1", "localhost") and "GLOO_SOCKET_IFNAME" not in (
        os.environ
    ):
        loopback = _loopback_interface()
        if loopback:
            os.environ["GLOO_SOCKET_IFNAME"] = loopback
    elif "GLOO_SOCKET_IFNAME" not in os.environ:
        # gloo binds to what this machine's name resolves to (127.0.1.1 on Debian, which no
        # other host reaches): give it the interface on the route to the rendezvous
        from nbdist.cluster.addresses import address_towards, interface_with

        own = address_towards(str(config["master_addr"]))
        interface = interface_with(own) if own else None
        if interface:
            os.environ["GLOO_SOCKET_IFNAME"] = interface
    import torch

    threads = max(1, cores() // max(1, int(config["local_world_size"])))
    torch.set_num_threads(threads)
    import nbdist as nd
    from nbdist.cluster_resolver import TorchrunClusterResolver
    from nbdist.collectives import held
    from nbdist.core.reduce.options import CommunicationImplementation, CommunicationOptions

    held.enable()  # Note [Held replicas]: the debugger suspends the collective timeout
    options = CommunicationOptions(
        implementation=CommunicationImplementation.from_value(config["implementation"]),
        timeout_seconds=config.get("timeout_seconds"),
        bytes_per_pack=config.get("bytes_per_pack", 0),
        compression=config.get("compression"),
    )
    make = (
        nd.experimental.FullyShardedStrategy
        if config.get("strategy") == "fully_sharded"
        else nd.MultiWorkerMirroredStrategy
    )
    strategy = make(TorchrunClusterResolver(environ=env), communication_options=options)
    state.set_strategy(strategy, int(config["rank"]))
    from nbdist.cluster.engine_side.progress import EngineBar
    from nbdist.telemetry.metrics import set_home_replica

    set_home_replica(int(config["rank"]), engine=True, bar=EngineBar)
    from nbdist.cluster.engine_side.publisher import start_publisher

    start_publisher()
    from nbdist.cluster.engine_side.stacks import start_stack_server

    stacks = start_stack_server(_address_towards(str(config["master_addr"])))
    namespace.update(nd=nd, torch=torch, strategy=strategy)
    return {
        "device": str(strategy.extended.worker_devices[0]),
        "backend": strategy.process_group_backend,
        "threads": threads,
        "num_replicas_in_sync": strategy.num_replicas_in_sync,
        "prefix": group_prefix(),
        "stacks": stacks,
    }


def store_peers(config: dict[str, Any]) -> None:
    """Let only the cluster's machines reach the store this engine may host (Note [Store
    peers] in `nbdist.collectives.peer_filter`): `config["peers"]`, set by the notebook."""
    from nbdist.collectives.peer_filter import STORE_PEERS_ENV

    if config.get("peers"):
        os.environ[STORE_PEERS_ENV] = ",".join(str(p) for p in config["peers"])


def cores() -> int:
    """CPU cores this process may run on (its affinity), for torch's intra-op threads."""
    with contextlib.suppress(AttributeError, OSError):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


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


def _loopback_interface() -> str | None:
    try:
        import psutil
    except ImportError:  # pragma: no cover - psutil comes with ipyparallel
        return None
    for name, addresses in psutil.net_if_addrs().items():
        if any(getattr(a, "address", None) == "127.0.0.1" for a in addresses):
            return name
    return None
