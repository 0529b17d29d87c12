"""Free local ports and the environments that tell worker processes where their peers are.

`torchrun_env` gives the variables `torchrun` sets (what `init_process_group("gloo")` reads
from `env://`); `tf_config_env` gives TensorFlow's `TF_CONFIG`. Both address 127.0.0.1 only.
Imports only the standard library.
"""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Sequence

from nbdist.errors import InvalidArgumentError

__all__ = [
    "LOCALHOST",
    "free_port",
    "free_ports",
    "tf_config_env",
    "torchrun_env",
    "wait_for_listener",
]

LOCALHOST = "127.0.0.1"
"""The only address the test launcher uses: nothing leaves the machine."""


def free_port() -> int:
    """Return a TCP port on 127.0.0.1 that was free a moment ago.

    The kernel picks it (bind to port 0), so parallel pytest-xdist workers do not collide.
    Another process may still take it before you bind it; use it at once.

    Example:
        >>> 0 < free_port() < 65536
        True
    """
    return free_ports(1)[0]


def free_ports(n: int) -> list[int]:
    """Return `n` distinct TCP ports on 127.0.0.1 that were free a moment ago.

    All `n` sockets are held open together while the kernel picks, so the ports differ.

    Args:
        n: How many ports, at least 1.

    Example:
        >>> ports = free_ports(3)
        >>> len(set(ports))
        3
    """
    if not isinstance(n, int) or isinstance(n, bool) or n < 1:
        raise InvalidArgumentError(
            f"free_ports needs a count of at least 1, got {n!r}; pass e.g. 2."
        )
    sockets: list[socket.socket] = []
    try:
        for _ in range(n):
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sockets.append(sock)
            sock.bind((LOCALHOST, 0))
        return [sock.getsockname()[1] for sock in sockets]
    finally:
        for sock in sockets:
            sock.close()


def wait_for_listener(port: int, host: str = LOCALHOST, timeout: float = 60.0) -> None:
    """Return once something accepts TCP connections on `host:port` (a server process started
    by a test has come up); the probe connects and closes at once.

    Raises:
        TimeoutError: nothing listened within `timeout` seconds, naming the address.

    Example:
        >>> with socket.create_server((LOCALHOST, 0)) as server:
        ...     wait_for_listener(server.getsockname()[1], timeout=5)
    """
    deadline = time.monotonic() + timeout
    pause = threading.Event()
    while True:
        try:
            left = max(0.1, deadline - time.monotonic())
            with socket.create_connection((host, port), timeout=left):
                return
        except OSError:
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"nothing listened on {host}:{port} within {timeout:g} s; is the server "
                    "process running (look at its output)?"
                ) from None
            pause.wait(0.05)  # a refused connection fails at once: poll at a pace


def _check_rank(rank: int, world_size: int, what: str = "rank") -> None:
    if not isinstance(world_size, int) or world_size < 1:
        raise InvalidArgumentError(f"world_size must be an int of at least 1, got {world_size!r}.")
    if not isinstance(rank, int) or not 0 <= rank < world_size:
        raise InvalidArgumentError(
            f"{what} must be an int in [0, {world_size}) for world_size={world_size}, "
            f"got {rank!r}; ranks count from 0."
        )


def _check_port(port: int) -> None:
    if not isinstance(port, int) or not 0 < port < 65536:
        raise InvalidArgumentError(
            f"A port must be an int in 1..65535, got {port!r}; use free_port()."
        )


def torchrun_env(
    rank: int,
    world_size: int,
    port: int,
    *,
    local_rank: int | None = None,
    local_world_size: int | None = None,
) -> dict[str, str]:
    """Return the variables `torchrun` would set for one rank of a single-machine job.

    `RANK`, `WORLD_SIZE`, `LOCAL_RANK`, `LOCAL_WORLD_SIZE`, `MASTER_ADDR` (127.0.0.1) and
    `MASTER_PORT`: enough for `torch.distributed.init_process_group("gloo")` with the default
    `env://` init method.

    Args:
        rank: This process's global rank, in `[0, world_size)`.
        world_size: Number of processes in the job.
        port: The rank-0 rendezvous port, the same for every rank (see `free_port`).
        local_rank: Rank on this machine; defaults to `rank` (every rank is local).
        local_world_size: Processes on this machine; defaults to `world_size`.

    Example:
        >>> env = torchrun_env(1, 2, 29500)
        >>> env["RANK"], env["WORLD_SIZE"], env["MASTER_ADDR"], env["MASTER_PORT"]
        ('1', '2', '127.0.0.1', '29500')
    """
    _check_rank(rank, world_size)
    _check_port(port)
    local_world_size = world_size if local_world_size is None else local_world_size
    local_rank = rank if local_rank is None else local_rank
    _check_rank(local_rank, local_world_size, "local_rank")
    return {
        "RANK": str(rank),
        "WORLD_SIZE": str(world_size),
        "LOCAL_RANK": str(local_rank),
        "LOCAL_WORLD_SIZE": str(local_world_size),
        "MASTER_ADDR": LOCALHOST,
        "MASTER_PORT": str(port),
    }


def tf_config_env(rank: int, world_size: int, ports: Sequence[int]) -> dict[str, str]:
    """Return `{"TF_CONFIG": ...}` for worker `rank` of a local multi-worker cluster.

    The JSON is TensorFlow's: `{"cluster": {"worker": ["127.0.0.1:p0", ...]},
    "task": {"type": "worker", "index": rank}}`.

    Args:
        rank: This worker's index, in `[0, world_size)`.
        world_size: Number of workers.
        ports: One port per worker, `world_size` of them (see `free_ports`).

    Example:
        >>> import json
        >>> config = json.loads(tf_config_env(1, 2, [2222, 2223])["TF_CONFIG"])
        >>> config["cluster"]["worker"], config["task"]
        (['127.0.0.1:2222', '127.0.0.1:2223'], {'type': 'worker', 'index': 1})
    """
    _check_rank(rank, world_size)
    ports = list(ports)
    if len(ports) != world_size:
        raise InvalidArgumentError(
            f"tf_config_env needs one port per worker: world_size={world_size} but "
            f"{len(ports)} ports were given; pass free_ports({world_size})."
        )
    for port in ports:
        _check_port(port)
    config = {
        "cluster": {"worker": [f"{LOCALHOST}:{port}" for port in ports]},
        "task": {"type": "worker", "index": rank},
    }
    return {"TF_CONFIG": json.dumps(config)}
