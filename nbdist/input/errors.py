"""Errors of the input layer: each is an `NbdistError` and the builtin a user would catch.

Imports nbdist.errors only.
"""

from __future__ import annotations

from nbdist.errors import NbdistError

__all__ = [
    "InputError",
    "InputExhaustedError",
    "InputModeError",
    "InputTransformationError",
    "InputTypeError",
    "StepsExhaustedError",
]


class InputError(NbdistError, ValueError):
    """A bad value: invalid options or contexts, an indivisible batch size, a ragged batch.

    Example:
        >>> issubclass(InputError, ValueError)
        True
    """


class InputTypeError(NbdistError, TypeError):
    """Something that is not an iterable of batches, or a batch leaf of an unsupported type.

    Example:
        >>> issubclass(InputTypeError, TypeError)
        True
    """


class InputExhaustedError(NbdistError, RuntimeError):
    """A one-shot iterator (e.g. a generator object) was iterated again after it ran out.

    Example:
        >>> issubclass(InputExhaustedError, RuntimeError)
        True
    """


class StepsExhaustedError(InputExhaustedError, StopIteration):
    """`cluster.strategy.run_steps(fn, iterator)` found the iterator exhausted on every engine
    before its first step: the epoch is over. A `StopIteration` too, as `next()` at the end of
    data is. Make a new iterator on the engines for the next epoch.

    Example:
        >>> issubclass(StepsExhaustedError, StopIteration)
        True
    """


class InputModeError(NbdistError, NotImplementedError):
    """An input option that this way of distributing does not support (as in TensorFlow).

    Example:
        >>> issubclass(InputModeError, NotImplementedError)
        True
    """


class InputTransformationError(NbdistError, AttributeError):
    """A `tf.data`-style transformation (`batch`, `map`, ...) asked of a distributed dataset.

    Example:
        >>> issubclass(InputTransformationError, AttributeError)
        True
    """
