"""`%load_ext nbdist` imports nothing heavy; the public API imports its modules on first use.

Each check runs in a fresh interpreter (`sys.modules` of this test process already holds
torch), and the module lists are read there.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

HEAVY = ("torch", "matplotlib", "ipywidgets", "ipyparallel", "torch._dynamo")


def _run(code: str) -> dict:
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_load_ext_imports_none_of_torch_matplotlib_ipywidgets_ipyparallel():
    seen = _run(
        f"""
        import json, sys
        from IPython.core.interactiveshell import InteractiveShell
        shell = InteractiveShell.instance()
        shell.run_line_magic("load_ext", "nbdist")
        magics = sorted(shell.magics_manager.magics["line"]) + sorted(
            shell.magics_manager.magics["cell"])
        print(json.dumps({{"heavy": [m for m in {HEAVY!r} if m in sys.modules],
                           "magics": [m for m in magics if "dist" in m]}}))
        """
    )
    assert seen["heavy"] == []
    assert "dist" in seen["magics"] and "distribute" in seen["magics"]


def test_public_names_import_their_module_on_first_use():
    seen = _run(
        """
        import json, sys
        import nbdist as nd
        before = "torch" in sys.modules
        strategy = nd.MirroredStrategy
        from nbdist import progress, checkpoint
        print(json.dumps({
            "before": before,
            "after": "torch" in sys.modules,
            "strategy": strategy.__module__,
            "progress": progress.__module__,
            "checkpoint": checkpoint.__name__,
            "all_resolve": all(getattr(nd, name) is not None for name in nd.__all__),
            "dir": set(nd.__all__) <= set(dir(nd)),
        }))
        """
    )
    assert seen == {
        "before": False,
        "after": True,
        "strategy": "nbdist.strategies.mirrored",
        "progress": "nbdist.telemetry.metrics",
        "checkpoint": "nbdist.checkpoint",
        "all_resolve": True,
        "dir": True,
    }


def test_an_unknown_name_is_an_attribute_error():
    seen = _run(
        """
        import json
        import nbdist as nd
        try:
            nd.NoSuchThing
        except AttributeError as error:
            print(json.dumps({"error": str(error), "hasattr": hasattr(nd, "_no_such")}))
        """
    )
    assert seen == {"error": "module 'nbdist' has no attribute 'NoSuchThing'", "hasattr": False}


def test_strategies_leave_dynamo_unimported_until_something_compiles():
    """Dynamo's import cost as much as torch's on every engine (Note [Dynamo is imported by
    whoever compiles]); a step compiled later still refuses a collective under fullgraph."""
    seen = _run(
        """
        import json, sys
        import torch
        import nbdist as nd
        strategy = nd.MirroredStrategy(["cpu:0", "cpu:1"])
        imported = "torch._dynamo" in sys.modules

        def body(x):
            return nd.get_replica_context().all_reduce("sum", x)

        step = torch.compile(body, backend="eager", fullgraph=True)
        try:
            strategy.run(step, args=(torch.ones(1),))
            error = None
        except Exception as caught:
            error = type(caught).__name__
        print(json.dumps({"dynamo_before_compiling": imported, "error": error}))
        """
    )
    assert seen == {"dynamo_before_compiling": False, "error": "CompiledCollectiveError"}


def test_the_controller_process_imports_no_torch():
    """The controller runs `nbdist.cluster.launch._controller_main`; importing the package
    `nbdist.cluster` for it imported torch (1-2 s of CPU at every start)."""
    seen = _run(
        """
        import json, sys
        import nbdist.cluster.launch._controller_main, nbdist.cluster.launch.parent_watch
        heavy = [m for m in ("torch", "ipyparallel") if m in sys.modules]
        import nbdist.cluster.engine_strategy
        from nbdist.cluster import remote  # the function, not a submodule
        print(json.dumps({"heavy": heavy, "remote": callable(remote) and remote.__module__}))
        """
    )
    assert seen == {"heavy": [], "remote": "nbdist.cluster.refs"}


def test_the_notebooks_start_path_imports_no_torch():
    """Everything `Cluster.start()` and `%dist start` import in the notebook, and planning a
    start (which counts the GPUs), leave torch unimported: torch's import (about 1.5 s of CPU)
    used to compete with the engine zygote's for the cores. The lazily imported names still
    resolve to the real things."""
    seen = _run(
        """
        import json, sys
        import nbdist.cluster.engines, nbdist.cluster.ps_cluster, nbdist.magics.core
        import nbdist.cluster.bringup
        from nbdist.input.errors import StepsExhaustedError
        from nbdist.cluster.launch.plan import local_gpu_ids, make_plan
        from nbdist._private_api import pytree
        plan = make_plan(n=2)
        heavy = [m for m in ("torch",) if m in sys.modules]
        import nbdist.input
        leaves, _ = pytree.tree_flatten({"a": (1, [2])})
        print(json.dumps({
            "heavy": heavy,
            "gpus": list(local_gpu_ids()),
            "engines": plan.n,
            "dataset": nbdist.input.DistributedDataset.__module__,
            "leaves": leaves,
            "after": "torch" in sys.modules,
        }))
        """
    )
    import torch

    expected_gpus = (
        [str(i) for i in range(torch.cuda.device_count())] if torch.cuda.is_available() else []
    )
    assert seen == {
        "heavy": [],
        "gpus": expected_gpus,
        "engines": 2,
        "dataset": "nbdist.input.dataset",
        "leaves": [1, 2],
        "after": True,
    }
