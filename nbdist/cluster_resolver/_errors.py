"""Cluster errors that are also the builtin TensorFlow raises in the same place.

Every one is a `ClusterConfigError` (so a `ValueError`, as docs/api.md §8 promises for malformed
input) and, where TensorFlow raises `TypeError`, `RuntimeError` or `KeyError` for the same
mistake, that builtin too, so code written against `tf.distribute` keeps catching it.

Example:
    >>> err = ClusterRuntimeError("SLURM_PROCID is not set")
    >>> isinstance(err, ValueError), isinstance(err, RuntimeError)
    (True, True)
"""

from __future__ import annotations

__all__ = ["ClusterKeyError", "ClusterRuntimeError", "ClusterTypeError"]

from nbdist.errors import ClusterConfigError


class ClusterTypeError(ClusterConfigError, TypeError):
    """A cluster description has a value of the wrong type (TensorFlow: `TypeError`)."""


class ClusterRuntimeError(ClusterConfigError, RuntimeError):
    """The environment cannot describe the requested cluster (TensorFlow: `RuntimeError`)."""


class ClusterKeyError(ClusterConfigError, KeyError):
    """Two cluster specs define the same task (TensorFlow: `KeyError`)."""

    def __str__(self) -> str:
        # KeyError quotes its argument; show the message as written.
        return str(self.args[0]) if self.args else ""
