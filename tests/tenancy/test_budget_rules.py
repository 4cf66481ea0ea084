"""tenancy/budgets.py: windows, spend rolled up the tree, and the verdict's sentences."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from decimal import Decimal

from hypothesis import given, strategies as st

from tenancy.budgets import (
    Book,
    Budget,
    Price,
    Spent,
    Used,
    spent_by_scope,
    unpriced,
    window,
)

NOW = datetime(2026, 12, 7, 15, 30, tzinfo=UTC)
CHAIN = ("key:3", "project:12", "team:7", "org:9")
NAMES = {"team:7": "team:Acme/ml", "org:9": "org:Acme", "key:3": "key:ci (llmgw_key_ab…)"}
moments = st.datetimes(
    min_value=datetime(2000, 1, 1), max_value=datetime(2100, 1, 1), timezones=st.just(UTC)
)


@given(moments, st.sampled_from(["day", "month"]))
def test_a_window_holds_its_moment_and_ends_where_the_next_begins(now, period):
    start, end = window(period, now)

    assert start <= now < end
    assert window(period, end)[0] == end
    assert window(period, end - timedelta(microseconds=1)) == (start, end)
    assert start.hour == start.minute == 0 and (period == "day" or start.day == 1)


def test_december_ends_at_the_new_year():
    assert window("month", NOW) == (
        datetime(2026, 12, 1, tzinfo=UTC),
        datetime(2027, 1, 1, tzinfo=UTC),
    )
    assert window("day", NOW)[1] == datetime(2026, 12, 8, tzinfo=UTC)


def book(*budgets: Budget, spent=None, read_at=NOW) -> Book:
    by: dict = {}
    for b in budgets:
        by[b.scope] = (*by.get(b.scope, ()), b)
    return Book(budgets=by, spent=spent or {}, names=NAMES, read_at=read_at)


def test_a_budget_spent_whole_refuses_naming_it_the_spend_and_the_reset():
    b = Budget("team:7", "month", "tokens", Decimal(1_000_000))
    verdict = book(b, spent={("team:7", "month"): Spent(1_002_311)}).verdict(CHAIN, NOW)

    assert not verdict.allowed
    assert verdict.refusal == (
        "team:Acme/ml has spent 1,002,311 of its 1,000,000 tokens for December; "
        "it resets at 2027-01-01 00:00 UTC"
    )
    assert verdict.budget == b
    assert verdict.retry_after(NOW) == int((datetime(2027, 1, 1, tzinfo=UTC) - NOW).total_seconds())


def test_exactly_the_budget_refuses_and_just_under_warns():
    b = Budget("org:9", "day", "cost", Decimal("100"))

    assert not book(b, spent={("org:9", "day"): Spent(0, Decimal(100))}).verdict(CHAIN, NOW).allowed
    verdict = book(b, spent={("org:9", "day"): Spent(0, Decimal("99.99"))}).verdict(CHAIN, NOW)
    assert verdict.allowed
    assert verdict.warnings == (
        "org:Acme has spent 99 % of its 100.00 in cost for 7 December (99.99); "
        "it resets at 2026-12-08 00:00 UTC",
    )


def test_below_eighty_percent_says_nothing_and_at_it_warns():
    b = Budget("key:3", "day", "tokens", Decimal(1000))

    assert book(b, spent={("key:3", "day"): Spent(799)}).verdict(CHAIN, NOW).warnings == ()
    assert book(b, spent={("key:3", "day"): Spent(800)}).verdict(CHAIN, NOW).warnings == (
        "key:ci (llmgw_key_ab…) has spent 80 % of its 1,000 tokens for 7 December (800); "
        "it resets at 2026-12-08 00:00 UTC",
    )


def test_of_several_spent_budgets_the_one_that_resets_last_refuses():
    day = Budget("key:3", "day", "tokens", Decimal(10))
    month = Budget("org:9", "month", "tokens", Decimal(10))
    spent = {("key:3", "day"): Spent(20), ("org:9", "month"): Spent(20)}

    assert book(day, month, spent=spent).verdict(CHAIN, NOW).budget == month


def test_budgets_off_the_chain_do_not_count():
    b = Budget("team:8", "day", "tokens", Decimal(1))
    assert book(b, spent={("team:8", "day"): Spent(5)}).verdict(CHAIN, NOW).allowed


def test_a_window_that_turned_since_the_book_was_read_starts_from_nothing():
    b = Budget("team:7", "day", "tokens", Decimal(10))
    stale = book(b, spent={("team:7", "day"): Spent(50)}, read_at=NOW - timedelta(days=1))

    assert stale.verdict(CHAIN, NOW).allowed
    assert not stale.verdict(CHAIN, NOW - timedelta(days=1)).allowed


def test_spend_counts_for_the_key_and_every_scope_above_its_project_with_prices():
    used = [
        Used("month", 3, 12, "llama", 1_000_000, 500_000),
        Used("month", 4, 12, "qwen", 10, 10),
        Used("day", 3, 12, "llama", 100, 0),
    ]
    chains = {12: ("project:12", "team:7", "org:9")}
    prices = {"llama": Price(Decimal("0.5"), Decimal("2"))}

    spent = spent_by_scope(used, chains, prices)

    assert spent[("key:3", "month")] == Spent(1_500_000, Decimal("1.5"))
    assert spent[("key:4", "month")] == Spent(20, Decimal(0))
    assert spent[("org:9", "month")] == Spent(1_500_020, Decimal("1.5"))
    assert spent[("team:7", "day")] == Spent(100, Decimal("0.00005"))
    assert unpriced(used, prices) == ["qwen"]


usages = st.lists(
    st.builds(
        Used,
        st.sampled_from(["day", "month"]),
        st.integers(1, 4),
        st.integers(1, 3),
        st.sampled_from(["a", "b"]),
        st.integers(0, 10**9),
        st.integers(0, 10**9),
    ),
    max_size=20,
)


@given(usages)
def test_an_org_spends_what_its_projects_spend_and_a_project_what_its_keys_do(used):
    chains = {p: (f"project:{p}", f"team:{p % 2}", "org:1") for p in (1, 2, 3)}
    spent = spent_by_scope(used, chains, {"a": Price(Decimal(1), Decimal(3))})

    for period in ("day", "month"):
        total = sum((u.prompt + u.completion for u in used if u.period == period), 0)
        assert spent.get(("org:1", period), Spent()).tokens == total
        projects = sum(spent.get((f"project:{p}", period), Spent()).tokens for p in (1, 2, 3))
        keys = sum(spent.get((f"key:{k}", period), Spent()).tokens for k in (1, 2, 3, 4))
        assert projects == keys == total


@given(st.integers(1, 10**12), st.integers(0, 2 * 10**12))
def test_a_budget_refuses_exactly_when_spent_whole_and_warns_only_past_four_fifths(amount, spent):
    b = Budget("team:7", "month", "tokens", Decimal(amount))
    verdict = book(b, spent={("team:7", "month"): Spent(spent)}).verdict(CHAIN, NOW)

    assert verdict.allowed == (spent < amount)
    assert bool(verdict.warnings) == (amount * 4 <= spent * 5 and spent < amount)
