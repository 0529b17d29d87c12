"""Distributed values: `PerReplica` (one value per replica) and `Mirrored` (the same on all).

Also the two structure operations every strategy needs: picking one replica's component out of
a nested structure (`select_replica`) and merging the replicas' results back (`regroup`).
Imports nbdist.core.context only.
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from nbdist._lazy_module import LazyModule
from nbdist._private_api import pytree
from nbdist.core.context import current_replica_context
from nbdist.errors import ArgumentTypeError, InvalidArgumentError

if TYPE_CHECKING:
    import torch
else:
    torch = LazyModule("torch")  # imported at first use: not on `Cluster.start()`'s path

__all__ = [
    "DistributedValues",
    "Mirrored",
    "PerReplica",
    "register_variable_type",
    "regroup",
    "select_replica",
]


class DistributedValues:
    """Base class of values that hold one component per local replica.

    Attributes:
        values: The components, in replica order.

    Example:
        >>> PerReplica([torch.tensor(1.0), torch.tensor(2.0)]).values
        (tensor(1.), tensor(2.))
    """

    def __init__(
        self,
        values: Sequence[Any],
        *,
        replica_ids: Sequence[int] | None = None,
        devices: Sequence[str] | None = None,
    ):
        self._values = tuple(values)
        self._devices = tuple(devices) if devices is not None else None
        if not self._values:
            raise InvalidArgumentError(
                f"{type(self).__name__} needs at least one component, got none."
            )
        ids = tuple(range(len(self._values))) if replica_ids is None else tuple(replica_ids)
        if len(ids) != len(self._values):
            raise InvalidArgumentError(
                f"{len(ids)} replica ids for {len(self._values)} components."
            )
        self._replica_ids = ids

    @property
    def values(self) -> tuple[Any, ...]:
        """The components, in replica order."""
        return self._values

    @property
    def devices(self) -> tuple[str, ...] | None:
        """The device of each component, when known (values made by a strategy know them)."""
        return self._devices

    @property
    def replica_ids(self) -> tuple[int, ...]:
        """The global replica id of each component (0..N-1 in a single worker)."""
        return self._replica_ids

    def _local_component(self) -> Any:
        """The component of the replica we are in, or the first one in cross-replica context."""
        replica = current_replica_context()
        index = replica.local_replica_index if replica is not None else 0
        if index >= len(self._values):
            index = 0
        return self._values[index]

    def __repr__(self) -> str:
        inner = ", ".join(f"{i}: {v!r}" for i, v in zip(self._replica_ids, self._values))
        return f"{type(self).__name__}:{{{inner}}}"

    def __reduce__(self):
        return (_rebuild, (type(self), self._values, self._replica_ids, self._devices))


def _rebuild(cls, values, replica_ids, devices=None):
    return cls(values, replica_ids=replica_ids, devices=devices)


_NOT_A_TENSOR = (
    "A PerReplica value holds a different value on each replica and is not a tensor, so it cannot "
    "be used in {what}. Call strategy.experimental_local_results(value) for the components, "
    "strategy.reduce(op, value, axis=None) to combine them, or strategy.gather(value, axis=0) "
    "to concatenate them."
)


class PerReplica(DistributedValues):
    """A different value on each replica, e.g. what `strategy.run` returns.

    Not a tensor: arithmetic or torch functions on it raise `TypeError` that says how to combine
    it (`strategy.reduce`, `strategy.gather`, `strategy.experimental_local_results`).

    Example:
        >>> PerReplica([torch.tensor([0.0, 1.0]), torch.tensor([2.0, 3.0])])
        PerReplica:{0: tensor([0., 1.]), 1: tensor([2., 3.])}
    """

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        name = getattr(func, "__name__", str(func))
        raise ArgumentTypeError(_NOT_A_TENSOR.format(what=f"torch function {name!r}"))

    def __bool__(self) -> bool:
        raise ArgumentTypeError(_NOT_A_TENSOR.format(what="a truth test"))

    def __array__(self, *args, **kwargs):
        raise ArgumentTypeError(_NOT_A_TENSOR.format(what="numpy"))

    def __float__(self) -> float:
        raise ArgumentTypeError(_NOT_A_TENSOR.format(what="float()"))

    def __int__(self) -> int:
        raise ArgumentTypeError(_NOT_A_TENSOR.format(what="int()"))

    def __index__(self) -> int:
        raise ArgumentTypeError(_NOT_A_TENSOR.format(what="indexing"))

    def __getattr__(self, name: str) -> Any:
        if not name.startswith("_") and hasattr(torch.Tensor, name):
            raise ArgumentTypeError(_NOT_A_TENSOR.format(what=f"the tensor method {name!r}"))
        raise AttributeError(f"'PerReplica' object has no attribute {name!r}")


def _refuse(symbol: str) -> Callable[..., Any]:
    def refuse(self, *args):
        raise ArgumentTypeError(_NOT_A_TENSOR.format(what=f"the operator {symbol!r}"))

    return refuse


class Mirrored(DistributedValues):
    """The same value on every replica.

    In cross-replica context it behaves as a tensor reading its primary component; inside
    `strategy.run` it reads the local replica's component.

    Example:
        >>> m = Mirrored([torch.tensor(2.0), torch.tensor(2.0)])
        >>> m + 1
        tensor(3.)
    """

    @property
    def primary(self) -> Any:
        """The first replica's component."""
        return self._values[0]

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        args, kwargs = pytree.tree_map_only(
            Mirrored, Mirrored._local_component, (args, kwargs or {})
        )
        return func(*args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)
        return getattr(self._local_component(), name)

    def __bool__(self) -> bool:
        return bool(self._local_component())

    def __float__(self) -> float:
        return float(self._local_component())

    def __int__(self) -> int:
        return int(self._local_component())

    def __array__(self, *args, **kwargs):
        return self._local_component().__array__(*args, **kwargs)


_BINARY = {
    "add": "+", "sub": "-", "mul": "*", "truediv": "/", "floordiv": "//", "mod": "%",
    "pow": "**", "matmul": "@", "and": "&", "or": "|", "xor": "^", "lt": "<", "le": "<=",
    "gt": ">", "ge": ">=",
}  # fmt: skip


def _delegate(op: Callable[..., Any], reflected: bool = False) -> Callable[..., Any]:
    def method(self, *other):
        value = self._local_component()
        if reflected:
            return op(other[0], value)
        return op(value, *other)

    return method


for _name, _symbol in _BINARY.items():
    _op = getattr(operator, _name if _name not in ("and", "or") else f"{_name}_")
    setattr(PerReplica, f"__{_name}__", _refuse(_symbol))
    setattr(Mirrored, f"__{_name}__", _delegate(_op))
    if _name not in ("lt", "le", "gt", "ge"):
        setattr(PerReplica, f"__r{_name}__", _refuse(_symbol))
        setattr(Mirrored, f"__r{_name}__", _delegate(_op, reflected=True))
for _name in ("neg", "pos", "abs", "invert"):
    setattr(PerReplica, f"__{_name}__", _refuse(_name))
    setattr(Mirrored, f"__{_name}__", _delegate(getattr(operator, _name)))
PerReplica.__getitem__ = _refuse("[]")
Mirrored.__getitem__ = _delegate(operator.getitem)


_variable_types: tuple[type, ...] = ()


def register_variable_type(cls: type) -> type:
    """Count instances of `cls` (a `DistributedValues` subclass) as distributed variables,
    which `select_replica` leaves whole unless asked to unwrap them. `nbdist.core.variables`
    registers `DistributedVariable` (this module cannot import it: it imports this one)."""
    global _variable_types
    _variable_types = (*_variable_types, cls)
    return cls


def _is_distributed_variable(value: Any) -> bool:
    return isinstance(value, _variable_types)


def select_replica(
    local_index: int,
    structure: Any,
    *,
    unwrap_variables: bool = False,
    replicas: int | None = None,
) -> Any:
    """Replace every `DistributedValues` in a nested structure by one replica's component.

    Distributed variables are kept whole (they resolve to the local component when read in
    replica context) unless `unwrap_variables` is set, as `StrategyExtended.update` needs.
    With `replicas` (the arguments of `strategy.run`), a value whose number of components is
    neither 1 nor `replicas` raises `InvalidArgumentError` instead of losing components.

    Example:
        >>> select_replica(1, {"x": PerReplica([1, 2]), "y": 3})
        {'x': 2, 'y': 3}
    """
    if type(structure) in (tuple, list, dict):
        # Nothing to select when no top-level value is distributed or a container (the common
        # `args=(model, optimizer, x, y)`): skip the walk, which costs ~35 Python calls. A
        # value that is neither is a leaf of the walk, and `pick` returns it as it is. A plain
        # loop, not `all(...)` over a generator: this runs once per `strategy.run`, where
        # every Python call counts (Note [Calls per collective]).
        for value in structure.values() if type(structure) is dict else structure:
            kind = type(value)
            if kind not in _PLAIN_LEAVES and (
                kind in pytree.SUPPORTED_NODES or isinstance(value, _MAY_HOLD_DISTRIBUTED)
            ):
                break
        else:
            return structure

    def pick(value: Any) -> Any:
        if isinstance(value, DistributedValues) and (
            unwrap_variables or not _is_distributed_variable(value)
        ):
            count = len(value.values)
            if replicas is not None and count not in (1, replicas):
                raise InvalidArgumentError(
                    f"A {type(value).__name__} with {count} components was passed to "
                    f"strategy.run, but the strategy has {replicas} replica(s) here. Pass one "
                    "component per replica, in replica order (e.g. a value made by this "
                    "strategy's experimental_distribute_values_from_function), or a plain value "
                    "that every replica gets."
                )
            return value.values[local_index] if count > 1 else value.values[0]
        return value

    return pytree.tree_map(pick, structure, is_leaf=lambda v: isinstance(v, DistributedValues))


# Not torch.Tensor, whose import this module does not wait for: a tensor costs one dict lookup
# and one isinstance more in `pick_replica`'s loop, no Python call.
_PLAIN_LEAVES = frozenset({int, float, bool, str, type(None)})
# Besides registered node types: namedtuples and other tuple subclasses are nodes of the walk.
_MAY_HOLD_DISTRIBUTED = (DistributedValues, tuple)


def regroup(
    per_replica: Sequence[Any],
    *,
    replica_ids: Sequence[int] | None = None,
    devices: Sequence[str] | None = None,
    kind: type[DistributedValues] | None = None,
    always_wrap: bool = False,
) -> Any:
    """Merge the replicas' nested results leaf by leaf.

    A leaf that is the identical object on every replica is returned as itself (with
    `always_wrap`, it too becomes a distributed value, as TF's `regroup(always_wrap=True)`);
    otherwise the replicas' leaves become one `PerReplica`. With one replica the result is
    returned as it is.

    Raises:
        ValueError: the replicas returned differently shaped structures.

    Example:
        >>> regroup([(1, "a"), (2, "a")])
        (PerReplica:{0: 1, 1: 2}, 'a')
    """
    if len(per_replica) == 1:
        return per_replica[0]
    is_leaf = lambda v: isinstance(v, DistributedValues)  # noqa: E731
    flat0, spec0 = pytree.tree_flatten(per_replica[0], is_leaf=is_leaf)
    columns = [flat0]
    for index, result in enumerate(per_replica[1:], start=1):
        flat, spec = pytree.tree_flatten(result, is_leaf=is_leaf)
        if spec != spec0:
            raise InvalidArgumentError(
                "Replicas returned differently structured results: replica 0 returned "
                f"{_describe(per_replica[0])} but replica {index} returned {_describe(result)}. "
                "Make the function given to strategy.run return the same structure on every "
                "replica."
            )
        columns.append(flat)
    leaves = []
    for components in zip(*columns):
        first = components[0]
        if not always_wrap and all(c is first for c in components):
            leaves.append(first)
        else:
            leaves.append(
                (kind or PerReplica)(components, replica_ids=replica_ids, devices=devices)
            )
    return pytree.tree_unflatten(leaves, spec0)


def _describe(value: Any) -> str:
    text = repr(pytree.tree_map(lambda leaf: type(leaf).__name__, value))
    return text if len(text) < 200 else text[:197] + "..."
