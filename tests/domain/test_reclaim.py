"""Which cached weights a node lets go of (pure)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from hypothesis import given, strategies as st

from mirror.domain.reclaim import Cached, reclaim

NOW = datetime(2026, 12, 1, tzinfo=UTC)
WEEK = timedelta(days=7)
GB = 10**9


def c(name: str, size_gb: float = 1, days_ago: float | None = 1) -> Cached:
    used = None if days_ago is None else NOW - timedelta(days=days_ago)
    return Cached(name * 64, int(size_gb * GB), used)


def names(out):
    return [r.sha256[0] for r in out]


def test_what_was_unused_past_the_keep_period_goes_and_what_is_in_use_stays():
    held = [c("a", days_ago=10), c("b", days_ago=2), c("u", days_ago=30)]

    out = reclaim(
        held, in_use={"u" * 64}, now=NOW, keep=WEEK, free_bytes=500 * GB, floor_bytes=10 * GB
    )

    assert names(out) == ["a"]
    assert out[0].why == "unused for 10 days (kept 7)"


def test_under_the_disk_floor_the_least_recently_used_go_until_it_is_not():
    held = [c("a", 4, days_ago=3), c("b", 4, days_ago=1), c("n", 4, days_ago=None), c("u", 50, 40)]

    out = reclaim(
        held, in_use={"u" * 64}, now=NOW, keep=WEEK, free_bytes=3 * GB, floor_bytes=10 * GB
    )

    # Not known when used first, then the oldest: 3 + 4 + 4 = 11 GB ≥ 10.
    assert names(out) == ["n", "a"]
    assert out[0].why == "the node has 3.0 GB free, under the floor of 10 GB"


def test_a_node_that_does_not_say_its_free_disk_loses_only_what_is_old():
    out = reclaim(
        [c("a", days_ago=3)], in_use=set(), now=NOW, keep=WEEK, free_bytes=None, floor_bytes=10 * GB
    )
    assert out == []


@given(
    st.lists(
        st.tuples(st.sampled_from("abcdefgh"), st.floats(0, 100), st.none() | st.floats(0, 60)),
        max_size=8,
        unique_by=lambda t: t[0],
    ),
    st.sets(st.sampled_from("abcdefgh")),
    st.none() | st.integers(0, 200),
)
def test_nothing_in_use_is_ever_reclaimed_and_nothing_twice(files, used, free_gb):
    held = [c(n, size, days) for n, size, days in files]
    in_use = {u * 64 for u in used}

    out = reclaim(
        held,
        in_use=in_use,
        now=NOW,
        keep=WEEK,
        free_bytes=None if free_gb is None else free_gb * GB,
        floor_bytes=50 * GB,
    )

    gone = [r.sha256 for r in out]
    assert not set(gone) & in_use
    assert len(gone) == len(set(gone))
