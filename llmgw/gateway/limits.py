"""Requests and tokens per minute, per key and per scope up the tree (domain.md, Tenancy).

Each limit is a sliding window of one minute, estimated from two fixed windows
the way most rate limiters do: what the current minute counted, plus what the
last minute counted weighted by how much of it the sliding window still
covers. `verdict` is the whole rule, pure.

Tokens are reserved when a request is admitted: it counts at once against every
token limit along its chain for all it may use (its prompt, estimated, and the
completion it asks for, `reservation`), and what it did not use is given back
when it ends (`Limiter.settle`). Requests in flight so see each other's
reservations, and a burst of them cannot pass a limit that each alone would
fit. The counts live in the process (embedded) or in Redis (production, shared
by every `llmgw serve`), behind `Counters`: a request's costs are added and the
counts before them read in one step (`take`), given back when it is refused.
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


def verdict(
    limit: int,
    previous: int,
    current: int,
    elapsed: float,
    cost: int = 1,
    age: float | None = None,
) -> int | None:
    """None when `cost` more fits under `limit` now; otherwise the whole seconds to wait.

    `previous` and `current` are the counts of the last and the current fixed minute,
    `elapsed` how far into the current minute we are (0 to 60). The wait is the least
    after which the same cost fits, with nothing else counted meanwhile. `age`, when known,
    is how long ago the latest request counted was let in: a minute after it, all that is
    counted has left a sliding minute, so no wait is longer than that (the two-minute
    estimate alone can ask for up to 120 s).
    """
    wait = _estimate_wait(limit, previous, current, elapsed, cost)
    if wait is None or age is None or limit < cost:
        return wait
    return min(wait, max(1, math.ceil(WINDOW_S - age)))


def _estimate_wait(limit: int, previous: int, current: int, elapsed: float, cost: int):
    if limit < cost:
        return 2 * WINDOW_S  # never fits: a limit of nothing (admin or database may hold 0)
    cover = (WINDOW_S - elapsed) / WINDOW_S
    # Within a float's rounding of the limit is at it: the wait said is then the wait needed.
    if previous * cover + current + cost <= limit + 1e-9:
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
    cost: int  # 1 for a request; for tokens, what the request reserves (at most the limit)

    @property
    def tokens(self) -> bool:
        return self.subject.endswith(":tok")


@dataclass(frozen=True, slots=True)
class Refusal:
    subject: str
    limit: int
    retry_after: int


def judge(
    checks: Sequence[Check],
    counts: Sequence[tuple[int, int]],
    elapsed: float,
    ages: Sequence[float | None] | None = None,
):
    """The first check that does not fit, with the longest wait among those that do not.
    `ages`: per check, how long ago its latest admission was (`verdict`), when known."""
    worst: Refusal | None = None
    ages = ages or [None] * len(checks)
    for check, (previous, current), age in zip(checks, counts, ages, strict=True):
        wait = verdict(check.limit, previous, current, elapsed, check.cost, age)
        if wait is not None and (worst is None or wait > worst.retry_after):
            worst = Refusal(check.subject, check.limit, wait)
    return worst


def prompt_estimate(body_bytes: int) -> int:
    """A request's prompt tokens, about, before any engine has counted them: one for every
    four bytes of its body. The gateway has no tokenizer; four characters a token is
    English text's usual rate, and the JSON around the prompt makes up for text that
    takes more (code, other scripts)."""
    return body_bytes // 4 + 1


def reservation(
    *, prompt: int, asked: int | None, default: int, cap: int | None, choices: int = 1
) -> int:
    """The tokens a request may use, reserved against the token limits when it is admitted:
    its prompt estimate and, for each of its `choices` (`n`), the completion tokens it asked
    for (`max_tokens`), or, when it asked for none, `default`, or the model's `cap` (its
    max_output) when that is less. An embedding asks for none and is given a default of 0."""
    if asked is None:
        asked = default if cap is None else min(default, cap)
    return prompt + choices * asked


Held = list[tuple[str, int]]  # the token limits' subjects a request holds, and how much


def _minute(now: float) -> tuple[int, float]:
    minute = int(now // WINDOW_S)
    return minute, now - minute * WINDOW_S


class LocalCounters:
    """The counts in this process: embedded mode, one `llmgw serve`. `take` never yields to
    the loop, so no other request is admitted between its read and its add."""

    def __init__(self) -> None:
        self._counts: dict[tuple[str, int], int] = {}
        self._last: dict[tuple[str, int], float] = {}  # the latest admission, per minute
        self._minute = 0

    def admitted(self, subjects: Sequence[str], now: float) -> None:
        """A request was let in at `now`, counted against `subjects`."""
        minute = self._roll(now)
        for subject in subjects:
            self._last[(subject, minute)] = now

    async def lasts(self, subjects: Sequence[str], now: float) -> list[tuple[float | None, ...]]:
        """Per subject, its latest admission in the last and in the current minute (None:
        none known)."""
        minute = self._roll(now)
        return [(self._last.get((s, minute - 1)), self._last.get((s, minute))) for s in subjects]

    async def take(
        self, amounts: Sequence[tuple[str, int]], now: float
    ) -> list[tuple[int, int]] | None:
        """Add each amount to its subject's current minute; the counts (last minute, this
        minute) each subject had before."""
        minute = self._roll(now)
        counts = self._counts
        before = []
        for subject, amount in amounts:
            k = (subject, minute)
            current = counts.get(k, 0)
            before.append((counts.get((subject, minute - 1), 0), current))
            counts[k] = current + amount
        return before

    def add(self, amounts: Sequence[tuple[str, int]], now: float) -> None:
        """Add (or, negative, take back) amounts in the minute of `now`, which may be a minute
        gone by (a settlement of a request admitted then); older ones count for nothing."""
        minute = int(now // WINDOW_S)
        if minute < self._roll(now) - 1:
            return
        for subject, amount in amounts:
            k = (subject, minute)
            self._counts[k] = self._counts.get(k, 0) + amount

    def _roll(self, now: float) -> int:
        """The latest minute seen; minutes before the last one are forgotten as it moves."""
        minute = int(now // WINDOW_S)
        if minute > self._minute:
            self._minute = minute
            self._counts = {k: v for k, v in self._counts.items() if k[1] >= minute - 1}
            self._last = {k: v for k, v in self._last.items() if k[1] >= minute - 1}
        return self._minute


class RedisCounters:
    """The counts in Redis, shared by every gateway process. One round trip to take (each
    INCRBY answers the count with this request's cost in it, so two processes admitting at
    once each see the other's); settlements and give-backs are sent in the background.
    When Redis is away, limits are not enforced (and it is logged): inference keeps
    working."""

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

    async def take(
        self, amounts: Sequence[tuple[str, int]], now: float
    ) -> list[tuple[int, int]] | None:
        """As LocalCounters.take; None when Redis could not be asked (nothing is taken)."""
        if time.monotonic() < self._away_until:
            return None
        minute, _ = _minute(now)
        try:
            async with self._redis.pipeline(transaction=False) as pipe:
                for subject, amount in amounts:
                    k = f"{self.PREFIX}{subject}:{minute}"
                    pipe.incrby(k, amount)
                    pipe.expire(k, 3 * WINDOW_S)
                    pipe.get(f"{self.PREFIX}{subject}:{minute - 1}")
                values = await pipe.execute()
        except Exception as exc:  # noqa: BLE001 - any Redis failure means: not enforced now
            self._warn(exc)
            return None
        before = []
        for i, (_, amount) in enumerate(amounts):
            after, _, previous = values[3 * i : 3 * i + 3]
            # Below 0 only where a settlement reached a minute whose reservation had expired.
            before.append((max(0, int(previous or 0)), max(0, after - amount)))
        return before

    def add(self, amounts: Sequence[tuple[str, int]], now: float) -> None:
        if not amounts or time.monotonic() < self._away_until:
            return
        task = asyncio.get_running_loop().create_task(self._add(amounts, _minute(now)[0]))
        self._pending.add(task)
        task.add_done_callback(self._pending.discard)

    def admitted(self, subjects: Sequence[str], now: float) -> None:
        if not subjects or time.monotonic() < self._away_until:
            return
        task = asyncio.get_running_loop().create_task(self._admitted(subjects, now))
        self._pending.add(task)
        task.add_done_callback(self._pending.discard)

    async def _admitted(self, subjects: Sequence[str], now: float) -> None:
        minute, _ = _minute(now)
        try:
            async with self._redis.pipeline(transaction=False) as pipe:
                for subject in subjects:
                    pipe.set(f"{self.PREFIX}{subject}:{minute}:at", repr(now), ex=3 * WINDOW_S)
                await pipe.execute()
        except Exception as exc:  # noqa: BLE001
            self._warn(exc)

    async def lasts(self, subjects: Sequence[str], now: float) -> list[tuple[float | None, ...]]:
        """As LocalCounters.lasts; all unknown when Redis could not be asked."""
        minute, _ = _minute(now)
        try:
            async with self._redis.pipeline(transaction=False) as pipe:
                for subject in subjects:
                    pipe.get(f"{self.PREFIX}{subject}:{minute - 1}:at")
                    pipe.get(f"{self.PREFIX}{subject}:{minute}:at")
                values = await pipe.execute()
        except Exception as exc:  # noqa: BLE001
            self._warn(exc)
            return [(None, None)] * len(subjects)
        found = [float(v) if v is not None else None for v in values]
        return [tuple(found[2 * i : 2 * i + 2]) for i in range(len(subjects))]

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
    """Checks a request against every limit along its key's chain, holds what it may use,
    and settles what it used."""

    def __init__(self, counters) -> None:
        self.counters = counters

    @staticmethod
    def checks(key, limits, tokens: int) -> list[Check]:
        """The checks for a key (its own limits, then each scope's up the tree), for a request
        reserving `tokens`. A request that may use more than a whole limit reserves all of
        it: it waits for an empty window rather than never going."""
        checks: list[Check] = []
        own = (f"key:{key.id}", (key.requests_per_minute, key.tokens_per_minute))
        for who, (rpm, tpm) in (own, *((s, limits[s]) for s in key.scopes if s in limits)):
            if rpm is not None:
                checks.append(Check(f"{who}:req", rpm, 1))
            if tpm is not None:
                checks.append(Check(f"{who}:tok", tpm, max(1, min(tokens, tpm))))
        return checks

    async def admit(self, checks: Sequence[Check], now: float) -> tuple[Refusal | None, Held]:
        """(None, what the request holds of the token limits) when it may go: counted against
        every limit already. (The Refusal, []) when not, its costs given back."""
        if not checks:
            return None, []
        amounts = [(c.subject, c.cost) for c in checks]
        counts = await self.counters.take(amounts, now)
        if counts is None:  # not enforced now (Redis away): nothing was taken
            return None, []
        elapsed = _minute(now)[1]
        refusal = judge(checks, counts, elapsed)
        if refusal is not None:
            refusal = await self._truer(checks, counts, elapsed, now)
        if refusal is not None:
            self.counters.add([(s, -cost) for s, cost in amounts], now)
            return refusal, []
        self.counters.admitted([c.subject for c in checks], now)
        return None, [(c.subject, c.cost) for c in checks if c.tokens]

    async def _truer(self, checks, counts, elapsed: float, now: float) -> Refusal | None:
        """A refusal judged again with when each limit last let a request in: the last
        minute counts for nothing once its latest admission is a minute old (all of it
        has left the sliding minute), and no wait is longer than until the latest one is.
        Asked only on a refusal, so an admission costs no more."""
        lasts = await self.counters.lasts([c.subject for c in checks], now)
        truer, ages = [], []
        for (previous, current), (last_previous, last_current) in zip(counts, lasts, strict=True):
            if previous and last_previous is not None and now - last_previous >= WINDOW_S - 1e-6:
                previous = 0
            known = (previous == 0 or last_previous is not None) and (
                current == 0 or last_current is not None
            )
            latest = max((t for t in (last_previous, last_current) if t is not None), default=None)
            truer.append((previous, current))
            ages.append(now - latest if known and latest is not None else None)
        return judge(checks, truer, elapsed, ages)

    def settle(self, held: Held, spent: int, admitted: float) -> None:
        """A request admitted at `admitted` ended having used `spent` tokens: each limit it
        held gets back what it did not use (or counts what it used beyond), in the minute
        the reservation was counted."""
        amounts = [(subject, spent - cost) for subject, cost in held if spent != cost]
        if amounts:
            self.counters.add(amounts, admitted)


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
