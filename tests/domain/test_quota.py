"""The quota policy (tenancy/quota.py): what scopes hold, borrow, are guaranteed and limited to.

Ports the seed's quota_test.go and adds the refinements of "Preemption, beyond the seed".
"""

from __future__ import annotations

from datetime import UTC, datetime

from hypothesis import given, strategies as st

from tenancy.quota import Amount, Holding, Policy, Quota, Resources

PARENTS = {
    "team:ml": ("org:acme",),
    "team:web": ("org:acme",),
    "project:train": ("team:ml", "org:acme"),
}


def at(minute: int) -> datetime:
    return datetime(2026, 1, 1, 0, minute, tzinfo=UTC)


def policy(*quotas: Quota) -> Policy:
    """acme has two teams; by default ml is guaranteed 8 GPUs, the org 12 and no more than 16."""
    quotas = quotas or (
        Quota("team:ml", guarantee=Resources(gpus=8)),
        Quota("org:acme", guarantee=Resources(gpus=12), limit=Resources(gpus=16)),
    )
    return Policy.build(quotas, PARENTS)


def held(replica, owner, gpus=0, cores=0, memory=0.0, minute=0, rank=2) -> Holding:
    return Holding(replica, owner, Amount(gpus, cores, memory), at(minute), rank)


def test_a_scope_holds_what_everything_beneath_it_holds():
    u = policy().usage(
        [
            held("a", "project:train", gpus=4),
            held("b", "team:web", gpus=2, cores=3),
            held("c", "", gpus=8),  # shared: nobody's
        ]
    )
    assert u["team:ml"].gpus == 4
    assert u["org:acme"] == Amount(6, 3, 0)
    assert u["project:train"].gpus == 4
    assert "" not in u, "a shared model was counted against somebody"


def test_what_goes_past_a_guarantee_is_borrowed_newest_first():
    b = policy().borrowed(
        [
            held("old", "team:ml", gpus=8, minute=1),
            held("new", "team:ml", gpus=4, minute=2),
            held("web", "team:web", gpus=4, minute=3),
        ]
    )
    # ml: 8 within its 8, then 4 past it. acme holds 16 of its 12: the seed, by age alone,
    # also lends out web's 4; the spec puts the org's overage first on ml's "new", which is
    # already over ml's own guarantee, so web's 4 is within acme's 12.
    assert b == {"new"}
    more = policy().borrowed(
        [
            held("old", "team:ml", gpus=8, minute=1),
            held("web", "team:web", gpus=4, minute=3),
            held("web-2", "team:web", gpus=2, minute=4),
        ]
    )
    assert more == {"web-2"}, "8 + 4 fill acme's 12; web's newest goes past it"


def test_a_guarantee_is_only_for_who_has_one():
    p = policy()
    u = {"team:ml": Amount(gpus=4), "org:acme": Amount(gpus=4)}
    assert p.within_guarantee("project:train", u, Amount(gpus=4)), "8 of 8 and 8 of 12"
    assert not p.within_guarantee("project:train", u, Amount(gpus=5)), "9 is past ml's 8"
    assert not p.within_guarantee("", u, Amount(gpus=1))
    assert not Policy().within_guarantee("team:ml", u, Amount())


def test_a_limit_stops_growth_wherever_it_is_set():
    p = policy()
    u = {"org:acme": Amount(gpus=14)}
    assert p.at_limit("team:web", u, Amount(gpus=2)) == "", "16 of 16 is at the limit, not past"
    assert p.at_limit("team:web", u, Amount(gpus=4)) == (
        "org:acme is at its capacity limit (18 GPUs of 16)"
    )
    assert p.at_limit("", u, Amount(gpus=99)) == "", "a shared model was limited"


def test_a_limit_names_the_scope_as_people_write_it():
    p = Policy.build(
        [Quota("org:1", limit=Resources(memory_gb=10))], {}, names={"org:1": "org:Acme"}
    )
    assert p.at_limit("org:1", {}, Amount(memory_gb=12.5)) == (
        "org:Acme is at its capacity limit (12.5 GB of memory of 10)"
    )


def test_a_zero_limit_is_a_limit_of_nothing_and_a_missing_one_governs_nothing():
    p = Policy.build([Quota("team:web", limit=Resources(gpus=0))], PARENTS)
    assert "1 GPUs of 0" in p.at_limit("team:web", {}, Amount(gpus=1))
    assert p.at_limit("team:web", {}, Amount(cpu_cores=64, memory_gb=512)) == ""


def test_an_owner_with_no_guarantee_anywhere_borrows_all_it_holds():
    p = Policy.build([Quota("team:ml", guarantee=Resources(gpus=8))], PARENTS)
    b = p.borrowed(
        [held("web", "team:web", gpus=1), held("shared", "", gpus=1), held("ml", "team:ml", 4)]
    )
    assert b == {"web", "shared"}


def test_of_a_scope_over_its_guarantee_the_lowest_class_newest_replicas_are_borrowed():
    p = Policy.build([Quota("team:ml", guarantee=Resources(gpus=8))], PARENTS)
    b = p.borrowed(
        [
            held("old-low", "team:ml", gpus=4, minute=1, rank=1),
            held("old-std", "team:ml", gpus=4, minute=2, rank=2),
            held("new-crit", "team:ml", gpus=4, minute=3, rank=3),
        ]
    )
    assert b == {"old-low"}, "the critical and the standard fill the guarantee first"


def test_a_parents_overage_falls_first_on_the_child_over_its_own_guarantee():
    # acme is guaranteed 16; ml and web 8 each. web holds 12 (4 past its own), ml 8, and
    # ml's replicas are the newest: by age alone ml's would be the org's overage.
    p = Policy.build(
        [
            Quota("org:acme", guarantee=Resources(gpus=16)),
            Quota("team:ml", guarantee=Resources(gpus=8)),
            Quota("team:web", guarantee=Resources(gpus=8)),
        ],
        PARENTS,
    )
    b = p.borrowed(
        [
            held("web-1", "team:web", gpus=8, minute=1),
            held("web-2", "team:web", gpus=4, minute=2),
            held("ml-1", "team:ml", gpus=4, minute=3),
            held("ml-2", "team:ml", gpus=4, minute=4),
        ]
    )
    assert b == {"web-2"}


def test_a_team_whose_sibling_overuses_the_parent_is_within_once_the_sibling_gives_back():
    p = Policy.build(
        [
            Quota("org:acme", guarantee=Resources(gpus=16)),
            Quota("team:ml", guarantee=Resources(gpus=8)),
            Quota("team:web", guarantee=Resources(gpus=8)),
        ],
        PARENTS,
    )
    before = {"team:web": Amount(gpus=16), "org:acme": Amount(gpus=16)}
    assert not p.within_guarantee("team:ml", before, Amount(gpus=8))
    after = {"team:web": Amount(gpus=8), "org:acme": Amount(gpus=8)}
    assert p.within_guarantee("team:ml", after, Amount(gpus=8))


def test_taking_a_replica_that_leaves_its_owner_below_a_guarantee_is_said():
    p = policy()
    u = {"team:ml": Amount(gpus=10), "org:acme": Amount(gpus=14)}
    assert not p.drops_below_guarantee("team:ml", u, Amount(gpus=2)), "10 - 2 is still 8"
    assert p.drops_below_guarantee("team:ml", u, Amount(gpus=4))
    assert not p.drops_below_guarantee("team:web", u, Amount(cpu_cores=4)), "cores ungoverned"


holdings = st.lists(
    st.builds(
        held,
        replica=st.uuids().map(str),
        owner=st.sampled_from(["", "team:ml", "team:web", "project:train", "org:acme"]),
        gpus=st.integers(0, 8),
        cores=st.integers(0, 16),
        minute=st.integers(0, 59),
        rank=st.integers(1, 3),
    ),
    max_size=30,
)
quota_sets = st.lists(
    st.builds(
        Quota,
        scope=st.sampled_from(["team:ml", "team:web", "project:train", "org:acme"]),
        guarantee=st.builds(Resources, gpus=st.none() | st.integers(0, 24)),
        limit=st.builds(Resources, gpus=st.none() | st.integers(0, 24)),
    ),
    max_size=4,
)


@given(holdings, quota_sets)
def test_what_is_not_borrowed_fits_within_every_guarantee_on_its_chain(hs, qs):
    p = Policy.build(qs, PARENTS)
    kept = [h for h in hs if h.replica not in p.borrowed(hs)]
    usage = p.usage(kept)
    for q in p.quotas.values():
        if q.guarantee.any():
            assert not q.guarantee.over(usage.get(q.scope, Amount()))
    for h in kept:
        assert p.has_guarantee(h.owner), "what nobody guarantees is all on loan"


@given(holdings, quota_sets)
def test_the_usage_of_a_scope_is_the_sum_of_its_own_and_its_childrens(hs, qs):
    p = Policy.build(qs, PARENTS)
    u = p.usage(hs)
    acme = sum((h.amount for h in hs if h.owner and h.owner != ""), Amount())
    assert u.get("org:acme", Amount()) == acme
