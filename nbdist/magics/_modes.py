"""`%%distribute --output` modes, in a module of their own: registering the magics
(`magics.core`) imports no engine code (Note [Lazy public API] in nbdist).

Example:
    >>> "tabs" in OUTPUT_MODES
    True
"""

__all__ = ["OUTPUT_MODES", "PREFIXED_UP_TO"]

OUTPUT_MODES = ("all", "first", "none", "tabs", "auto")
"""`%%distribute --output`: every replica's lines prefixed, the first target's, none, one tab
per replica (`magics._tabs`), or `auto`: `tabs` for more than `PREFIXED_UP_TO` targets in a
Jupyter kernel, else `all` (docs/notebooks.md argues the choice)."""
PREFIXED_UP_TO = 2
"""`--output auto` prints up to this many replicas' lines prefixed, in one stream."""
