"""An adapter's demand over a window, summed over every gateway process, and the rule that
unloads it from one of its replicas when that demand falls (docs/adapters.md, "Where they
are loaded").

An adapter is loaded on one more replica when every replica holding it queues requests
(`adapters.spread_choice`: an engine's waiting count above 0). The way back uses the same
threshold, turned round, with a replica's worth of room between the two: an adapter held on
more than one replica is unloaded from one when, over a whole window, the most of its
requests in flight at once stayed below what the others would run at once (the slots their
engines said), and no holder queues now. The replica it leaves is the one this gateway sent
fewest of its requests over the window (never a llama-server, which cannot unload). Never
below one replica, one at a time: the window starts again after each unload, and after each
load; the control plane judges the unload again (fleet.services.adapter_unload_commands).

Each gateway process counts only its own requests, so each adds the most it had in flight
at once over each BUCKET_S of wall-clock time to a figure all of them share (the cache,
Redis in production): a bucket's sum is at least the most in flight at once over all of
them then, and the window's demand is its buckets' largest sum.

Pure: the gateway's shim (adapters.shrink) feeds it the engines' readings and the counts.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from fleet.domain.readings import Reading
from llmgw.gateway.tables import Upstream

WINDOW_S = 60.0  # how long an adapter's demand must stay low before a replica lets it go
BUCKET_S = 5.0  # each process adds its peak to the shared figure for each bucket this long


@dataclass
class Window:
    """One adapter's demand since `since` (wall-clock seconds): the most of its requests in
    flight at once (this process's, or all of them once the shared sums are read), and how
    many of them this process sent to each replica."""

    since: float
    peak: int = 0
    sent: dict[str, int] = field(default_factory=dict)

    def saw(self, in_flight: int) -> None:
        """Note that `in_flight` of its requests were in flight at once."""
        self.peak = max(self.peak, in_flight)

    def send(self, replica: str, in_flight: int) -> None:
        """Note one request sent to `replica`, with `in_flight` then in flight, itself too."""
        self.sent[replica] = self.sent.get(replica, 0) + 1
        self.saw(in_flight)

    def done(self, now: float) -> bool:
        """Whether it covers a whole window by `now`."""
        return now - self.since >= WINDOW_S


def bucket_of(at: float) -> int:
    """The bucket holding wall-clock time `at` (epoch seconds): the same in every process."""
    return math.floor(at / BUCKET_S)


def shared_buckets(since: float, now: float) -> range:
    """The buckets of a window from `since` to `now` whose sums every process has added to:
    those ended before the last one (which a process ticking a little later may not have
    added yet). The last seconds are this process's own count and the engines' queues."""
    return range(bucket_of(since), bucket_of(now) - 1)


def demand_peak(sums: Iterable[int]) -> int:
    """The most of an adapter's requests in flight at once over every gateway process, as
    its buckets' sums bound it (a bucket no process added to is 0)."""
    return max(sums, default=0)


@dataclass(frozen=True)
class Shrink:
    """The replica to unload an adapter from, and why, in a sentence with the figures."""

    replica: str
    why: str


def shrink_choice(
    adapter: str, ups: Sequence[Upstream], readings: Mapping[str, Reading], window: Window
) -> Shrink | None:
    """The replica to unload `adapter` from when its demand over `window` fell below what the
    other replicas holding it run at once; None when one or no replica holds it, when a
    holder queues or did not say what it queues or how many requests it runs at once
    (unknown is no reason to unload), or when the demand would not fit on the others."""
    holders = [u for u in ups if _holds(readings.get(u.replica_id), adapter)]
    if len(holders) < 2:
        return None
    slots = {}
    for u in holders:
        reading = readings[u.replica_id]
        if reading.waiting is None or reading.waiting > 0 or reading.slots is None:
            return None
        slots[u.replica_id] = reading.slots
    # llama-server cannot unload an adapter while it runs (fleet/agent/adapters.py).
    able = [u.replica_id for u in holders if u.engine != "llamacpp"]
    if not able:
        return None
    leaving = min(able, key=lambda r: (window.sent.get(r, 0), r))
    kept = sum(n for r, n in slots.items() if r != leaving)
    if window.peak >= kept:
        return None
    others = len(slots) - 1
    return Shrink(
        leaving,
        f"adapter {adapter}'s demand fell: at most {window.peak} of its requests were in "
        f"flight at once over {WINDOW_S:g} s on every gateway process together, below the "
        f"{kept} the other {others} replica{'s' if others != 1 else ''} holding it run at "
        f"once; unloading it from {leaving}, to which this process sent "
        f"{window.sent.get(leaving, 0)} of them",
    )


def _holds(reading: Reading | None, adapter: str) -> bool:
    return reading is not None and reading.holds(adapter)
