"""How loaded a replica is for the next request, by this gateway's in-flight count and what
its engine says (issue 36): table tests of the rule and properties of it."""

from __future__ import annotations

import pytest
from hypothesis import given, strategies as st

from fleet.domain.readings import Reading
from llmgw.gateway.prefixes import choose
from llmgw.gateway.scoring import KV_FULL, reading_words, replica_load


def pressed(reading: Reading | None) -> bool:
    """Whether an engine said it queues requests or its KV cache is nearly full."""
    return reading is not None and (
        bool(reading.waiting) or (reading.kv_cache is not None and reading.kv_cache >= KV_FULL)
    )


@pytest.mark.parametrize(
    ("inflight", "weight", "reading", "load"),
    [
        # No reading: the in-flight count and this request, per unit of weight, as before.
        (0, 1, None, 1.0),
        (3, 2, None, 2.0),
        # The engine runs more than this gateway sent it: the others' count.
        (1, 1, Reading(running=4, waiting=0), 5.0),
        # It runs fewer than this gateway has in flight (the reading is older): ours.
        (6, 1, Reading(running=4, waiting=0), 7.0),
        # Each request queued counts once more.
        (0, 1, Reading(running=4, waiting=3), 4 + 3 + 1 + 3),
        # A KV cache nearly full doubles the lot; below the line it is not looked at.
        (0, 1, Reading(running=4, waiting=0, kv_cache=KV_FULL), 10.0),
        (0, 1, Reading(running=4, waiting=0, kv_cache=0.89), 5.0),
        # A reading with no figures (a llama-server says no KV use) changes nothing.
        (2, 1, Reading(), 3.0),
        (2, 2, Reading(running=1, waiting=1), 2.0),
    ],
)  # fmt: skip
def test_replica_load(inflight, weight, reading, load):
    assert replica_load(inflight, weight, reading) == load


def test_a_replica_whose_engine_queues_is_not_least_loaded_for_few_in_flight_here():
    # This gateway has nothing in flight to the first; another gateway filled its queue.
    loads = [
        replica_load(0, 1, Reading(running=8, waiting=5)),
        replica_load(3, 1, Reading(running=3, waiting=0)),
        replica_load(2, 1, Reading(running=6, waiting=0, kv_cache=0.97)),
    ]
    assert choose(loads, [], imbalance=4).index == 1


def test_a_prefix_holder_whose_engine_queues_gives_way():
    loads = [replica_load(0, 1, Reading(running=4, waiting=4)), replica_load(0, 1, None)]
    choice = choose(loads, [0, 1], imbalance=4)
    assert (choice.index, choice.how) == (1, "imbalance")
    # A short queue on the holder is worth its cache: it keeps the prompt.
    loads = [replica_load(0, 1, Reading(running=1, waiting=1)), replica_load(0, 1, None)]
    assert choose(loads, [0, 1], imbalance=4).how == "prefix"


def test_what_an_engine_said_in_words():
    assert reading_words(None) == ""
    assert reading_words(Reading()) == ""
    assert reading_words(Reading(4, 2, 0.934)) == "its engine runs 4, queues 2, KV 93% full"
    assert reading_words(Reading(running=1, waiting=0)) == "its engine runs 1, queues 0"
    assert pressed(Reading(waiting=1)) and pressed(Reading(kv_cache=0.95))
    assert not pressed(Reading(running=9, waiting=0, kv_cache=0.5)) and not pressed(None)


counts = st.integers(min_value=0, max_value=500)
shares = st.none() | st.floats(min_value=0, max_value=1)
readings = st.none() | st.builds(
    Reading, running=st.none() | counts, waiting=st.none() | counts, kv_cache=shares
)


@given(inflight=counts, weight=st.integers(1, 8), reading=readings, more=st.integers(1, 50))
def test_more_said_of_an_engine_never_makes_it_less_loaded(inflight, weight, reading, more):
    base = reading or Reading()
    load = replica_load(inflight, weight, reading)
    assert replica_load(inflight + more, weight, reading) >= load
    for busier in (
        Reading(base.running + more if base.running else more, base.waiting, base.kv_cache),
        Reading(base.running, (base.waiting or 0) + more, base.kv_cache),
        Reading(base.running, base.waiting, KV_FULL),
    ):
        if busier.kv_cache is not None and base.kv_cache is not None:
            busier = Reading(busier.running, busier.waiting, max(busier.kv_cache, base.kv_cache))
        assert replica_load(inflight, weight, busier) >= load


@given(inflight=counts, weight=st.integers(1, 8))
def test_no_reading_is_routing_by_the_in_flight_count(inflight, weight):
    assert replica_load(inflight, weight, None) == (inflight + 1) / weight
    assert replica_load(inflight, weight, Reading()) == (inflight + 1) / weight


@given(
    queued_inflight=counts,
    queued=readings.filter(pressed),
    calm_inflight=counts,
    calm_running=st.none() | counts,
    calm_kv=st.none() | st.floats(min_value=0, max_value=KV_FULL, exclude_max=True),
)
def test_an_engine_that_queues_or_is_full_loses_to_one_no_busier_that_does_not(
    queued_inflight, queued, calm_inflight, calm_running, calm_kv
):
    calm = Reading(running=calm_running, waiting=0, kv_cache=calm_kv)
    held = max(queued_inflight, queued.queued)
    if max(calm_inflight, calm.queued) > held:
        return  # the calm one holds more: either may win
    assert replica_load(calm_inflight, 1, calm) < replica_load(queued_inflight, 1, queued)


def test_the_trace_says_what_the_engine_said_of_the_replica_chosen():
    from llmgw.gateway.routing import routing_why
    from llmgw.gateway.state import Picked
    from llmgw.gateway.tables import Upstream

    up = Upstream("r1", "llama", "http://x", "Bearer k", 1)
    said = Picked(up, "least_loaded", inflight=1, reading=Reading(3, 0, 0.5))
    assert routing_why(said, 3) == (
        "least loaded (1 in flight, of 3 ready; its engine runs 3, queues 0, KV 50% full)"
    )
    assert routing_why(Picked(up, "least_loaded", inflight=1), 3) == (
        "fewest requests in flight (1) of 3 ready"
    )
    assert routing_why(Picked(up, "prefix", 5, 9, inflight=2), 3) == (
        "first in the order of this prompt's prefix (5 of its 9 leading blocks) "
        "(2 in flight, of 3 ready)"
    )
    assert routing_why(Picked(up, "imbalance", 5, 9, inflight=0, place=1), 3) == (
        "number 2 in the order of this prompt's prefix (0 in flight, of 3 ready): "
        "those before it were busier than the bound allows"
    )


def test_our_own_requests_the_engine_counted_are_not_counted_twice():
    # The engine ran 6 when read, 4 of them ours; we have 1 in flight now: 1 + the others' 2.
    assert replica_load(1, 1, Reading(running=6, waiting=0), ours_then=4) == 4.0
    # More of ours since the reading: counted from our own count, now.
    assert replica_load(7, 1, Reading(running=6, waiting=0), ours_then=4) == 10.0
    # The engine finished some of ours before it was read: the others' are never below 0.
    assert replica_load(3, 1, Reading(running=1, waiting=0), ours_then=4) == 4.0


@given(inflight=counts, then=counts, reading=readings, more=st.integers(1, 50))
def test_with_our_count_then_more_others_never_make_it_less_loaded(inflight, then, reading, more):
    base = reading or Reading()
    busier = Reading((base.running or 0) + more, base.waiting, base.kv_cache)
    assert replica_load(inflight, 1, busier, then) >= replica_load(inflight, 1, reading, then)


def test_the_kv_cache_share_counted_as_full_is_a_setting():
    nearly = Reading(running=4, waiting=0, kv_cache=0.92)
    assert replica_load(0, 1, nearly, kv_full=0.9) == 10.0
    assert replica_load(0, 1, nearly, kv_full=0.95) == 5.0
