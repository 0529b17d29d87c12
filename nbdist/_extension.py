"""`%load_ext nbdist`: IPython's extension hooks (re-exported by `nbdist`).

Imports IPython and the magics only when the extension is loaded.
"""

from __future__ import annotations

from typing import Any

__all__ = ["load_ipython_extension", "unload_ipython_extension"]


def load_ipython_extension(ip: Any) -> None:
    """Register `%dist` and `%%distribute` on the IPython shell `ip`."""
    from nbdist.magics import load

    load(ip)


def unload_ipython_extension(ip: Any) -> None:
    """Stop the cluster started from `ip` and turn `%dist auto` off."""
    from nbdist.magics import unload

    unload(ip)
