"""The two watches that notice a lost peer without waiting for a timeout, on 127.0.0.1.

- `HeartbeatWatch` (the notebook, Note [A host that drops off] in `nbdist.cluster.heartbeats`)
  names a rank whose heartbeat in a real `TCPStore` stopped changing, and every rank once the
  store itself stops answering; a rank that keeps beating is never named.
- `watch_controller` (an engine started over ssh, Note [Engines without a parent] in
  `nbdist.cluster.launch.controller_watch`) stops its process once the controller's port
  refuses connections for a while, and not while the port answers.

tests/hosts/ checks both across namespace hosts (a cut link, a killed kernel).
"""

from __future__ import annotations

import socket
import subprocess
import sys
import textwrap
import threading
import time
from datetime import timedelta

import torch.distributed as dist

from nbdist.cluster.heartbeats import HeartbeatWatch
from nbdist.cluster.launch.parent_watch import ORPHAN_EXIT_CODE
from nbdist.testing import free_port

PREFIX = "nbdist/r1/"


def _wait_for(condition, limit: float) -> float:
    began = time.monotonic()
    while not condition():
        assert time.monotonic() - began < limit, f"not within {limit} s"
        time.sleep(0.05)  # polling (bounded by the limit)
    return time.monotonic() - began


def test_heartbeat_watch_names_the_rank_that_went_quiet_then_all_when_the_store_goes():
    port = free_port()
    stores = [dist.TCPStore("127.0.0.1", port, None, True, timedelta(seconds=10),
                            wait_for_workers=False)]  # fmt: skip (the server, while listed)
    stop = threading.Event()

    def beat() -> None:  # rank 0 beats; rank 1 published once and went quiet
        count = 0
        while not stop.is_set():
            count += 1
            stores[0].set(f"{PREFIX}hb/0", f"{time.time():.3f} {count} 0")
            stop.wait(0.2)

    stores[0].set(f"{PREFIX}hb/1", "1.0 3 0")
    beating = threading.Thread(target=beat, daemon=True)
    beating.start()
    watch = HeartbeatWatch(("127.0.0.1", port, PREFIX), [0, 1], lost_after=1.5)
    watch.start()
    try:
        assert watch.lost() == {}
        took = _wait_for(lambda: 1 in watch.lost(), 10)
        assert 1.0 < took < 5.0
        assert 0 not in watch.lost()
        assert "no heartbeat for" in watch.lost()[1]
        stop.set()
        beating.join(timeout=5)
        stores.clear()  # the store is gone: every rank is lost, and the message says why
        _wait_for(lambda: "rendezvous store" in watch.lost().get(0, ""), 15)
        assert set(watch.lost()) == {0, 1}
    finally:
        stop.set()
        watch.stop()


def test_an_engine_stops_once_its_controller_refuses_connections():
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(16)
    port = listener.getsockname()[1]
    script = textwrap.dedent(f"""
        import time
        from nbdist.cluster.launch.controller_watch import watch_controller
        watch_controller(lambda: "tcp://127.0.0.1:{port}", gone_after=1.0)
        print("watching", flush=True)
        time.sleep(120)
    """)
    process = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    try:
        assert process.stdout.readline().strip() == "watching"
        time.sleep(3.0)  # the controller answers meanwhile: the engine stays
        assert process.poll() is None
        listener.close()
        began = time.monotonic()
        code = process.wait(timeout=20)
        # SIGTERM (no handler in this script) ends it, or the watch's own exit after 3 s
        assert code in (-15, ORPHAN_EXIT_CODE)
        assert time.monotonic() - began < 10
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(timeout=10)
