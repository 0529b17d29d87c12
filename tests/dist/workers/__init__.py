"""The worker scripts of tests/dist: real modules (linted by ruff, importable without running
anything), each run in its worker processes by `nbdist.testing.run_workers`, which takes a
script's source: `run_workers(worker_source("agreed_layouts"), envs)`. A script's body runs only
as `__main__` (under `if __name__ == "__main__":`), so a test may also append code to it. The body
begins with `start()` of `_prelude.py` (one torch thread, the MultiWorkerMirroredStrategy and
this worker's rank), which the workers import from this checkout (tests/dist/conftest.py puts it
on their PYTHONPATH).

Example:
    >>> 'if __name__ == "__main__":' in worker_source("agreed_layouts")
    True
"""

from __future__ import annotations

from pathlib import Path

__all__ = ["worker_source"]

HERE = Path(__file__).resolve().parent


def worker_source(name: str) -> str:
    """The source of the worker script `tests/dist/workers/<name>.py`, as `run_workers` takes it."""
    return (HERE / f"{name}.py").read_text()
