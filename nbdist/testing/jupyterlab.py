"""Drive a real JupyterLab in a real headless Chromium, for tests of what a user sees.

`JupyterLab(root_dir)` starts `jupyter lab` on 127.0.0.1 (a free port, a random token, its
own config, data and runtime folders inside a temporary folder), `lab.open(notebook)` opens a
notebook in headless Chromium (Debian's `chromium`, driven by Playwright with
`executable_path`: no browser download), and the returned `LabPage` runs every cell, waits for
text or selectors with timeouts and takes screenshots. Leaving the `with` blocks closes the
browser, shuts down every kernel through the server's REST API, stops the server and kills any
process it started that is still alive (kernels and their engines included).

Example (not run here: it needs chromium):

    from nbdist.testing.jupyterlab import JupyterLab

    with JupyterLab(tmp_path) as lab, lab.open("demo.ipynb") as page:
        page.run_all()
        page.wait_for_text("done", timeout=120)
        page.screenshot(tmp_path / "demo.png")

Imports Playwright and psutil when used, not on import.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from nbdist.testing.ports import LOCALHOST, free_port

__all__ = ["CHROMIUM", "CHROMIUM_FLAGS", "JupyterLab", "LabPage", "chromium_available"]

CHROMIUM = os.environ.get("NBDIST_CHROMIUM", "/usr/bin/chromium")
"""The browser Playwright drives (Debian's `chromium` package)."""

CHROMIUM_FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
)
_POLL_S = 0.1
_STOP_GRACE_S = 10.0


_LAB_SETTINGS = {
    # No "Would you like to receive official Jupyter news?" toast over the screenshots, and no
    # request for news or updates (the machine may have no network).
    "@jupyterlab/apputils-extension/notification": {
        "fetchNews": "false",
        "checkForUpdates": False,
    },
    # Every cell in the page, not only those scrolled into view: a screenshot of the whole
    # notebook shows every output, and the DOM holds every output to assert on.
    "@jupyterlab/notebook-extension/tracker": {"windowingMode": "none"},
}


def _write_lab_settings(folder: Path) -> None:
    """Write the user settings every harness server starts with (JupyterLab's own format)."""
    for plugin, values in _LAB_SETTINGS.items():
        path = folder / f"{plugin}.jupyterlab-settings"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(values, indent=2))


def chromium_available() -> bool:
    """True when the browser and Playwright are both installed (tests skip otherwise)."""
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        return False
    return os.access(CHROMIUM, os.X_OK)


class JupyterLab:
    """A JupyterLab server of its own, on 127.0.0.1, stopped with everything it started.

    `Notebook7` (nbdist.testing.notebook7) is the same for Notebook 7's `jupyter notebook`.

    Args:
        root_dir: The folder the server serves (notebooks are opened relative to it).
        start_timeout: Seconds to wait for the server to answer.

    Attributes:
        url: The server's base URL (`http://127.0.0.1:PORT/`).
        token: The token every request carries.
        workdir: The temporary folder holding the server's config, data, runtime and log.
    """

    APP_MODULE = "jupyterlab"
    """What `python -m` starts."""
    APP_OPTIONS: tuple[str, ...] = (
        "--LabApp.expose_app_in_browser=True",
        "--LabApp.news_url=",
        "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate",
    )
    """Options of that application (the page must expose `window.jupyterapp`)."""
    NOTEBOOK_PATH = "lab/tree/"
    """The URL path that opens a notebook, before the notebook's own path."""

    def __init__(self, root_dir: str | os.PathLike, *, start_timeout: float = 90.0):
        self.root_dir = Path(root_dir)
        self.start_timeout = start_timeout
        self.port = 0
        self.token = secrets.token_hex(16)
        self.url = ""
        self.workdir: Path | None = None
        self._server: subprocess.Popen | None = None
        self._browser_stack = contextlib.ExitStack()
        self._playwright: Any = None
        self._context: Any = None

    # -- server ---------------------------------------------------------------------------
    def start(self) -> JupyterLab:
        """Start the server and wait until its REST API answers (raises on timeout)."""
        self.workdir = Path(tempfile.mkdtemp(prefix="nbdist-lab-"))
        env = dict(os.environ)
        for name in ("config", "data", "runtime"):
            (self.workdir / name).mkdir()
        env["JUPYTER_CONFIG_DIR"] = str(self.workdir / "config")
        env["JUPYTER_DATA_DIR"] = str(self.workdir / "data")
        env["JUPYTER_RUNTIME_DIR"] = str(self.workdir / "runtime")
        env["JUPYTERLAB_SETTINGS_DIR"] = str(self.workdir / "config" / "lab-settings")
        env["JUPYTERLAB_WORKSPACES_DIR"] = str(self.workdir / "config" / "lab-workspaces")
        _write_lab_settings(self.workdir / "config" / "lab-settings")
        self.port = free_port()
        self.url = f"http://{LOCALHOST}:{self.port}/"
        command = [
            sys.executable, "-m", self.APP_MODULE, "--no-browser",
            f"--ServerApp.ip={LOCALHOST}", f"--ServerApp.port={self.port}",
            "--ServerApp.port_retries=0", f"--IdentityProvider.token={self.token}",
            f"--ServerApp.root_dir={self.root_dir}", *self.APP_OPTIONS,
            "--ServerApp.disable_check_xsrf=True",
        ]  # fmt: skip
        if hasattr(os, "geteuid") and os.geteuid() == 0:  # containers and CI runners
            command.append("--allow-root")
        log = open(self.workdir / "server.log", "wb")  # noqa: SIM115 (closed with the server)
        self._log = log
        self._server = subprocess.Popen(
            command,
            cwd=self.root_dir,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
        deadline = time.monotonic() + self.start_timeout
        while True:
            if self._server.poll() is not None:
                raise RuntimeError(f"{self.APP_MODULE} exited at start:\n{self.log_tail()}")
            try:
                self.api("GET", "api/status")
                return self
            except (urllib.error.URLError, ConnectionError, OSError):
                if time.monotonic() > deadline:
                    self.stop()
                    raise TimeoutError(
                        f"{self.APP_MODULE} did not answer within {self.start_timeout} s:\n"
                        f"{self.log_tail()}"
                    ) from None
                time.sleep(_POLL_S)

    def api(self, method: str, path: str, body: Any = None, timeout: float = 10.0) -> Any:
        """One REST call to the server (JSON in and out)."""
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(
            f"{self.url}{path}",
            data=data,
            method=method,
            headers={"Authorization": f"token {self.token}", "Content-Type": "application/json"},
        )
        with urllib.request.urlopen(request, timeout=timeout) as response:
            text = response.read()
        return json.loads(text) if text else None

    def log_tail(self, lines: int = 40) -> str:
        """The end of the server's log (for failure messages)."""
        if self.workdir is None or not (self.workdir / "server.log").exists():
            return ""
        text = (self.workdir / "server.log").read_text(errors="replace").splitlines()
        return "\n".join(text[-lines:])

    def stop(self) -> None:
        """Close the browser, shut down every kernel, stop the server, kill what is left."""
        self._browser_stack.close()
        server = self._server
        if server is None:
            return
        import psutil

        try:
            leftovers = psutil.Process(server.pid).children(recursive=True)
        except psutil.Error:
            leftovers = []
        if server.poll() is None:
            with contextlib.suppress(Exception):
                for kernel in self.api("GET", "api/kernels"):
                    self.api("DELETE", f"api/kernels/{kernel['id']}", timeout=30)
            with contextlib.suppress(ProcessLookupError):
                os.killpg(server.pid, signal.SIGTERM)
            try:
                server.wait(_STOP_GRACE_S)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(server.pid, signal.SIGKILL)
                server.wait(_STOP_GRACE_S)
        for process in leftovers:
            with contextlib.suppress(psutil.Error):
                process.kill()
        psutil.wait_procs(leftovers, timeout=_STOP_GRACE_S)
        self._server = None
        self._log.close()
        if self.workdir is not None:
            shutil.rmtree(self.workdir, ignore_errors=True)

    def __enter__(self) -> JupyterLab:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- browser --------------------------------------------------------------------------
    def _browser_context(self) -> Any:
        if self._context is None:
            from playwright.sync_api import sync_playwright

            assert self.workdir is not None, "start() the server first"
            self._playwright = self._browser_stack.enter_context(sync_playwright())
            self._context = self._playwright.chromium.launch_persistent_context(
                str(self.workdir / "chromium-profile"),
                executable_path=CHROMIUM,
                headless=True,
                args=list(CHROMIUM_FLAGS),
                viewport={"width": 1400, "height": 1000},
            )
            self._browser_stack.callback(self._context.close)
        return self._context

    @contextlib.contextmanager
    def open(self, notebook: str, *, timeout: float = 120.0) -> Iterator[LabPage]:
        """Open `notebook` (relative to `root_dir`) in a new browser tab, kernel idle.

        The tab is closed when the block ends; the kernel is shut down with the server.
        """
        page = self._browser_context().new_page()
        try:
            page.goto(
                f"{self.url}{self.NOTEBOOK_PATH}{notebook}?token={self.token}",
                timeout=timeout * 1e3,
            )
            lab_page = LabPage(page, self)
            lab_page.wait_for_kernel_idle(timeout=timeout)
            # The file browser closed: the notebook gets the page's width in screenshots.
            page.evaluate("() => { const s = window.jupyterapp.shell;"
                          " if (s.collapseLeft) { s.collapseLeft(); } }")  # fmt: skip
            yield lab_page
        finally:
            with contextlib.suppress(Exception):
                page.close()


class LabPage:
    """One notebook open in JupyterLab: run cells, wait for output, take screenshots.

    Attributes:
        page: The Playwright `Page` (for anything this class does not wrap).
    """

    def __init__(self, page: Any, lab: JupyterLab):
        self.page = page
        self.lab = lab

    def command(self, name: str, args: dict | None = None) -> None:
        """Execute one JupyterLab command (`notebook:run-all-cells`, ...) in the page."""
        self.page.evaluate(
            "([name, args]) => window.jupyterapp.commands.execute(name, args)", [name, args or {}]
        )

    def wait_for_kernel_idle(self, timeout: float = 120.0) -> None:
        """Wait until the notebook's kernel has started and is idle."""
        self.page.wait_for_function(
            "() => { const ok = document.querySelector('.jp-Dialog .jp-mod-accept');"
            " if (ok) { ok.click(); }"  # a notebook without a kernelspec asks for one
            " const w = window.jupyterapp && window.jupyterapp.shell.currentWidget;"
            " const k = w && w.sessionContext && w.sessionContext.session"
            " && w.sessionContext.session.kernel;"
            " return !!k && k.status === 'idle'; }",
            timeout=timeout * 1e3,
            polling=100,
        )

    def run_all(self) -> None:
        """Run every cell of the notebook (returns at once; wait for output afterwards)."""
        self.command("notebook:run-all-cells")

    def run_cell(self, index: int, *, below: bool = False) -> None:
        """Run cell `index` (0-based); with `below`, that cell and every one after it."""
        self.page.evaluate(
            "(i) => { window.jupyterapp.shell.currentWidget.content.activeCellIndex = i; }", index
        )
        self.command("notebook:run-all-below" if below else "notebook:run-cell")

    def start_cell(self, index: int) -> None:
        """Start cell `index` (0-based) and return at once, while it runs (`run_cell` and
        `command` wait for the command's promise: until the cell has finished)."""
        self.page.evaluate(
            "(i) => { const app = window.jupyterapp;"
            " app.shell.currentWidget.content.activeCellIndex = i;"
            " app.commands.execute('notebook:run-cell'); return null; }",
            index,
        )

    def wait_for_text(self, text: str, timeout: float = 120.0) -> None:
        """Wait until `text` is visible in one of the notebook's outputs.

        Only outputs are searched: the cells' source is on the page too, and a cell that
        prints `'sleeping'` would otherwise "show" it before it has even started.
        """
        outputs = self.page.locator(".jp-OutputArea")
        outputs.get_by_text(text, exact=False).first.wait_for(
            state="visible", timeout=timeout * 1e3
        )

    def wait_for(self, selector: str, timeout: float = 120.0, state: str = "visible") -> Any:
        """Wait for a CSS selector; returns its first element's locator."""
        locator = self.page.locator(selector).first
        locator.wait_for(state=state, timeout=timeout * 1e3)
        return locator

    def wait_until(self, js: str, arg: Any = None, timeout: float = 120.0) -> Any:
        """Wait until the JavaScript function `js` (given `arg`) returns a truthy value."""
        return self.page.wait_for_function(js, arg=arg, timeout=timeout * 1e3, polling=100)

    def screenshot(self, path: str | os.PathLike, *, full_page: bool = True) -> Path:
        """Save a PNG of the page; returns its path."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        self.page.screenshot(path=str(path), full_page=full_page)
        return path

    def start_all(self) -> None:
        """Start "Run All" and return at once; `wait_all` waits for it to finish.

        Like the menu, it stops at a cell that raised, unless that cell is tagged
        `raises-exception`.
        """
        self.page.evaluate(
            "() => { window.__nbdistRunAll = null;"
            " window.jupyterapp.commands.execute('notebook:run-all-cells').then("
            "  ok => { window.__nbdistRunAll = {ok: ok}; },"
            "  e => { window.__nbdistRunAll = {error: String(e)}; });"
            " return null; }"
        )

    def wait_all(self, timeout: float = 600.0) -> None:
        """Wait until the "Run All" begun by `start_all` has finished and the kernel is idle.

        Past `timeout`, Playwright's TimeoutError, with a note of every cell's execution count
        (None: not run), so the failure says where the notebook stood.
        """
        try:
            self.wait_until("() => window.__nbdistRunAll", timeout=timeout)
            self.wait_for_kernel_idle(timeout=60)
        except Exception as error:
            with contextlib.suppress(Exception):
                counts = [c.get("execution_count") for c in self.notebook_json()["cells"]]
                error.add_note(f"not finished after {timeout} s; execution counts: {counts}")
            raise

    def run_all_and_wait(self, timeout: float = 600.0) -> None:
        """`start_all` then `wait_all`: every cell run, the last one finished."""
        self.start_all()
        self.wait_all(timeout)

    def rendered_outputs(self) -> list[str]:
        """What each cell's output area shows, as the browser renders it (`innerText`: widgets
        drawn, carriage returns applied, ANSI colours gone); one string per cell, "" for a
        cell without output."""
        return self.page.evaluate(
            "() => Array.from(document.querySelectorAll('.jp-Notebook .jp-Cell'))"
            ".map(c => { const o = c.querySelector('.jp-OutputArea');"
            " return o ? o.innerText : ''; })"
        )

    def progress_bars(self) -> list[list[float]]:
        """The progress-bar widgets each cell's output draws (tqdm's in JupyterLab and Notebook
        7: ipywidgets' `.progress-bar`), each as the percentage its bar is filled."""
        return self.page.evaluate(
            "() => Array.from(document.querySelectorAll('.jp-Notebook .jp-Cell'))"
            ".map(c => Array.from(c.querySelectorAll('.jp-OutputArea .progress-bar'))"
            ".map(b => parseFloat(b.style.width || b.style.height || '0')))"
        )

    def notebook_json(self) -> dict:
        """The open notebook as nbformat JSON, outputs as the page holds them (not saved)."""
        return self.page.evaluate(
            "() => window.jupyterapp.shell.currentWidget.context.model.toJSON()"
        )

    def widget_problems(self) -> list[str]:
        """Outputs where a widget did not render: "Error displaying widget" or a view still
        "Loading widget..." (each as its text); empty when every widget drew."""
        return self.page.evaluate(
            "() => Array.from(document.querySelectorAll('.jp-OutputArea-output'))"
            ".map(o => o.innerText || '')"
            ".filter(t => /Error displaying widget|Loading widget/.test(t))"
        )

    @contextlib.contextmanager
    def whole_notebook_in_view(self) -> Iterator[None]:
        """Within the block the page is as tall as the notebook, scrolled to its top: every
        cell is drawn (also where the front end draws only the cells in view, as Notebook 7
        does) and in a screenshot of the page. The page's size is set back afterwards."""
        size = self.page.viewport_size or {"width": 1400, "height": 1000}
        # The page's height for the whole notebook: down to the last cell's bottom, measured
        # from the top of the page with the notebook scrolled to its start.
        bottom = (
            "() => { const w = window.jupyterapp.shell.currentWidget;"
            " const s = w.node.querySelector('.jp-WindowedPanel-outer') || w.content.node;"
            " const cells = w.content.node.querySelectorAll('.jp-Cell');"
            " const last = cells[cells.length - 1];"
            " return last ? last.getBoundingClientRect().bottom + s.scrollTop : 0; }"
        )
        try:
            # Cells below the fold may be drawn, and grow, only once the page is taller:
            # measure again after each resize until everything fits (a few rounds at most).
            for _ in range(5):
                tall = max(min(int(self.page.evaluate(bottom)) + 40, 30_000), size["height"])
                self.page.set_viewport_size({"width": size["width"], "height": tall})
                with contextlib.suppress(Exception):  # not yet: measure again
                    self.wait_until(  # scrolled to the top, every cell within the page
                        "() => { const w = window.jupyterapp.shell.currentWidget;"
                        " const s = w.node.querySelector('.jp-WindowedPanel-outer')"
                        " || w.content.node;"
                        f" s.scrollTop = 0; return s.scrollTop === 0 && ({bottom})() <= {tall}; }}",
                        timeout=3,
                    )
                    break
            yield
        finally:
            self.page.set_viewport_size(size)

    def screenshot_notebook(
        self, path: str | os.PathLike, *, cells_to: str | os.PathLike | None = None
    ) -> list[Path]:
        """Save a PNG of the whole notebook, every cell in one picture (in
        `whole_notebook_in_view`); with `cells_to`, also one PNG per code cell that has
        output, `cell-NN.png` (NN: the cell's 0-based index). Returns the paths.
        """
        shots = []
        with self.whole_notebook_in_view():
            shots.append(self.screenshot(path, full_page=False))
            if cells_to is not None:
                folder = Path(cells_to)
                folder.mkdir(parents=True, exist_ok=True)
                cells = self.page.locator(".jp-Notebook .jp-Cell")
                for index in range(cells.count()):
                    cell = cells.nth(index)
                    if cell.locator(".jp-OutputArea-output").count() == 0:
                        continue
                    shot = folder / f"cell-{index:02d}.png"
                    cell.screenshot(path=str(shot))
                    shots.append(shot)
        return shots
