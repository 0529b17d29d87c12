"""A Ctrl-C that Python swallows (raised inside a finalizer) still stops the `nbdist` command
(nbdist.app.interrupts). Each case runs in a fresh Python, whose main thread gets the SIGINT.
"""

from __future__ import annotations

import subprocess
import sys

SWALLOWED = r"""
import os, signal, sys, weakref
from nbdist.app.interrupts import raise_if_interrupted, remembered_interrupts

class Thing:
    pass

landed = []

def finalizer(_):
    landed.append("inside")
    os.kill(os.getpid(), signal.SIGINT)
    for _ in range(100_000):  # the handler runs by here, inside the callback, and is swallowed
        pass
    landed.append("after")

before = signal.getsignal(signal.SIGINT), sys.unraisablehook
with remembered_interrupts():
    thing = Thing()
    ref = weakref.ref(thing, finalizer)
    del thing
    print("landed:", landed, flush=True)
    try:
        raise_if_interrupted()
        print("not raised")
    except KeyboardInterrupt:
        print("raised again")
raise_if_interrupted()  # outside: forgotten
print("handlers restored:", (signal.getsignal(signal.SIGINT), sys.unraisablehook) == before)
"""

PLAIN = r"""
import os, signal
from nbdist.app.interrupts import raise_if_interrupted, remembered_interrupts
with remembered_interrupts():
    raise_if_interrupted()
    try:
        os.kill(os.getpid(), signal.SIGINT)
        for _ in range(100_000):
            pass
        print("not delivered")
    except KeyboardInterrupt:
        print("delivered at once")
"""


def _run(code: str) -> subprocess.CompletedProcess:
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return done


def test_a_ctrl_c_swallowed_by_a_finalizer_is_raised_again_without_a_traceback():
    done = _run(SWALLOWED)
    assert "landed: ['inside']" in done.stdout  # it interrupted the finalizer, which Python
    assert "raised again" in done.stdout  # swallows; the next check raises it again
    assert "handlers restored: True" in done.stdout
    assert "Exception ignored" not in done.stderr and "Traceback" not in done.stderr


def test_a_ctrl_c_still_raises_where_it_lands():
    assert "delivered at once" in _run(PLAIN).stdout


def test_other_unraisable_errors_are_still_reported():
    code = (
        "import gc\n"
        "from nbdist.app.interrupts import remembered_interrupts\n"
        "class Bad:\n"
        "    def __del__(self):\n"
        "        raise ValueError('from a finalizer')\n"
        "with remembered_interrupts():\n"
        "    Bad()\n"
        "    gc.collect()\n"
    )
    assert "ValueError: from a finalizer" in _run(code).stderr
