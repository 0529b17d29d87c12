"""`report`: how a worker started by `run_workers` hands a value back.

Runs inside the workers, which load this file by path (not as part of nbdist) so that a worker
that needs neither pays for importing neither nbdist nor torch: imports only the standard
library, and nothing may be added here that imports more.
"""

from __future__ import annotations

import faulthandler
import json
import os
import signal
import sys
from typing import Any

from nbdist.errors import ArgumentTypeError, ContextError

__all__ = ["RESULT_ENV", "report"]

RESULT_ENV = "NBDIST_TEST_RESULT"
"""Names the file `report` writes; `run_workers` sets it per worker."""


def _jsonable(obj: Any) -> Any:
    tolist = getattr(obj, "tolist", None)  # torch tensors, numpy arrays and numpy scalars
    if callable(tolist):
        return tolist()
    if isinstance(obj, (set, frozenset)):
        return sorted(obj)
    raise TypeError(f"Object of type {type(obj).__name__} is not JSON serializable")


def report(obj: Any) -> None:
    """Hand `obj` back to `run_workers` as this worker's `WorkerResult.result`.

    `obj` may hold JSON values, tuples (which come back as lists) and anything with `.tolist()`
    (torch tensors, numpy arrays), nested in lists and dicts. A later call replaces an earlier
    one. Inside code run by `run_workers`, `report` is also predefined, no import needed.

    Args:
        obj: The value to hand back.

    Example:
        >>> from nbdist.testing import run_workers
        >>> results = run_workers("report({'rank': 0, 'loss': (0.5, 0.25)})", [{}])
        >>> results[0].result
        {'rank': 0, 'loss': [0.5, 0.25]}
    """
    path = os.environ.get(RESULT_ENV)
    if not path:
        raise ContextError(
            f"report() writes to the file named by ${RESULT_ENV}, which is not set; call it "
            f"from code started by nbdist.testing.run_workers, or set {RESULT_ENV} to a path."
        )
    try:
        text = json.dumps(obj, default=_jsonable)
    except (TypeError, ValueError) as err:
        raise ArgumentTypeError(
            f"report() takes JSON values, tuples and tensors/arrays (via .tolist()), nested in "
            f"lists and dicts: {err}. Convert the value first, e.g. with float(), str() or list()."
        ) from err
    with open(path + ".tmp", "w", encoding="utf-8") as file:
        file.write(text)
    os.replace(path + ".tmp", path)  # atomic: a worker killed mid-write leaves the old result


def _run_worker(path: str) -> None:
    """Run the script at `path` as `__main__` with `report` predefined (run_workers' wrapper).

    SIGTERM first dumps every thread's stack to stderr, so a worker killed at the deadline
    shows where it hung, then terminates the process as usual.
    """
    faulthandler.register(signal.SIGTERM, all_threads=True, chain=True)
    sys.argv = [path]
    with open(path, encoding="utf-8") as file:
        code = compile(file.read(), path, "exec")
    exec(code, {"__name__": "__main__", "__file__": path, "report": report})
