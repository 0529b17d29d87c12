"""The new-user notebook in Notebook 7 (`jupyter notebook`), checked as it is in JupyterLab.

notebooks/10-first-session.ipynb runs in a real Notebook 7 server in headless Chromium, Run
All, with the checks tests/notebooks/test_10_first_session.py makes in JupyterLab: the
dashboard widget drawn while the training cell runs, both progress bars drawn as widgets and
at 100 %, the collective failure's error shown cause first in under 15 lines, every cell run,
no warning or raw HTML in a stream, no widget left undrawn. Screenshots
(`10-first-session-notebook7*.png`) go to $NBDIST_SCREENSHOTS, else the test's folder.
"""

from __future__ import annotations

import shutil

import pytest

from nbdist.testing import no_leftover_processes
from nbdist.testing.kernels import stream_warts
from nbdist.testing.notebook7 import Notebook7
from tests.notebooks.conftest import (
    NOTEBOOKS,
    errors_outside_raises_exception,
    run_in_lab,
    screenshots_folder,
)
from tests.notebooks.test_10_first_session import NAME, check_first_session, watch_training

pytestmark = [pytest.mark.slow, pytest.mark.cluster, pytest.mark.timeout(600)]


def test_first_session_in_notebook7(tmp_path):
    shutil.copy(NOTEBOOKS / f"{NAME}.ipynb", tmp_path)
    shots = screenshots_folder(tmp_path)
    with no_leftover_processes(grace=30), Notebook7(tmp_path) as server:
        nb = run_in_lab(server, f"{NAME}.ipynb", shots, watch_training(shots, "-notebook7"),
                        suffix="-notebook7")  # fmt: skip
    assert not errors_outside_raises_exception(nb)
    assert not stream_warts(nb)
    check_first_session(nb)
    bars = [cell.metadata["progress_bars"] for cell in nb.cells
            if cell.cell_type == "code" and "nd.progress(" in cell.source]  # fmt: skip
    assert bars == [[100.0], [100.0]], bars  # one drawn bar widget per loop, full
