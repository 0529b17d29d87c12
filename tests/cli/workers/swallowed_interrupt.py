"""Worker script of tests/cli/test_interrupts.py (`SWALLOWED`): run by the test in a fresh Python
(`python -c`, as `__main__`); importing it runs nothing."""

import os
import signal
import sys
import weakref

from nbdist.app.interrupts import raise_if_interrupted, remembered_interrupts

if __name__ == "__main__":
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
