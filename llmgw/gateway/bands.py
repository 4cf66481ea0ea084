"""Priority bands under overload (issue 39, item 6; the seed's "admission displacement").

Every key has a band (its own, or else its project's): `low`, `normal` or `high`. While a
model's replicas keep up, the bands change nothing. When its load passes a bound,
the requests of the lowest band present are refused (429 `model_overloaded`, with a
Retry-After) before they reach an engine, so the queue the higher bands wait in stays
short; past twice the bound the next band up too, and so on, but never the highest band
present: what is left of the overload it waits out, as every request did before.

A model's load is judged per replica and summed. Where its engine's slots are known (as
its agent read them from the engine's command, or else what it ran while requests
waited: `slots_learnt`), its load is the requests it holds, running or waiting (as it
last said, corrected by what this gateway sent or saw end since); the lowest band
present is refused once they fill all but RESERVE_SHARE of its slots, so a request of a
higher band finds one free, and one band more for each further reserve. Where the engine
says its queue but its slots are not known, its load is that queue, against
WAITING_BOUND; with no reading, this gateway's requests in flight to it, against
INFLIGHT_BOUND (both times the replica's weight, one band more at each multiple).
"Present" is a band this gateway let in for the model within the last PRESENT_S seconds:
a band that stopped asking displaces nobody. Pure: no clock, no I/O; `requests._displaced` calls it.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import NamedTuple

from fleet.domain.readings import Reading
from tenancy.bands import BANDS, DEFAULT

# Requests an engine may queue per unit of its replica's weight before its model counts
# as overloaded; with no engine reading, requests in flight to the replica instead.
WAITING_BOUND = 1
INFLIGHT_BOUND = 16
# The share of a replica's slots kept for the bands above the lowest present, at least one.
RESERVE_SHARE = 0.25
PRESENT_S = 10.0
RETRY_AFTER_S = 2  # about when the engines' next readings come in


def rank(band: str) -> int:
    """Its place in BANDS, lowest 0; a band not known counts as the default."""
    return BANDS.index(band) if band in BANDS else BANDS.index(DEFAULT)


class Pressure(NamedTuple):
    """A model's load against its bound: at `bound` the lowest band present is refused,
    and one band more each `step` further."""

    work: int
    bound: int
    step: int


def refused_bands(
    present: Iterable[str], work: int, bound: int, step: int | None = None
) -> frozenset[str]:
    """The bands refused now: none while `work` is under `bound`; past it the lowest band
    present, and one more for each further `step` (`bound` unless given), never the
    highest present."""
    if bound <= 0 or work < bound:
        return frozenset()
    step = step if step is not None and step > 0 else bound
    ordered = sorted(set(present), key=rank)
    return frozenset(ordered[: min(1 + (work - bound) // step, len(ordered) - 1)])


def refused(band: str, present: Iterable[str], pressure: Pressure) -> bool:
    """Whether a request of `band` is refused, its own band counting as present."""
    return band in refused_bands({*present, band}, *pressure)


def slots_learnt(known: Mapping[str, int], readings: Mapping[str, Reading]) -> dict[str, int]:
    """Each read replica's slots: what its agent read from the engine's command where it
    says them; else the most it ran while requests waited (then it runs all it can), kept
    from `known` until a greater figure comes. A replica not read is dropped."""
    out = {}
    for replica, reading in readings.items():
        if reading.slots:
            out[replica] = reading.slots
            continue
        slots = known.get(replica, 0)
        if reading.waiting and reading.running:
            slots = max(slots, reading.running)
        if slots:
            out[replica] = slots
    return out


def reserve(slots: int) -> int:
    """The slots of a replica kept for the bands above the lowest present: RESERVE_SHARE,
    at least one, never all (an engine of one slot keeps none: it would starve the
    lowest band while any other is present)."""
    return min(max(1, math.ceil(slots * RESERVE_SHARE)), slots - 1)


def model_work(
    replicas: Iterable[tuple[str, int]],
    inflight: Mapping[str, int],
    readings: Mapping[str, Reading],
    ours_then: Mapping[str, int],
    slots: Mapping[str, int] | None = None,
) -> Pressure:
    """A model's load and its bound, summed over its replicas (`replicas`: id and weight):
    for a replica whose `slots` are known, the requests its engine said it held plus what
    this gateway has in flight to it beyond what it had then, bound at its slots less a
    reserve; for one whose engine said only its queue, that queue so corrected, against
    WAITING_BOUND; for one whose engine said nothing, this gateway's in flight to it,
    against INFLIGHT_BOUND."""
    slots = slots or {}
    work = bound = step = 0
    for replica, weight in replicas:
        now = inflight.get(replica, 0)
        reading = readings.get(replica)
        since = now - ours_then.get(replica, 0)
        known = slots.get(replica, 0)
        if reading is not None and known and reading.running is not None:
            kept = reserve(known)
            work += max(reading.queued + since, 0)
            bound, step = bound + known - kept, step + kept
        elif reading is not None and reading.waiting is not None:
            work += max(reading.waiting + since, 0)
            bound += WAITING_BOUND * max(weight, 1)
            step += WAITING_BOUND * max(weight, 1)
        else:
            work += now
            bound += INFLIGHT_BOUND * max(weight, 1)
            step += INFLIGHT_BOUND * max(weight, 1)
    return Pressure(work, bound, step)
