"""`FullyShardedStrategy`'s policy (which modules become FSDP units) and its arguments, in one
process: "auto" by size and its fall-back to the root's blocks, a callable policy, tied
parameters left to the root or named, and the arguments refused by name."""

from __future__ import annotations

import pytest
import torch

import nbdist as nd
from nbdist.errors import ArgumentTypeError, InvalidArgumentError
from nbdist.strategies._shard_policy import choose_units


class Block(torch.nn.Module):
    def __init__(self, width: int = 32):
        super().__init__()
        self.lin = torch.nn.Linear(width, width)

    def forward(self, x):
        return torch.tanh(self.lin(x))


def model(width: int = 32) -> torch.nn.Module:
    return torch.nn.Sequential(*[Block(width) for _ in range(4)], torch.nn.Linear(width, 4))


def names(units):
    return [type(m).__name__ for m in units]


def test_auto_chooses_the_smallest_subtrees_of_the_size_then_the_root():
    m = model()
    assert names(choose_units(m, "auto", min_shard_bytes=1024)) == ["Linear"] * 4 + ["Sequential"]
    # 0 bytes: every module with parameters; a block holds nothing left once its Linear is in
    assert names(choose_units(m, "auto", min_shard_bytes=0)) == ["Linear"] * 5 + ["Sequential"]


def test_auto_below_the_size_takes_the_root_blocks():
    m = model()
    units = choose_units(m, "auto", min_shard_bytes=1 << 30)
    assert units == [*m, m]


def test_a_callable_policy_chooses_its_modules():
    m = model()
    units = choose_units(m, lambda mod: isinstance(mod, Block), min_shard_bytes=0)
    assert units == [m[0], m[1], m[2], m[3], m]
    assert choose_units(m, lambda mod: False, min_shard_bytes=0) == [m]


def test_a_tied_parameter_goes_to_the_root_under_auto():
    m = model()
    m[3].lin.weight = m[0].lin.weight
    units = choose_units(m, "auto", min_shard_bytes=0)
    assert m[0].lin not in units and m[3].lin not in units and units[-1] is m
    assert m[1].lin in units and m[2].lin in units


def test_a_callable_choosing_one_owner_of_a_tied_parameter_is_named():
    m = model()
    m[3].lin.weight = m[0].lin.weight
    with pytest.raises(InvalidArgumentError, match=r"'0.lin.weight = 3.lin.weight' is also used"):
        choose_units(m, lambda mod: isinstance(mod, Block), min_shard_bytes=0)


@pytest.mark.parametrize(
    ("kwargs", "error", "text"),
    [
        ({"shard": "blocks"}, ArgumentTypeError, "shard must be 'auto' or a callable"),
        ({"min_shard_bytes": 1.5}, ArgumentTypeError, "min_shard_bytes must be an int"),
        ({"min_shard_bytes": -1}, InvalidArgumentError, "min_shard_bytes must be >= 0"),
        ({"mixed_precision": "int8"}, ArgumentTypeError, "mixed_precision must be None"),
        ({"offload": "yes"}, ArgumentTypeError, "offload must be True, False"),
        ({"offload": True}, InvalidArgumentError, "these workers compute on the CPU"),
    ],
)
def test_bad_arguments_are_named(kwargs, error, text):
    if kwargs.get("offload") is True and torch.cuda.is_available():
        pytest.skip("offload is refused on CPU workers only")
    with pytest.raises(error, match=text):
        nd.experimental.FullyShardedStrategy(**kwargs)


def test_one_worker_keeps_models_whole_and_gather_gives_them_back():
    strategy = nd.experimental.FullyShardedStrategy(mixed_precision="bfloat16")
    with strategy.scope():
        m = model()
    assert not any(hasattr(p, "to_local") for p in m.parameters())
    assert torch.equal(strategy.gather(m[0].lin.weight), m[0].lin.weight)
    with pytest.raises(InvalidArgumentError, match="gather needs an axis"):
        strategy.gather(torch.ones(2))
