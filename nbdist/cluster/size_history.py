"""What a resize leaves behind: `SizeChange` (one entry of a cluster's size history) and
`ScaleReport` (what `cluster.scale` / `%dist scale` did, printed by the magic).

`cluster.size_history`, `%dist status` and the dashboard's engine view show the history
(nbdist.cluster.scaling makes the entries).

Example:
    >>> print(SizeChange(0.0, 2, 3, "scale 2 → 3", 1.5).why)
    scale 2 → 3
"""

from __future__ import annotations

import dataclasses
import datetime

__all__ = ["ScaleReport", "SizeChange"]


@dataclasses.dataclass(frozen=True)
class SizeChange:
    """One entry of a cluster's size history (`cluster.size_history`, `%dist status`).

    Attributes:
        when: Wall-clock time (`time.time()`).
        old: Engines before (0 for the start).
        new: Engines after.
        why: What made it (`"start"`, `"scale 2 → 3"`, `"survivors: replica 1's engine died"`).
        seconds: How long it took.
    """

    when: float
    old: int
    new: int
    why: str
    seconds: float = 0.0

    def __str__(self) -> str:
        stamp = datetime.datetime.fromtimestamp(self.when).strftime("%H:%M:%S")
        return f"{stamp}  {self.old} → {self.new}  {self.why} ({self.seconds:.1f} s)"


@dataclasses.dataclass(frozen=True)
class ScaleReport:
    """What a resize did; `print(report)` says it in a few lines (what `%dist scale` shows).

    Attributes:
        change: The `SizeChange` recorded.
        followed: `{name: what happened to it}` for the strategy's state on replica 0.
        joined: Replica ids of the engines that joined.
        removed: Replica ids (before the resize) of the engines that left or had died.
        hooks: The `@nd.on_scale` functions that ran.
        hook_failures: One line per failure of such a function (replica, name, error).
        printed: What those functions printed, one line each, prefixed by replica id.
    """

    change: SizeChange
    followed: dict[str, str]
    joined: tuple[int, ...] = ()
    removed: tuple[int, ...] = ()
    hooks: tuple[str, ...] = ()
    hook_failures: tuple[str, ...] = ()
    printed: tuple[str, ...] = ()

    def __str__(self) -> str:
        change = self.change
        lines = [
            f"Scaled {change.old} → {change.new} engine(s) in {change.seconds:.2f} s "
            f"({change.why})."
        ]
        if self.followed:
            lines.append("State that followed (the strategy's, made in scope()):")
            lines += [f"  {name}: {what}" for name, what in sorted(self.followed.items())]
        if self.joined:
            lines.append(
                f"Replica(s) {list(self.joined)} are new: they got the strategy's state above "
                "from replica 0; other Python variables were not copied to them. Re-create "
                "those in a function decorated @nd.on_scale (it runs on every engine after "
                "each resize)."
            )
        if self.hooks:
            lines.append(f"@nd.on_scale ran: {', '.join(self.hooks)}.")
        lines += list(self.printed)
        lines += [f"@nd.on_scale failed: {line}" for line in self.hook_failures]
        return "\n".join(lines)
