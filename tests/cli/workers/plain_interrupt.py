"""Worker script of tests/cli/test_interrupts.py (`PLAIN`): run by the test in a fresh Python
(`python -c`, as `__main__`); importing it runs nothing."""

import os
import signal

from nbdist.app.interrupts import raise_if_interrupted, remembered_interrupts

if __name__ == "__main__":
    with remembered_interrupts():
        raise_if_interrupted()
        try:
            os.kill(os.getpid(), signal.SIGINT)
            for _ in range(100_000):
                pass
            print("not delivered")
        except KeyboardInterrupt:
            print("delivered at once")
