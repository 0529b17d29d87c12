"""Holding Ctrl-C over a few statements that must not be cut in the middle.

A KeyboardInterrupt raised inside ipykernel's output flush (a zmq send to its IO thread) or
while a cluster tears down can leave that machinery half done; the notebook side of nbdist
therefore holds SIGINT over such statements and raises it right after them, where its wait
loops turn it into an interrupt of the engines.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator

__all__ = ["interrupts_deferred"]


@contextlib.contextmanager
def interrupts_deferred() -> Iterator[None]:
    """Hold Ctrl-C (SIGINT in the main thread) until the block ends, then raise it.

    Example:
        >>> with interrupts_deferred():
        ...     print("written whole")
        written whole
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    pending: list[int] = []
    previous = signal.signal(signal.SIGINT, lambda signum, frame: pending.append(signum))
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, signal.default_int_handler if previous is None else previous)
    if pending:
        raise KeyboardInterrupt
