"""How ``llmgw ctl bench`` judges what it measured: summaries of each level against the
model's SLO, the capacity among them, the sentences that say so, and the figures stored
per replica.

Pure: samples in, summaries and decisions out, with no I/O and no clock; the
load that makes the samples is :mod:`llmgw.cli.bench_load`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from llmgw.cli.base import CtlError
from llmgw.cli.bench_power import (
    PowerSample,
    ShareSample,
    held_text,
    held_to,
    mean_draw,
    power_text,
)
from llmgw.cli.tables import DASH, number

PERCENTILE = 95


@dataclass(frozen=True)
class RequestResult:
    """One request of the ramp: how fast its tokens came, or why it failed.

    ``ttft_ms`` is None when no token came; ``tpot_ms`` when fewer than two did.
    """

    ok: bool
    ttft_ms: float | None = None
    tpot_ms: float | None = None
    completion_tokens: int = 0
    error: str = ""


@dataclass(frozen=True)
class EngineLook:
    """The model's ready replicas' engines at one moment of a level, as ``GET /replicas``
    showed what their agents last reported: requests queued, summed over those that said,
    and their KV caches' use on average, as the autoscaler compares it with kv_ceiling
    (fleet.selectors); None where none said. ``power`` is what they drew then and ``held``
    the share of their default power limit their GPUs were held to
    (``GET /models/{name}/power``); None: not asked, or no replica was ready."""

    waiting: int | None = None
    kv_cache: float | None = None
    power: PowerSample | None = None
    held: ShareSample | None = None


@dataclass(frozen=True)
class LevelSample:
    """The requests that finished at one level of concurrency, how long the level ran, and
    what the engines said while it ran."""

    concurrency: int
    wall_s: float
    results: tuple[RequestResult, ...]
    looks: tuple[EngineLook, ...] = ()


def engine_look(replicas: Any) -> EngineLook:
    """What ``GET /replicas?model=`` says the ready replicas' engines run (their ``engine``)."""
    waiting: list[int] = []
    kv: list[float] = []
    for r in replicas if isinstance(replicas, list) else ():
        said = r.get("engine") if isinstance(r, Mapping) and r.get("state") == "ready" else None
        if not isinstance(said, Mapping):
            continue
        if _number(said.get("waiting")) is not None:
            waiting.append(int(said["waiting"]))
        if _number(said.get("kv_cache")) is not None:
            kv.append(float(said["kv_cache"]))
    return EngineLook(sum(waiting) if waiting else None, sum(kv) / len(kv) if kv else None)


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        return None
    return float(value)


@dataclass(frozen=True)
class Slo:
    """A model's promise at the 95th percentile; None is no promise on that figure."""

    ttft_p95_ms: float | None = None
    tpot_p95_ms: float | None = None

    @classmethod
    def from_view(cls, view: Any) -> Slo:
        """The ``slo`` of a ModelView; a missing, zero or non-numeric figure is not set."""

        def figure(value: Any) -> float | None:
            if isinstance(value, bool) or not isinstance(value, int | float):
                return None
            return float(value) if value > 0 and math.isfinite(value) else None

        slo = view.get("slo") if isinstance(view, Mapping) else None
        if not isinstance(slo, Mapping):
            return cls()
        return cls(figure(slo.get("ttft_p95_ms")), figure(slo.get("tpot_p95_ms")))

    @property
    def is_set(self) -> bool:
        return self.ttft_p95_ms is not None or self.tpot_p95_ms is not None


@dataclass(frozen=True)
class LevelSummary:
    """One level as the table shows it.

    ``meets_slo`` is None when there is no SLO to judge by; ``misses`` says why
    a level did not meet it (or, with no SLO, that requests failed).
    """

    concurrency: int
    requests: int
    errors: int
    ttft_p95_ms: float | None
    tpot_p95_ms: float | None
    tok_per_sec: float
    meets_slo: bool | None
    misses: tuple[str, ...] = ()
    first_error: str = ""
    # The most requests the engines queued, and their fullest KV caches on average, seen
    # while it ran;
    # None when no engine said (the sim, vLLM and llama-server say; a llama-server no KV).
    waiting_max: int | None = None
    kv_cache_max: float | None = None
    # What the ready replicas drew while it ran, on average over its samples; None when
    # unknown, with `power_silent` saying whose readings were absent (empty: no sample).
    watts: float | None = None
    power_silent: tuple[str, ...] = ()
    # The share of their default power limit their GPUs were held to throughout (1: at it);
    # None when unknown, with `power_share_silent` saying why (empty: no GPU sampled).
    power_share: float | None = None
    power_share_silent: tuple[str, ...] = ()


@dataclass(frozen=True)
class Judgement:
    """Every level's summary, the capacity (the last level of the run that met the SLO
    with every level below it) and the first level that missed, if one did."""

    levels: tuple[LevelSummary, ...]
    capacity: LevelSummary | None
    missed: LevelSummary | None
    slo: Slo


def percentile(values: Sequence[float], p: int = PERCENTILE) -> float | None:
    """The nearest-rank percentile: the smallest value with at least p% of them at or below it.

    Always one of the values, never interpolated; None for no values.
    """
    if not 0 < p <= 100:
        raise ValueError(f"a percentile is above 0 and at most 100, not {p}")
    if not values:
        return None
    ordered = sorted(values)
    rank = -(-p * len(ordered) // 100)  # ceil(p * n / 100) without floating point
    return ordered[rank - 1]


def ms_text(value: float | None) -> str:
    """``180 ms``; below 10 ms with one decimal, so a fast engine does not read ``0 ms``."""
    if value is None:
        return DASH
    return f"{value:.0f} ms" if value >= 10 else f"{number(value)} ms"


def summarize(sample: LevelSample, slo: Slo) -> LevelSummary:
    """A level's requests, errors, p95s and throughput, and whether it met the SLO."""
    results = sample.results
    good = [r for r in results if r.ok]
    failed = [r for r in results if not r.ok]
    ttft = percentile([r.ttft_ms for r in good if r.ttft_ms is not None])
    tpot = percentile([r.tpot_ms for r in good if r.tpot_ms is not None])
    tokens = sum(r.completion_tokens for r in good)
    tok_per_sec = tokens / sample.wall_s if sample.wall_s > 0 else 0.0
    misses: list[str] = []
    if not results:
        misses.append("no request finished")
    if failed:
        misses.append(f"{len(failed)} of {len(results)} requests failed")
    if slo.is_set:
        for label, got, limit in (
            ("ttft", ttft, slo.ttft_p95_ms),
            ("tpot", tpot, slo.tpot_p95_ms),
        ):
            if limit is None:
                continue
            if got is None:
                if good:
                    misses.append(f"no {label} measured")
            elif got > limit:
                misses.append(f"{label} p95 {ms_text(got)} > {number(limit)}")
    waiting = [look.waiting for look in sample.looks if look.waiting is not None]
    kv = [look.kv_cache for look in sample.looks if look.kv_cache is not None]
    drawn = mean_draw([look.power for look in sample.looks if look.power is not None])
    held = held_to([look.held for look in sample.looks if look.held is not None])
    return LevelSummary(
        waiting_max=max(waiting) if waiting else None,
        kv_cache_max=max(kv) if kv else None,
        watts=drawn.watts,
        power_silent=drawn.silent,
        power_share=held.share,
        power_share_silent=held.silent,
        concurrency=sample.concurrency,
        requests=len(results),
        errors=len(failed),
        ttft_p95_ms=ttft,
        tpot_p95_ms=tpot,
        tok_per_sec=tok_per_sec,
        meets_slo=(not misses) if slo.is_set else None,
        misses=tuple(misses),
        first_error=failed[0].error if failed else "",
    )


def goes_on(level: LevelSummary) -> bool:
    """Whether the ramp tries the next level: not after a miss, nor (with no SLO) errors."""
    return not level.misses


def judge(samples: Sequence[LevelSample], slo: Slo) -> Judgement:
    """Summaries of the levels in the order run, and the capacity among them.

    The capacity is the last level of the unbroken run of levels, from the
    first, that met the SLO: a level that met it above one that missed does not
    count, as latency that came back at more load is luck. With no SLO there is
    none.
    """
    levels = tuple(summarize(sample, slo) for sample in samples)
    capacity = missed = None
    if slo.is_set:
        for level in levels:
            if not level.meets_slo:
                missed = level
                break
            capacity = level
    return Judgement(levels=levels, capacity=capacity, missed=missed, slo=slo)


def ladder(max_concurrency: int) -> tuple[int, ...]:
    """1, 2, 4, … up to ``max_concurrency``, which ends it even when not a power of two."""
    levels = []
    n = 1
    while n < max_concurrency:
        levels.append(n)
        n *= 2
    levels.append(max_concurrency)
    return tuple(levels)


def at_once(n: int) -> str:
    return f"{n} request{'' if n == 1 else 's'} at once"


def slo_text(level: LevelSummary, slo: Slo) -> str:
    """``ttft p95 180 ms ≤ 500, tpot p95 31 ms ≤ 50``: each set figure against its limit."""
    parts = []
    for label, got, limit in (
        ("ttft", level.ttft_p95_ms, slo.ttft_p95_ms),
        ("tpot", level.tpot_p95_ms, slo.tpot_p95_ms),
    ):
        if limit is not None:
            sign = "≤" if got is not None and got <= limit else ">"
            parts.append(f"{label} p95 {ms_text(got)} {sign} {number(limit)}")
    return ", ".join(parts)


def miss_text(level: LevelSummary) -> str:
    """Why a level missed: ``3 of 40 requests failed (503 …), ttft p95 620 ms > 500``."""
    parts = list(level.misses)
    for i, part in enumerate(parts):
        if part.endswith("requests failed") and level.first_error:
            parts[i] = f"{part} ({level.first_error})"
    return ", ".join(parts)


def verdict(j: Judgement, *, model: str, last_tried: int | None, interrupted: bool) -> list[str]:
    """The sentences under the table: the capacity, or why there is none."""
    if not j.levels:
        return ["nothing was measured"]
    if not j.slo.is_set:
        return [
            f"no capacity judged: {model} has no SLO (slo.ttft_p95_ms or slo.tpot_p95_ms) "
            "to measure against"
        ]
    if j.capacity is None:
        first = j.missed or j.levels[0]
        return [f"no capacity: at {at_once(first.concurrency)}, {miss_text(first)}"]
    c = j.capacity
    line = f"capacity: {at_once(c.concurrency)}, {c.tok_per_sec:.0f} tok/s ({slo_text(c, j.slo)})"
    lines = [line]
    if (seen := engines_seen(c)) is not None:
        lines.append(seen)
    if (drawn := power_text(c.watts, c.power_silent, c.tok_per_sec)) is not None:
        lines.append(drawn)
    if (capped := held_text(c.power_share)) is not None:
        lines.append(capped)
    if j.missed is not None:
        lines.append(f"at {at_once(j.missed.concurrency)}: {miss_text(j.missed)}")
    elif interrupted:
        lines.append("stopped by Ctrl-C before any level missed: it may serve more")
    elif c.concurrency == last_tried:
        lines.append("no level tried missed: it may serve more (raise --max-concurrency)")
    return lines


def engines_seen(level: LevelSummary) -> str | None:
    """What the engines said at a level, for the model's `target_waiting` and `kv_ceiling`:
    "there its engines queued at most 3 requests and their KV caches were at most 87% full
    on average"; None when no engine said either."""
    parts = []
    if level.waiting_max is not None:
        n = level.waiting_max
        parts.append(f"its engines queued at most {n} request{'s' if n != 1 else ''}")
    if level.kv_cache_max is not None:
        parts.append(f"their KV caches were at most {level.kv_cache_max:.0%} full on average")
    if not parts:
        return None
    return "there " + " and ".join(parts) + " (scaling's target_waiting and kv_ceiling)"


@dataclass(frozen=True)
class ReplicaBasis:
    """How many ready replicas shared the load, and the profile the measurement is stored for."""

    ready: int
    profile: str


def replica_basis(replicas: Any, *, model: str, profile: str | None) -> ReplicaBasis:
    """The ready replicas of ``GET /replicas?model=`` and their profile.

    CtlError when none is ready; CtlError(2) when they run several profiles and
    no ``--profile`` names one of them.
    """
    ready = [
        r
        for r in replicas or ()
        if isinstance(r, Mapping) and r.get("state") == "ready" and r.get("model", model) == model
    ]
    if not ready:
        raise CtlError(
            f"{model} has no ready replica, so a measurement could not be stored per replica; "
            f"start one (llmgw ctl scale {model} --min 1) and run again"
        )
    profiles = sorted({str(r.get("profile") or "") for r in ready} - {""})
    if profile is not None:
        if profile not in profiles:
            running = ", ".join(profiles) or "no named profile"
            raise CtlError(
                f"no ready replica of {model} runs profile {profile} (they run {running})", 2
            )
        return ReplicaBasis(len(ready), profile)
    if len(profiles) == 1:
        return ReplicaBasis(len(ready), profiles[0])
    if not profiles:
        raise CtlError(f"{model}'s ready replicas name no profile; give it with --profile", 2)
    raise CtlError(
        f"{model}'s ready replicas run profiles {', '.join(profiles)}; "
        "name the one to store the measurement for with --profile",
        2,
    )


def per_replica(capacity: LevelSummary, basis: ReplicaBasis) -> dict[str, Any]:
    """The body of ``PUT /models/{name}/capacity``: the capacity divided among the replicas.

    Concurrency is rounded down (a replica promised more than it took is a
    replica overloaded) but never below 1. The draw, where it was measured, is divided
    as the rate is, so the tokens per watt stored are those measured; unknown, it is left
    out. The share of their default power limit the GPUs were held to is stored where it was
    below 1 (`power_share`, not divided: each replica's GPUs were held to it); at the default
    or unknown it is left out, which says the default (fleet/domain/capped.py).
    """
    body = {
        "profile": basis.profile,
        "max_concurrency": max(capacity.concurrency // basis.ready, 1),
        "tok_per_sec": round(capacity.tok_per_sec / basis.ready, 1),
        "ttft_p95_ms": _tenth(capacity.ttft_p95_ms),
        "tpot_p95_ms": _tenth(capacity.tpot_p95_ms),
    }
    if capacity.watts is not None:
        body["watts"] = round(capacity.watts / basis.ready, 1)
    if capacity.power_share is not None and 0 < (share := round(capacity.power_share, 4)) < 1:
        body["power_share"] = share
    return body


def _tenth(value: float | None) -> float | None:
    return None if value is None else round(value, 1)


__all__ = [
    "Judgement",
    "LevelSample",
    "LevelSummary",
    "ReplicaBasis",
    "RequestResult",
    "Slo",
    "judge",
    "ladder",
    "per_replica",
    "percentile",
    "replica_basis",
    "summarize",
    "verdict",
]
