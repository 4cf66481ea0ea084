"""Requests and tokens per minute, per key and per scope up the tree (domain.md, Tenancy).

Each limit is a sliding window of one minute, estimated from two fixed windows
the way most rate limiters do: what the current minute counted, plus what the
last minute counted weighted by how much of it the sliding window still
covers. `verdict` is the whole rule, pure. The counts live in the process
(embedded) or in Redis (production, shared by every `llmgw serve`), behind
`Counters`: one read before a request, increments after, never waited on.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass

log = logging.getLogger("llmgw.gateway")

WINDOW_S = 60


def verdict(limit: int, previous: int, current: int, elapsed: float, cost: int = 1) -> int | None:
    """None when `cost` more fits under `limit` now; otherwise the whole seconds to wait.

    `previous` and `current` are the counts of the last and the current fixed minute,
    `elapsed` how far into the current minute we are (0 to 60). The wait is the least
    after which the same cost fits, with nothing else counted meanwhile.
    """
    if limit < cost:
        return 2 * WINDOW_S  # never fits: a limit of nothing (admin or database may hold 0)
    cover = (WINDOW_S - elapsed) / WINDOW_S
    if previous * cover + current + cost <= limit:
        return None
    room = limit - cost
    if current > room:
        # The current minute alone is past it: wait for it to end, and then for enough of
        # it to slide out of the window.
        after = WINDOW_S * (1 - max(room, 0) / current)
        return max(1, math.ceil(WINDOW_S - elapsed + after))
    # Enough of the last minute has to slide out: wait until previous * cover <= room - current.
    needed_cover = (room - current) / previous
    wait = WINDOW_S * (1 - needed_cover) - elapsed
    return max(1, math.ceil(wait))


@dataclass(frozen=True, slots=True)
class Check:
    """One limit to check: `subject` such as "key:4:req" or "team:2:tok", and its figure."""

    subject: str
    limit: int
    cost: int  # 1 for a request; 1 for tokens (there must be one token of room left)


@dataclass(frozen=True, slots=True)
class Refusal:
    subject: str
    limit: int
    retry_after: int


def judge(checks: Sequence[Check], counts: Sequence[tuple[int, int]], elapsed: float):
    """The first check that does not fit, with the longest wait among those that do not."""
    worst: Refusal | None = None
    for check, (previous, current) in zip(checks, counts, strict=True):
        wait = verdict(check.limit, previous, current, elapsed, check.cost)
        if wait is not None and (worst is None or wait > worst.retry_after):
            worst = Refusal(check.subject, check.limit, wait)
    return worst


def _minute(now: float) -> tuple[int, float]:
    minute = int(now // WINDOW_S)
    return minute, now - minute * WINDOW_S


class LocalCounters:
    """The counts in this process: embedded mode, one `llmgw serve`."""

    def __init__(self) -> None:
        self._counts: dict[tuple[str, int], int] = {}
        self._minute = 0

    async def read(self, subjects: Sequence[str], now: float) -> list[tuple[int, int]]:
        minute, _ = _minute(now)
        get = self._counts.get
        return [(get((s, minute - 1), 0), get((s, minute), 0)) for s in subjects]

    def add(self, amounts: Sequence[tuple[str, int]], now: float) -> None:
        minute, _ = _minute(now)
        if minute != self._minute:
            self._minute = minute
            self._counts = {k: v for k, v in self._counts.items() if k[1] >= minute - 1}
        for subject, amount in amounts:
            k = (subject, minute)
            self._counts[k] = self._counts.get(k, 0) + amount


class RedisCounters:
    """The counts in Redis, shared by every gateway process. One round trip to read; adds
    are sent in the background. When Redis is away, limits are not enforced (and it is
    logged): inference keeps working."""

    PREFIX = "llmgw:rl:"

    def __init__(self, url: str) -> None:
        import redis.asyncio as redis

        # Short timeouts: a Redis that hangs must not hold requests up; then left alone a while.
        self._redis = redis.from_url(url, socket_timeout=0.25, socket_connect_timeout=0.25)
        self._pending: set[asyncio.Task] = set()
        self._warned_at = 0.0
        self._away_until = 0.0

    def _warn(self, exc: Exception) -> None:
        self._away_until = time.monotonic() + 5
        if time.monotonic() - self._warned_at > 60:
            self._warned_at = time.monotonic()
            log.warning("rate limits not enforced: Redis is unreachable (%s)", exc)

    async def read(self, subjects: Sequence[str], now: float) -> list[tuple[int, int]]:
        if time.monotonic() < self._away_until:
            return [(0, 0)] * len(subjects)
        minute, _ = _minute(now)
        keys = []
        for s in subjects:
            keys += (f"{self.PREFIX}{s}:{minute - 1}", f"{self.PREFIX}{s}:{minute}")
        try:
            values = await self._redis.mget(keys)
        except Exception as exc:  # noqa: BLE001 - any Redis failure means: not enforced now
            self._warn(exc)
            return [(0, 0)] * len(subjects)
        ints = [int(v) if v else 0 for v in values]
        return [(ints[i], ints[i + 1]) for i in range(0, len(ints), 2)]

    def add(self, amounts: Sequence[tuple[str, int]], now: float) -> None:
        if not amounts or time.monotonic() < self._away_until:
            return
        task = asyncio.get_running_loop().create_task(self._add(amounts, _minute(now)[0]))
        self._pending.add(task)
        task.add_done_callback(self._pending.discard)

    async def _add(self, amounts: Sequence[tuple[str, int]], minute: int) -> None:
        try:
            async with self._redis.pipeline(transaction=False) as pipe:
                for subject, amount in amounts:
                    k = f"{self.PREFIX}{subject}:{minute}"
                    pipe.incrby(k, amount)
                    pipe.expire(k, 3 * WINDOW_S)
                await pipe.execute()
        except Exception as exc:  # noqa: BLE001
            self._warn(exc)


class Limiter:
    """Checks a request against every limit along its key's chain, and counts it."""

    def __init__(self, counters) -> None:
        self.counters = counters

    @staticmethod
    def checks(key, limits) -> tuple[list[Check], list[str], list[str]]:
        """The checks for a key (its own limits, then each scope's up the tree), and the
        subjects a request and its tokens count against."""
        checks: list[Check] = []
        requests: list[str] = []
        tokens: list[str] = []
        own = (f"key:{key.id}", (key.requests_per_minute, key.tokens_per_minute))
        for who, (rpm, tpm) in (own, *((s, limits[s]) for s in key.scopes if s in limits)):
            if rpm is not None:
                checks.append(Check(f"{who}:req", rpm, 1))
                requests.append(f"{who}:req")
            if tpm is not None:
                checks.append(Check(f"{who}:tok", tpm, 1))
                tokens.append(f"{who}:tok")
        return checks, requests, tokens

    async def admit(self, checks: Sequence[Check], requests: Sequence[str], now: float):
        """None when the request may go (and it is counted), else the Refusal."""
        if not checks:
            return None
        counts = await self.counters.read([c.subject for c in checks], now)
        refusal = judge(checks, counts, _minute(now)[1])
        if refusal is None:
            self.counters.add([(s, 1) for s in requests], now)
        return refusal

    def spent(self, tokens: Sequence[str], amount: int, now: float) -> None:
        if tokens and amount > 0:
            self.counters.add([(s, amount) for s in tokens], now)


def refusal_sentence(refusal: Refusal, key, scope_names) -> str:
    """ "Rate limit reached: team:Acme/ml allows 600 requests per minute; try again in 7 s."."""
    who, _, kind = refusal.subject.rpartition(":")
    what = "requests" if kind == "req" else "tokens"
    if who.startswith("key:"):
        name = f"this API key ({key.prefix}…)"
    else:
        name = scope_names.get(who, who)
    return (
        f"Rate limit reached: {name} allows {refusal.limit} {what} per minute; "
        f"try again in {refusal.retry_after} s."
    )
