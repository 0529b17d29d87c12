"""`watch_controller`: an engine on another host stops once its controller is gone.

Note [Engines without a parent]: an engine started over ssh has no parent to watch
(`parent_watch`): ipyparallel's ssh receiver starts it in the background and exits, and the
ssh session ends with it. So when the notebook's kernel is killed (the controller then stops
itself, `parent_watch`), or ssh no longer reaches the host to stop it, nothing would stop such
an engine: ipyparallel's own check of the controller's heartbeat runs on the engine's event
loop, which a running cell blocks, and waits 50 missed beats. Instead a daemon thread opens a
TCP connection to the controller's registration port every `POLL_S` (and closes it at once):
while the controller's process lives, its kernel accepts (however busy the process is); once
the controller is gone the connection is refused, and once the host is cut off it times out.
After `GONE_AFTER_S` of failures in a row the engine stops as an orphaned one does (its
children by pid, then SIGTERM to itself, then exit).

Example (inside an engine, once ipyparallel has read its connection file)::

    watch_controller(lambda: "tcp://198.18.0.10:40123")
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import Callable

__all__ = ["GONE_AFTER_S", "POLL_S", "watch_controller"]

POLL_S = 0.5
"""Seconds between looks at the controller."""
GONE_AFTER_S = 4.0
"""Seconds of refused or silent connections after which the controller counts as gone."""
_CONNECT_S = 1.0


def watch_controller(
    url: Callable[[], str | None], gone_after: float = GONE_AFTER_S
) -> threading.Thread:
    """Start the daemon thread that stops this process once the controller at `url()` (e.g.
    "tcp://10.0.0.5:40123"; None until known) stops answering for `gone_after` seconds."""
    thread = threading.Thread(
        target=_watch, args=(url, gone_after), name="nbdist-controller-watch", daemon=True
    )
    thread.start()
    return thread


def _address(url: str) -> tuple[str, int] | None:
    """`("10.0.0.5", 40123)` from "tcp://10.0.0.5:40123"; None for another form."""
    rest = url.partition("://")[2]
    host, _, port = rest.rpartition(":")
    if not host or not port.isdigit():
        return None
    return host.strip("[]"), int(port)


def _answers(address: tuple[str, int]) -> bool:
    with contextlib.suppress(OSError), socket.create_connection(address, timeout=_CONNECT_S):
        return True
    return False


def _watch(url: Callable[[], str | None], gone_after: float) -> None:
    address = None
    while address is None:  # until ipyparallel has read the connection file
        text = url()
        address = _address(text) if text else None
        if address is None:
            time.sleep(POLL_S)
    silent_since: float | None = None
    while True:
        if _answers(address):
            silent_since = None
        else:
            now = time.monotonic()
            silent_since = silent_since or now
            if now - silent_since >= gone_after:
                break
        time.sleep(POLL_S)
    from nbdist.cluster.launch.parent_watch import stop_orphan

    stop_orphan()
