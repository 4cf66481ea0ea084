"""Usage per key, project and model in one-minute buckets, written in batches.

The request path adds to a tally in memory; every few seconds the tallies are
added to the `Usage` rows with one statement (an upsert that adds, so several
gateway processes can write the same bucket), and the replicas used since are
marked used. When the write fails the tallies are kept for the next try.
"""

from __future__ import annotations

import logging
from datetime import datetime

log = logging.getLogger("llmgw.gateway")

# (minute since the epoch, key id, project id, model) -> [requests, errors, prompt, completion,
# latency ms, estimated: of prompt and completion, the tokens no engine counted]
Tallies = dict[tuple[int, int, int, str], list[int]]
FIGURES = 6

MAX_KEPT = 200_000  # tallies kept while the database is away; beyond, the oldest go


class UsageBook:
    """What the request path adds to; only ever touched on the event loop."""

    def __init__(self) -> None:
        self.tallies: Tallies = {}
        self.used: set[str] = set()

    def record(
        self,
        *,
        key_id: int,
        project_id: int,
        model: str,
        prompt: int,
        completion: int,
        error: bool,
        latency_ms: float,
        now: float,
        estimated: int = 0,
    ) -> None:
        k = (int(now // 60), key_id, project_id, model)
        t = self.tallies.get(k)
        if t is None:
            t = self.tallies[k] = [0] * FIGURES
        t[0] += 1
        t[1] += error
        t[2] += prompt
        t[3] += completion
        t[4] += round(latency_ms)
        t[5] += estimated

    def take(self) -> tuple[Tallies, set[str]]:
        tallies, used = self.tallies, self.used
        self.tallies, self.used = {}, set()
        return tallies, used

    def give_back(self, tallies: Tallies, used: set[str]) -> None:
        """A batch that could not be written, merged back under what came since."""
        for k, v in tallies.items():
            t = self.tallies.setdefault(k, [0] * FIGURES)
            for i, x in enumerate(v):
                t[i] += x
        self.used |= used
        if len(self.tallies) > MAX_KEPT:
            for k in sorted(self.tallies)[: len(self.tallies) - MAX_KEPT]:
                del self.tallies[k]
            log.warning("usage kept in memory passed %d rows; the oldest were dropped", MAX_KEPT)


def usage_write(*, tallies: Tallies, used: set[str], now: datetime) -> None:
    """Mark the replicas used, then add the tallies to their rows in one transaction
    (tenancy/services.py `usage_add`, which drops rows of keys deleted meanwhile)."""
    from fleet.services import replicas_used_mark
    from tenancy.services import usage_add

    # Replica use first and on its own: usage that cannot be written must not make busy
    # on-demand replicas look idle.
    if used:
        replicas_used_mark(replica_ids=used, now=now)
    if tallies:
        usage_add(tallies=tallies)
