"""Fixtures for tests that start real worker processes.

- Every test must leave no child process behind (autouse `no_leftover_processes`).
- `launch_once(key, launch)` runs an expensive multi-process launch once per pytest session and
  shares its results between the tests (and the pytest-xdist workers) that check different parts
  of it, so a module can assert many things in small tests without starting torch many times.
- The worker scripts of tests/dist/workers import `tests.dist.workers._prelude`, so every process
  a test starts has this checkout first on its PYTHONPATH (autouse `_checkout_on_pythonpath`),
  whatever its working directory.
"""

from __future__ import annotations

import dataclasses
import fcntl
import json
import os
from collections.abc import Callable, Sequence
from pathlib import Path

import pytest

from nbdist.testing import WorkerResult, no_leftover_processes

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module", autouse=True)
def _checkout_on_pythonpath():
    """Put this checkout first on PYTHONPATH while a module here runs, so that the worker
    processes (`run_workers` gives them our environment) import `tests.dist.workers._prelude`."""
    paths = [str(ROOT), *[p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]]
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("PYTHONPATH", os.pathsep.join(dict.fromkeys(paths)))
        yield


@pytest.fixture(autouse=True)
def _no_leftover_processes():
    with no_leftover_processes():
        yield


@pytest.fixture(scope="session")
def launch_once(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Callable[[str, Callable[[], Sequence[WorkerResult]]], list[WorkerResult]]:
    """`launch_once(key, launch)`: `launch()`'s results, run at most once per session and key.

    Under pytest-xdist the workers share the session's base temporary folder, so the first one
    to need `key` runs the launch (holding a file lock) and the others read its results.
    """
    root = tmp_path_factory.getbasetemp()
    if hasattr(request.config, "workerinput"):  # an xdist worker: share with the others
        root = root.parent

    def once(key: str, launch: Callable[[], Sequence[WorkerResult]]) -> list[WorkerResult]:
        saved = root / f"nbdist-launch-{key}.json"
        with open(root / f"nbdist-launch-{key}.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            if saved.exists():
                rows = json.loads(saved.read_text())
            else:
                rows = [dataclasses.asdict(result) for result in launch()]
                saved.write_text(json.dumps(rows))
        return [WorkerResult(**row) for row in rows]

    return once
