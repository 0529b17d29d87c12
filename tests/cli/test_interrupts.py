"""A Ctrl-C that Python swallows (raised inside a finalizer) still stops the `nbdist` command
(nbdist.app.interrupts). Each case runs in a fresh Python, whose main thread gets the SIGINT.
"""

from __future__ import annotations

import subprocess
import sys

from tests.cli.workers import worker_source

SWALLOWED = worker_source("swallowed_interrupt")

PLAIN = worker_source("plain_interrupt")


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
