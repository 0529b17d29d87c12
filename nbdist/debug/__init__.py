"""Where is it stuck: engines' live stacks and the collective recorder (`nd.debug`).

- `ReplicaStack`: one replica's threads and the collective it is in (`cluster.stacks()`).
- `format_stacks`: the grouped view `%dist stack` prints.
- `compare_collectives`: the first collective where replicas disagree, or None.

Example:
    >>> import nbdist as nd
    >>> a = [{"seq": 1, "op": "all_reduce:SUM", "shape": (4,), "dtype": "float32"}]
    >>> b = [{"seq": 1, "op": "all_reduce:SUM", "shape": (5,), "dtype": "float32"}]
    >>> found = nd.debug.compare_collectives({0: a, 1: b})
    >>> found.seq, found.reason
    (1, 'different shapes')
"""

from nbdist.debug.collectives import Disagreement, compare_collectives
from nbdist.debug.stacks import ReplicaStack, format_stacks

__all__ = ["Disagreement", "ReplicaStack", "compare_collectives", "format_stacks"]
