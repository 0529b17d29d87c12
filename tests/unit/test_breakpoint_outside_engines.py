"""`nd.breakpoint(replica=None)` outside the engines (API.md §9a): a replica that is not the
one named goes on; with no notebook and no terminal (a worker under torchrun, whose stdin is
not a TTY) it raises `ContextError` naming the fix instead of waiting for input that never
comes; a replica id that is not an int is refused."""

from __future__ import annotations

import subprocess
import sys

import pytest

import nbdist as nd
from nbdist.errors import ArgumentTypeError


def test_a_replica_other_than_the_one_named_goes_on():
    assert nd.breakpoint(replica=3) is None  # this process is replica 0


@pytest.mark.parametrize("bad", ["1", 1.0, True])
def test_a_replica_id_that_is_not_an_int_is_refused(bad):
    with pytest.raises(ArgumentTypeError, match=r"takes a replica id \(int\) or None"):
        nd.breakpoint(replica=bad)


def test_without_a_notebook_or_terminal_it_names_the_fix():
    script = (
        "import nbdist as nd\n"
        "try:\n"
        "    nd.breakpoint()\n"
        "except Exception as error:\n"
        "    print(type(error).__name__, error)\n"
    )
    done = subprocess.run([sys.executable, "-c", script], stdin=subprocess.DEVNULL,
                          capture_output=True, text=True, timeout=120)  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    out = done.stdout
    assert out.startswith("ContextError nd.breakpoint() on replica 0: no notebook"), out
    assert "stdin is not a TTY" in out and "%%distribute cell" in out, out
    assert "torch.distributed.breakpoint(rank)" in out, out
