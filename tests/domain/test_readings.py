"""A replica's reading from what its shards' engines said: absent is absent, never 0."""

from __future__ import annotations

import pytest

from fleet.domain.readings import Reading, replica_reading


@pytest.mark.parametrize(
    ("shards", "reading"),
    [
        ([], None),
        ([{}], Reading()),  # it said something, with no figure: each absent
        ([{"running": 2, "waiting": 0}], Reading(running=2, waiting=0)),
        # A llama-server says no KV use and no hit rate: they stay absent, not 0.
        ([{"running": 1, "waiting": 3}], Reading(1, 3, None, None)),
        # Two shards of one replica: requests summed, the fullest KV cache, the first rate.
        (
            [{"running": 1, "kv_cache": 0.2, "prefix_hit_rate": 0.7}, {"running": 2, "kv_cache": 0.9}],
            Reading(running=3, kv_cache=0.9, prefix_hit_rate=0.7),
        ),
        # Figures out of range are not readings.
        ([{"running": -1, "kv_cache": 1.5, "prefix_hit_rate": True}], Reading()),
        (["not an object"], None),
        # An engine's slots: the first shard that says them (one engine's, not a sum); 0 or
        # nonsense is no reading.
        ([{"slots": 8}, {"slots": 4}], Reading(slots=8)),
        ([{"slots": 0}, {"slots": "8"}], Reading()),
        # The adapters its agent fetches, from every shard that says; a total not said is
        # unknown, an entry without a name or a count of bytes done is no reading.
        (
            [
                {"adapters_fetching": [{"name": "a", "done": 5, "total": 10}]},
                {"adapters_fetching": [{"name": "b", "done": 0}, {"name": "c"}, {"done": 1}]},
            ],
            Reading(fetching=(("a", 5, 10), ("b", 0, None))),
        ),
        ([{"adapters_fetching": "a"}], Reading()),
    ],
)  # fmt: skip
def test_a_replicas_reading_from_its_shards(shards, reading):
    assert replica_reading(shards) == reading


def test_queued_counts_what_was_said():
    assert Reading(running=2, waiting=3).queued == 5
    assert Reading(waiting=1).queued == 1
    assert Reading().queued == 0


def test_the_adapters_an_engine_holds_are_read_absent_apart_from_none():
    held = replica_reading([{"adapters": [{"name": "a", "engine_id": 0}, {"name": "b"}]}])
    assert held.adapters == (("a", 0), ("b", None))
    assert held.holds("a") and held.holds("b") and not held.holds("c")
    assert held.engine_id("a") == 0 and held.engine_id("b") is None
    assert replica_reading([{"adapters": []}]).adapters == ()
    unknown = replica_reading([{"running": 1}])
    assert unknown.adapters is None and not unknown.holds("a")
    # What is not an adapter is not read as one.
    assert replica_reading(
        [{"adapters": [{"name": 3}, "x", {"name": "a", "engine_id": True}]}]
    ).adapters == (("a", None),)


def test_how_far_an_adapters_fetch_got_is_read_for_that_adapter_only():
    reading = Reading(fetching=(("a", 5, 10), ("b", 0, None)))
    assert reading.fetched("a") == (5, 10)
    assert reading.fetched("b") == (0, None)
    assert reading.fetched("c") is None
    assert Reading().fetched("a") is None
