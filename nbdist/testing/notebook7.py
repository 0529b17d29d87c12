"""Drive a real Notebook 7 (`jupyter notebook`, the `notebook` package) in headless Chromium.

Notebook 7 is built from JupyterLab's parts: the same notebook widget, output areas, widget
manager and commands, in a one-document page. `Notebook7(root_dir)` is `JupyterLab` with the
other server application and URL, so `open()` returns the same `LabPage` (`run_all_and_wait`,
`notebook_json`, `screenshot_notebook`, `wait_for_text`) for the same assertions in both.

Example (not run here: it needs chromium):

    from nbdist.testing.notebook7 import Notebook7

    with Notebook7(tmp_path) as server, server.open("demo.ipynb") as page:
        page.run_all_and_wait(timeout=300)
        page.screenshot_notebook(tmp_path / "demo-notebook7.png")
"""

from __future__ import annotations

from nbdist.testing.jupyterlab import JupyterLab

__all__ = ["Notebook7"]


class Notebook7(JupyterLab):
    """A Notebook 7 server of its own, on 127.0.0.1, stopped with everything it started."""

    APP_MODULE = "notebook"
    APP_OPTIONS = ("--JupyterNotebookApp.expose_app_in_browser=True",)
    NOTEBOOK_PATH = "notebooks/"
