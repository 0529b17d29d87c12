"""Collectives behind one interface: in-process (threads) and torch.distributed (processes)."""

from nbdist.collectives.local import LocalGroup

__all__ = ["LocalGroup"]
