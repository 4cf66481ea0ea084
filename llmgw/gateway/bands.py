"""Priority bands under overload (issue 39, item 6; the seed's "admission displacement").

Every key has a band (its own, or else its project's): `low`, `normal` or `high`. While a
model's replicas keep up, the bands change nothing. When its waiting work passes a bound,
the requests of the lowest band present are refused (429 `model_overloaded`, with a
Retry-After) before they reach an engine, so the queue the higher bands wait in stays
short; past twice the bound the next band up too, and so on, but never the highest band
present: what is left of the overload it waits out, as every request did before.

Waiting work is what the engines say they queue where they say it (corrected by what this
gateway sent or saw end since they said it), and otherwise what this gateway has in
flight to the replica. The bounds are per replica, times its weight. "Present" is a band
this gateway let in for the model within the last PRESENT_S seconds: a band that stopped
asking displaces nobody. Pure: no clock, no I/O; `requests._displaced` calls it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from fleet.domain.readings import Reading
from tenancy.bands import BANDS, DEFAULT

# Requests an engine may queue per unit of its replica's weight before its model counts
# as overloaded; with no engine reading, requests in flight to the replica instead.
WAITING_BOUND = 1
INFLIGHT_BOUND = 16
PRESENT_S = 10.0
RETRY_AFTER_S = 2  # about when the engines' next readings come in


def rank(band: str) -> int:
    """Its place in BANDS, lowest 0; a band not known counts as the default."""
    return BANDS.index(band) if band in BANDS else BANDS.index(DEFAULT)


def refused_bands(present: Iterable[str], work: int, bound: int) -> frozenset[str]:
    """The bands refused now: none while `work` is under `bound`; past it the lowest band
    present, and one more for each further `bound` passed, never the highest present."""
    if bound <= 0 or work < bound:
        return frozenset()
    ordered = sorted(set(present), key=rank)
    return frozenset(ordered[: min(work // bound, len(ordered) - 1)])


def refused(band: str, present: Iterable[str], work: int, bound: int) -> bool:
    """Whether a request of `band` is refused, its own band counting as present."""
    return band in refused_bands({*present, band}, work, bound)


def model_work(
    replicas: Iterable[tuple[str, int]],
    inflight: Mapping[str, int],
    readings: Mapping[str, Reading],
    ours_then: Mapping[str, int],
) -> tuple[int, int]:
    """A model's waiting work and the bound it is held to, summed over its replicas
    (`replicas`: id and weight): the queue its engine said it had plus what this gateway
    has in flight to it beyond what it had then, against WAITING_BOUND; for a replica whose
    engine said nothing of its queue, this gateway's in flight to it, against
    INFLIGHT_BOUND."""
    work = bound = 0
    for replica, weight in replicas:
        now = inflight.get(replica, 0)
        reading = readings.get(replica)
        if reading is not None and reading.waiting is not None:
            work += max(reading.waiting + now - ours_then.get(replica, 0), 0)
            bound += WAITING_BOUND * max(weight, 1)
        else:
            work += now
            bound += INFLIGHT_BOUND * max(weight, 1)
    return work, bound
