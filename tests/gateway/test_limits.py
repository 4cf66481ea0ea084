"""Requests and tokens per minute: the sliding-window rule and the checks up the tree."""

from __future__ import annotations

import asyncio

from hypothesis import given, strategies as st

from llmgw.gateway.limits import (
    Check,
    Limiter,
    LocalCounters,
    Refusal,
    judge,
    refusal_sentence,
    verdict,
)
from llmgw.gateway.tables import Key


def key(rpm=None, tpm=None, scopes=("project:3", "team:2", "org:1")):
    return Key(7, "ci", "llmgw_key_Ab12", 3, scopes, None, rpm, tpm)


def test_a_request_under_the_limit_goes():
    assert verdict(10, previous=0, current=9, elapsed=30) is None


def test_the_request_that_would_pass_the_limit_is_told_to_wait():
    assert verdict(10, previous=0, current=10, elapsed=30) is not None


def test_last_minute_counts_for_the_part_the_window_still_covers():
    # Half of last minute's 10 still in the window, plus 5 now: full; plus 4: one more fits.
    assert verdict(10, previous=10, current=5, elapsed=30) is not None
    assert verdict(10, previous=10, current=4, elapsed=30) is None


def test_the_wait_is_until_enough_of_last_minute_has_slid_out():
    # 10 last minute, 4 now, at 0 s: room for one more once previous * cover <= 5, at 30 s.
    assert verdict(10, previous=10, current=4, elapsed=0) == 30


def test_a_full_current_minute_waits_past_its_end():
    # 10 of 10 this minute at 45 s: the minute ends in 15 s, and then 6 s more must pass
    # before the 10 weigh 9.
    assert verdict(10, previous=0, current=10, elapsed=45) == 21


@given(
    limit=st.integers(1, 1000),
    previous=st.integers(0, 2000),
    current=st.integers(0, 2000),
    elapsed=st.floats(0, 59.999),
)
def test_after_the_wait_given_the_same_request_fits(limit, previous, current, elapsed):
    wait = verdict(limit, previous, current, elapsed)
    if wait is None:
        return
    assert wait >= 1
    later = elapsed + wait
    if later < 60:
        assert verdict(limit, previous, current, later) is None
    elif later < 120:
        # The current minute became the last one; nothing counted since.
        assert verdict(limit, current, 0, later - 60) is None
    else:
        assert verdict(limit, 0, 0, later - 120) is None


@given(limit=st.integers(1, 200), arrivals=st.lists(st.floats(0, 59.99), max_size=400))
def test_no_fixed_minute_admits_more_than_the_limit(limit, arrivals):
    current = 0
    for t in sorted(arrivals):
        if verdict(limit, 0, current, t) is None:
            current += 1
    assert current <= limit


def test_judge_answers_the_longest_wait_among_the_checks_that_fail():
    checks = [Check("key:7:req", 10, 1), Check("team:2:req", 5, 1), Check("org:1:req", 100, 1)]
    refusal = judge(checks, [(0, 1), (0, 5), (0, 0)], elapsed=30)
    assert refusal == Refusal("team:2:req", 5, verdict(5, 0, 5, 30))
    assert judge(checks, [(0, 1), (0, 1), (0, 1)], elapsed=30) is None


def test_checks_cover_the_key_and_every_limited_scope_up_the_tree():
    limits = {"team:2": (600, None), "org:1": (None, 90_000), "org:9": (1, 1)}
    checks, requests, tokens = Limiter.checks(key(rpm=60), limits)
    assert [c.subject for c in checks] == ["key:7:req", "team:2:req", "org:1:tok"]
    assert requests == ["key:7:req", "team:2:req"]
    assert tokens == ["org:1:tok"]


def test_a_key_with_no_limits_anywhere_has_nothing_to_check():
    assert Limiter.checks(key(), {}) == ([], [], [])


async def test_the_limiter_counts_what_it_admits_and_refuses_past_the_limit():
    limiter = Limiter(LocalCounters())
    checks, requests, _ = Limiter.checks(key(rpm=2), {})
    now = 1_000_020.0
    assert await limiter.admit(checks, requests, now) is None
    assert await limiter.admit(checks, requests, now + 1) is None
    refusal = await limiter.admit(checks, requests, now + 2)
    assert refusal is not None and refusal.subject == "key:7:req" and refusal.retry_after >= 1


async def test_tokens_spent_count_against_the_token_limit():
    limiter = Limiter(LocalCounters())
    k = key(tpm=100)
    checks, requests, tokens = Limiter.checks(k, {})
    now = 2_000_000.0
    assert await limiter.admit(checks, requests, now) is None
    limiter.spent(tokens, 100, now)
    refusal = await limiter.admit(checks, requests, now + 1)
    assert refusal is not None and refusal.subject == "key:7:tok"


def test_the_refusal_names_the_scope_by_its_path_and_never_the_secret():
    k = key(rpm=1)
    by_scope = refusal_sentence(Refusal("team:2:req", 600, 7), k, {"team:2": "team:Acme/ml"})
    assert by_scope == (
        "Rate limit reached: team:Acme/ml allows 600 requests per minute; try again in 7 s."
    )
    by_key = refusal_sentence(Refusal("key:7:tok", 1000, 3), k, {})
    assert "this API key (llmgw_key_Ab12…) allows 1000 tokens per minute" in by_key


def test_local_counts_forget_minutes_older_than_the_last():
    counters = LocalCounters()
    counters.add([("key:1:req", 1)], 60.0)
    counters.add([("key:1:req", 1)], 185.0)
    assert asyncio.run(counters.read(["key:1:req"], 185.0)) == [(0, 1)]
    assert len(counters._counts) == 1


def test_a_limit_of_nothing_never_fits_and_never_divides_by_zero():
    assert verdict(0, previous=0, current=0, elapsed=10) == 120
