"""Browser tests: a real JupyterLab and a real headless Chromium (skipped when either is absent)."""

from __future__ import annotations

import pytest

from nbdist.testing.jupyterlab import chromium_available


def pytest_collection_modifyitems(config, items):
    if chromium_available():
        return
    skip = pytest.mark.skip(reason="needs /usr/bin/chromium and playwright (.ci/run installs both)")
    for item in items:
        if "tests/browser/" in str(item.fspath).replace("\\", "/"):
            item.add_marker(skip)
