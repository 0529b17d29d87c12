"""Comparing the collective recorders of several replicas: the first sequence number where
they disagree (a replica missing, another op, shape or dtype).

Every replica's recorder (`nbdist.collectives.recorder`) numbers its collectives as the
process group does, so the same number is the same collective on every replica while they
agree. The comparison starts at the oldest number every replica still keeps (the rings hold
the last N each) and stops at the first number where they differ.

Example:
    >>> a = [{"seq": 1, "op": "all_reduce:SUM", "shape": (4,), "dtype": "float32"},
    ...      {"seq": 2, "op": "all_reduce:SUM", "shape": (4,), "dtype": "float32"}]
    >>> found = compare_collectives({0: a, 1: a[:1]})
    >>> found.seq, found.reason, found.sides
    (2, 'missing replica', [('all_reduce:SUM (4,) float32', (0,)), ('missing', (1,))])
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

__all__ = ["Disagreement", "compare_collectives"]


@dataclasses.dataclass(frozen=True)
class Disagreement:
    """The first collective where replicas disagree.

    Attributes:
        seq: Its sequence number in the process group (`#seq` in errors and stack views).
        reason: `"missing replica"`, `"different ops"`, `"different shapes"` or
            `"different dtypes"`.
        sides: `(what, replicas)` for each variant seen, the most common first; `what` is
            `"op shape dtype"`, or `"missing"` for replicas that never entered it.
        sites: The user's call site (`file:line`) per replica, where recorded.
    """

    seq: int
    reason: str
    sides: list[tuple[str, tuple[int, ...]]]
    sites: dict[int, str] = dataclasses.field(default_factory=dict)

    def __str__(self) -> str:
        parts = []
        for what, replicas in self.sides:
            for r in replicas:
                site = self.sites.get(r)
                parts.append(f"replica {r}: {what}" + (f" at {site}" if site else ""))
        return f"collective #{self.seq}: {self.reason}: " + "; ".join(parts)


def compare_collectives(cluster_or_records: Any) -> Disagreement | None:
    """The first collective where the replicas' recorders disagree, or None when they agree.

    Args:
        cluster_or_records: A running `nd.Cluster` (its engines' recorders are read, also
            while a cell runs), or `{replica: entries}` / a list of entries per replica,
            each entry a mapping with `seq`, `op`, `shape` and `dtype` (the recorder's).

    Returns:
        A `Disagreement` naming the sequence number and the replicas on each side, or None.
    """
    records = cluster_or_records
    if hasattr(records, "collective_records"):
        records = records.collective_records()
    if not isinstance(records, Mapping):
        records = dict(enumerate(records))
    by_replica = {int(r): {int(e["seq"]): e for e in entries} for r, entries in records.items()}
    kept = [seqs for seqs in by_replica.values() if seqs]
    if len(by_replica) < 2 or not kept:
        return None
    first = max(min(seqs) for seqs in kept)
    last = max(max(seqs) for seqs in kept)
    for seq in range(first, last + 1):
        found = _compare_one(seq, {r: seqs.get(seq) for r, seqs in by_replica.items()})
        if found is not None:
            return found
    return None


def _compare_one(seq: int, entries: Mapping[int, Mapping | None]) -> Disagreement | None:
    present = {r: e for r, e in entries.items() if e is not None}
    if not present:
        return None
    for reason, keys in (
        ("missing replica", None),
        ("different ops", ("op",)),
        ("different shapes", ("op", "shape")),
        ("different dtypes", ("op", "shape", "dtype")),
    ):
        if keys is None:
            if len(present) == len(entries):
                continue
        elif len({tuple(_norm(e.get(k)) for k in keys) for e in present.values()}) == 1:
            continue
        groups: dict[str, list[int]] = {}
        for r, e in sorted(entries.items()):
            groups.setdefault(_describe(e), []).append(r)
        sides = sorted(((w, tuple(rs)) for w, rs in groups.items()), key=lambda s: -len(s[1]))
        sites = {r: _site(e) for r, e in present.items() if _site(e)}
        return Disagreement(seq, reason, sides, sites)
    return None


def _norm(value: Any) -> Any:
    if isinstance(value, Sequence) and not isinstance(value, str):
        return tuple(_norm(v) for v in value)
    return value


def _describe(entry: Mapping | None) -> str:
    if entry is None:
        return "missing"
    shape = _norm(entry.get("shape"))
    return f"{entry.get('op')} {shape} {entry.get('dtype')}"


def _site(entry: Mapping) -> str | None:
    site = entry.get("site")
    if not site:
        return None
    return f"{site[0]}:{site[1]}"
