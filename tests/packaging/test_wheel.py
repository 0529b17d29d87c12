"""`python -m build` makes a wheel and an sdist; the wheel installs in a fresh venv and works.

The fresh venv gets the pinned torch first (`constraints/dev.txt`), then the wheel with its
dependencies, and nothing from this checkout: the commands run outside the repository with no
PYTHONPATH. It must run `nbdist demo --epochs 1` (engines included) and `%load_ext nbdist`.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import venv
import zipfile
from pathlib import Path

import pytest

import nbdist
from nbdist.testing import no_leftover_processes

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
TIMEOUT_S = 480


def run(argv: list, cwd: Path, **kwargs) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env["MPLBACKEND"] = "Agg"
    done = subprocess.run([str(a) for a in argv], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=TIMEOUT_S, **kwargs)  # fmt: skip
    assert done.returncode == 0, f"{argv} failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return done


@pytest.mark.timeout(TIMEOUT_S * 2)
def test_wheel_installs_in_a_fresh_venv_and_runs_the_demo(tmp_path):
    dist = tmp_path / "dist"
    run([sys.executable, "-m", "build", "--no-isolation", "--outdir", dist, ROOT], cwd=tmp_path)
    wheels, sdists = list(dist.glob("*.whl")), list(dist.glob("*.tar.gz"))
    assert len(wheels) == 1 and len(sdists) == 1, list(dist.iterdir())
    wheel = wheels[0]
    assert wheel.name.startswith(f"nbdist-{nbdist.__version__}-")  # the one version
    names = zipfile.ZipFile(wheel).namelist()
    assert "nbdist/app/data/digits.npz" in names
    assert "nbdist/app/data/README.md" in names
    for folder in ("tests/", "notebooks/", "benchmarks/", "examples/"):
        assert not any(name.startswith(folder) for name in names), folder
    assert not any(name.endswith(".ipynb") for name in names)

    env_dir = tmp_path / "venv"
    venv.EnvBuilder(with_pip=True, clear=True).create(env_dir)
    python = env_dir / "bin" / "python"
    constraints = ROOT / "constraints" / "dev.txt"
    run([python, "-m", "pip", "install", "-q", "-c", constraints, "torch==2.13.0"], cwd=tmp_path)
    run([python, "-m", "pip", "install", "-q", "-c", constraints, wheel], cwd=tmp_path)

    found = subprocess.run([python, "-c", "import sklearn"], capture_output=True, cwd=tmp_path)
    assert found.returncode != 0, "the fresh venv has scikit-learn: the demo's test proves less"
    located = run([python, "-c", "import nbdist; print(nbdist.__file__)"], cwd=tmp_path)
    assert str(env_dir) in located.stdout

    with no_leftover_processes(grace=30):
        demo = run([env_dir / "bin" / "nbdist", "demo", "--epochs", "1", "--no-progress",
                    "--out", "out"], cwd=tmp_path)  # fmt: skip
    assert "epoch 1/1" in demo.stdout
    metrics = json.loads((tmp_path / "out" / "metrics.json").read_text())
    assert metrics["engines"] == 2 and metrics["replicas_identical"]
    assert (tmp_path / "out" / "dashboard.png").exists()

    magic = run([python, "-c", (
        "from IPython.core.interactiveshell import InteractiveShell\n"
        "shell = InteractiveShell.instance()\n"
        "shell.run_line_magic('load_ext', 'nbdist')\n"
        "print('dist' in shell.magics_manager.magics['line'],"
        " 'distribute' in shell.magics_manager.magics['cell'])\n"
    )], cwd=tmp_path)  # fmt: skip
    assert magic.stdout.split() == ["True", "True"]
