"""`import nbdist` has no side effects: no Jupyter or engine modules, no CUDA, no threads."""

import subprocess
import sys
import textwrap


def test_import_is_light_and_side_effect_free():
    probe = textwrap.dedent(
        """
        import sys, threading
        before = threading.active_count()
        import torch
        import nbdist as nd
        assert "ipywidgets" not in sys.modules, "ipywidgets imported"
        assert "IPython" not in sys.modules, "IPython imported"
        assert "ipyparallel" not in sys.modules, "ipyparallel imported"
        assert not torch.cuda.is_initialized(), "CUDA initialised"
        assert not torch.distributed.is_initialized(), "process group created"
        assert threading.active_count() == before, "threads started"
        assert set(nd.__all__) <= set(dir(nd))
        print("ok")
        """
    )
    result = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=60, check=False
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "ok"
