"""nbdist.cluster_resolver as a package: its public names, no torch at import time, its error
classes.
"""

from __future__ import annotations

import ast
import pathlib

import pytest

import nbdist.cluster_resolver as cr
from nbdist.cluster_resolver import ClusterSpec
from nbdist.errors import ClusterConfigError, NbdistError


def test_package_exports_exactly_the_public_names():
    assert sorted(cr.__all__) == sorted(
        [
            "ClusterResolver",
            "ClusterSpec",
            "SimpleClusterResolver",
            "SlurmClusterResolver",
            "TFConfigClusterResolver",
            "TorchrunClusterResolver",
            "UnionResolver",
            "resolve_cluster",
        ]
    )
    for name in cr.__all__:
        assert getattr(cr, name) is not None


def test_no_module_imports_torch_at_import_time():
    package = pathlib.Path(cr.__file__).parent
    for path in package.glob("*.py"):
        tree = ast.parse(path.read_text())
        for node in tree.body:  # module level only: torch may be imported inside functions
            names = []
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                names = [node.module or ""]
            assert not any(n == "torch" or n.startswith("torch.") for n in names), path.name


def test_errors_are_nbdist_errors_and_the_builtins_tensorflow_raises():
    with pytest.raises(ClusterConfigError) as info:
        ClusterSpec(["not", "a", "dict"])
    assert isinstance(info.value, (NbdistError, ValueError, TypeError))
    assert isinstance(info.value, TypeError) and isinstance(info.value, ValueError)
