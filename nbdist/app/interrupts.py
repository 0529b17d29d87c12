"""A Ctrl-C that is never lost: for the `nbdist` command, which must stop when asked.

Python turns SIGINT into a `KeyboardInterrupt` raised wherever the main thread is. When that is
inside a weak-reference callback or a finalizer (the import system runs one each time a module
lock is freed, so any import can be the place), Python prints "Exception ignored in ..." and
carries on: the interrupt is gone. Seen on a loaded CI machine: `nbdist demo`, interrupted just
as training began, trained to the end and exited 0.

`remembered_interrupts()` installs a SIGINT handler that notes the interrupt before raising it,
and `raise_if_interrupted()`, called where the demo can stop cleanly (after start, between
steps), raises it again if it was swallowed. Python's "Exception ignored" traceback for it is
not printed either: the interrupt is not ignored, and the user sees the command's one line.
Without the handler installed (in a notebook, in a library call) the check does nothing: the
kernel handles its own interrupts.

Example:
    >>> with remembered_interrupts():
    ...     raise_if_interrupted()  # no Ctrl-C yet: nothing happens
"""

from __future__ import annotations

import contextlib
import signal
import sys
import threading
from collections.abc import Iterator
from types import FrameType
from typing import Any

__all__ = ["raise_if_interrupted", "remembered_interrupts"]

_pending = threading.Event()


def _note_and_raise(signum: int, frame: FrameType | None) -> None:
    _pending.set()
    raise KeyboardInterrupt


@contextlib.contextmanager
def remembered_interrupts() -> Iterator[None]:
    """Within: a Ctrl-C raises `KeyboardInterrupt` as usual and is also remembered, so that
    `raise_if_interrupted` raises it again if something swallowed it. Only from the main
    thread (elsewhere, and where SIGINT is ignored, it changes nothing)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.getsignal(signal.SIGINT)
    if previous is signal.SIG_IGN:  # started in the background with SIGINT ignored: keep it
        yield
        return
    previous_hook = sys.unraisablehook

    def quiet_when_remembered(unraisable: Any) -> None:
        if unraisable.exc_type is KeyboardInterrupt and _pending.is_set():
            return  # raised again at the next `raise_if_interrupted`
        previous_hook(unraisable)

    _pending.clear()
    signal.signal(signal.SIGINT, _note_and_raise)
    sys.unraisablehook = quiet_when_remembered
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
        sys.unraisablehook = previous_hook
        _pending.clear()


def raise_if_interrupted() -> None:
    """Raise `KeyboardInterrupt` if a Ctrl-C came within `remembered_interrupts()` (once
    raised, it stays remembered: the command is on its way out)."""
    if _pending.is_set():
        raise KeyboardInterrupt
