"""nd.Variable's bad arguments: unequal shapes, TensorFlow arguments nbdist lacks, misspelt names
and devices inside a scope, each refused by name (API.md §5, §11).
"""

from __future__ import annotations

import pytest
import torch

import nbdist as nd


def test_assign_needs_equal_shapes_and_deltas_must_broadcast():
    v = nd.Variable([1.0, 2.0])
    with pytest.raises(ValueError, match=r"assign a value of shape \(\) to a variable of shape"):
        v.assign(5.0)
    with pytest.raises(ValueError, match=r"shape \(3,\) to a variable of shape \(2,\)"):
        v.assign([1.0, 2.0, 3.0])
    with pytest.raises(ValueError, match=r"assign_add a value of shape \(3,\)"):
        v.assign_add([1.0, 2.0, 3.0])
    assert v.assign_add(1.0).numpy().tolist() == [2.0, 3.0]


STRATEGIES_FOR_ARGUMENTS = {
    "none": None,
    "one_device": lambda: nd.OneDeviceStrategy("cpu:0"),
    "mirrored": lambda: nd.MirroredStrategy(["cpu:0", "cpu:1"]),
    "multi_worker_single": lambda: nd.MultiWorkerMirroredStrategy(),
}


def _in_scope(make):
    import contextlib

    return make().scope() if make is not None else contextlib.nullcontext()


@pytest.mark.parametrize(
    "make", STRATEGIES_FOR_ARGUMENTS.values(), ids=STRATEGIES_FOR_ARGUMENTS.keys()
)
@pytest.mark.parametrize(
    ("argument", "value"),
    [("constraint", abs), ("shape", (3,)), ("caching_device", "cpu:0"),
     ("validate_shape", False), ("import_scope", "x")],
)  # fmt: skip
def test_tensorflow_variable_arguments_nbdist_lacks_are_refused_by_name(make, argument, value):
    with _in_scope(make):
        with pytest.raises(nd.errors.UnsupportedOptionError, match=f"{argument}=") as info:
            nd.Variable(torch.zeros(3), **{argument: value})
    assert isinstance(info.value, ValueError) and "Remove" in str(info.value)


@pytest.mark.parametrize(
    "make", STRATEGIES_FOR_ARGUMENTS.values(), ids=STRATEGIES_FOR_ARGUMENTS.keys()
)
def test_a_misspelt_variable_argument_is_named_not_swallowed(make):
    with _in_scope(make):
        with pytest.raises(nd.errors.UnknownArgumentError, match=r"'trainabel'.*accepts") as info:
            nd.Variable(torch.zeros(3), trainabel=False)
        assert isinstance(info.value, TypeError)
        # TensorFlow's defaults change nothing and are accepted.
        v = nd.Variable(torch.zeros(3), validate_shape=True, shape=None, constraint=None)
        assert v.shape == (3,)


def test_device_inside_a_strategy_scope_is_refused_not_ignored():
    with nd.MirroredStrategy(["cpu:0", "cpu:1"]).scope():
        with pytest.raises(nd.errors.UnsupportedOptionError, match="colocate_vars_with"):
            nd.Variable(1.0, device="cpu:1")
    assert nd.Variable(1.0, device="cpu:0").device == "cpu:0"
