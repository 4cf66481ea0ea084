"""Which weights a node's cache should let go of (domain.md, Mirror; issue 11, Reclaim).

Never a file a replica on the node uses. Of the rest: any unused for longer
than the keep period, and, while the node's free disk is under the floor, the
least recently used until it is not. Each decision says why, with the figures.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta

GB = 1e9


@dataclass(frozen=True)
class Cached:
    """A file a node's cache holds; ``used_at`` None when the node does not say."""

    sha256: str
    size: int
    used_at: datetime | None = None


@dataclass(frozen=True)
class Reclaim:
    sha256: str
    why: str


def reclaim(
    cached: Iterable[Cached],
    *,
    in_use: set[str],
    now: datetime,
    keep: timedelta,
    free_bytes: int | None,
    floor_bytes: int,
) -> list[Reclaim]:
    """The files to delete, oldest use first."""
    idle = [c for c in cached if c.sha256 not in in_use]
    # A file whose last use is not known counts as the oldest: nothing says it is wanted.
    idle.sort(key=lambda c: (c.used_at is not None, c.used_at or now, c.sha256))
    out: list[Reclaim] = []
    chosen: set[str] = set()
    for c in idle:
        if c.used_at is not None and now - c.used_at > keep:
            days = (now - c.used_at).total_seconds() / 86400
            out.append(Reclaim(c.sha256, f"unused for {days:.0f} days (kept {keep.days})"))
            chosen.add(c.sha256)
    if free_bytes is None or free_bytes >= floor_bytes:
        return out
    free = free_bytes + sum(c.size for c in idle if c.sha256 in chosen)
    for c in idle:
        if free >= floor_bytes:
            break
        if c.sha256 in chosen:
            continue
        out.append(
            Reclaim(
                c.sha256,
                f"the node has {free / GB:.1f} GB free, under the floor of {floor_bytes / GB:.0f} GB",
            )
        )
        chosen.add(c.sha256)
        free += c.size
    return out
