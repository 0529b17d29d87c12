"""The scripts tests/cli runs in a fresh Python (`python -c SOURCE`, so its main thread gets the
SIGINT): real modules, linted by ruff and importable without running anything (a script's body
runs only as `__main__`).

Example:
    >>> 'if __name__ == "__main__":' in worker_source("plain_interrupt")
    True
"""

from __future__ import annotations

from pathlib import Path

__all__ = ["worker_source"]

HERE = Path(__file__).resolve().parent


def worker_source(name: str) -> str:
    """The source of `tests/cli/workers/<name>.py`, as `python -c` takes it."""
    return (HERE / f"{name}.py").read_text()
