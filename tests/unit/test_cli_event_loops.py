"""`close_abandoned_event_loops`: what `nbdist demo` runs after a Ctrl-C, before it exits."""

from __future__ import annotations

import asyncio
import threading
import weakref

from nbdist.app.cli import close_abandoned_event_loops


class _Thing:
    pass


def test_closes_loops_nobody_runs_and_leaves_running_ones_and_other_objects_alone():
    abandoned = asyncio.new_event_loop()
    running = asyncio.new_event_loop()
    started = threading.Event()
    running.call_soon(started.set)
    thread = threading.Thread(target=running.run_forever)
    thread.start()
    try:
        assert started.wait(10)
        dead = _Thing()
        proxy = weakref.proxy(dead)
        del dead  # a dead proxy raises on isinstance(); it must be skipped, not fail the exit
        closed = close_abandoned_event_loops([abandoned, running, proxy, object(), None])
        assert closed == 1 and abandoned.is_closed()
        assert running.is_running() and not running.is_closed()
    finally:
        running.call_soon_threadsafe(running.stop)
        thread.join(10)
        running.close()
    assert not thread.is_alive()
