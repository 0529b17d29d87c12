"""Worker script of tests/dist/test_multi_worker_errors.py (`PRELUDE`)."""

import os
import pathlib
import time

import torch  # noqa: F401 (the code each test appends uses it)

import nbdist as nd
from tests.dist.workers._prelude import one_thread

if __name__ == "__main__":
    one_thread()

    Options = nd.experimental.CommunicationOptions
    VARIANT = os.environ.get("VARIANT")
    DONE = pathlib.Path(os.environ.get("DONE_FILE", "/nonexistent"))


    def describe(error, started):
        return {
            "type": type(error).__name__,
            "bases": [cls.__name__ for cls in type(error).__mro__],
            "message": str(error),
            "missing": list(getattr(error, "missing", ())),
            "elapsed": time.monotonic() - started,
        }


    def attempt(fn, *args):
        started = time.monotonic()
        try:
            return {"result": fn(*args), "elapsed": time.monotonic() - started}
        except Exception as error:
            return describe(error, started)


    def finish(rank):
        # Rank 0 says when it is done; rank 1 stays alive (heartbeat running) until then.
        if rank == 0:
            DONE.touch()
            return
        deadline = time.monotonic() + 40
        while not DONE.exists() and time.monotonic() < deadline:
            time.sleep(0.05)


    ctx = nd.get_replica_context
