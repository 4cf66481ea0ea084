"""Shedding load off a hot domain (docs/facility.md, "Shedding"): when a domain is due, the
order replicas go in, one move per domain per interval, a critical minimum never touched,
make-before-break through a real pass, and observe-only saying and doing nothing."""

from __future__ import annotations

from dataclasses import replace
from types import SimpleNamespace

import pytest
from hypothesis import given, settings, strategies as st

from fleet.domain.conditions import Facility, State
from fleet.domain.power import RACK_LABEL
from fleet.domain.shedding import REASON, candidates, due, in_flight, plan_shed, power_caps
from llmgw.core.config import Shedding

from .builders import NOW, gpu_node, gpu_profile, model, replica, run, snapshot

R1, R2 = ("rack", "r1"), ("rack", "r2")
ON = Shedding(True, delay=600, interval=300)


def hot(since: float, *, cooling: bool = False) -> State:
    """Hot since `since`; its readings still say hot unless `cooling`."""
    above = (since, None if cooling else since)
    return State("hot", since, "inlet 34 °C", above, (None, None))


def fac(states, *, now=1000.0, shed=ON, shed_at=None, enforce=True) -> Facility:
    return Facility(states, (), enforce, now, shed, shed_at or {})


@pytest.mark.parametrize(
    ("facility", "expected"),
    [
        (fac({R1: hot(0)}), True),  # hot for 1000 s, delay 600
        (fac({R1: hot(500)}), False),  # hot for 500 s only
        (fac({R1: hot(400)}), True),  # exactly at the delay
        (fac({R1: hot(0, cooling=True)}), False),  # readings back under hot
        (fac({R1: hot(0)}, shed=Shedding()), False),  # shedding off
        (fac({R1: hot(0)}, shed=Shedding(False, frozenset({R2}))), False),  # not opted in
        (fac({R1: hot(0)}, shed=Shedding(False, frozenset({R1}))), True),  # opted in
        (fac({R1: hot(0)}, shed_at={R1: 800}), False),  # last move 200 s ago, interval 300
        (fac({R1: hot(0)}, shed_at={R1: 700}), True),  # an interval ago
        (fac({R1: State("warm", 0, "inlet 29 °C", (0, None))}), False),  # warm sheds nothing
        (fac({}), False),  # unknown: no data never moves anything
    ],
)
def test_a_domain_is_due_to_shed(facility, expected):
    assert due(facility, R1) is expected


def entry(rid: str, cls: str, above: bool, min_: int = 1):
    return (
        replica(rid, rid.split("-")[0], on="a1"),
        model(rid.split("-")[0], capacity_class=cls, min=min_),
        above,
    )


def test_the_lowest_class_goes_first_then_above_the_minimum_and_never_a_critical_minimum():
    found = candidates(
        [
            entry("crit-1", "critical", False),
            entry("crit-2", "critical", True),
            entry("std-1", "standard", False),
            entry("std-2", "standard", True),
            entry("opp-1", "opportunistic", False),
            entry("opp-2", "opportunistic", True),
        ]
    )
    assert [c.replica.id for c in found] == ["opp-2", "opp-1", "std-2", "std-1", "crit-2"]


def test_a_replica_already_being_shed_holds_its_domains_moves():
    leaving = replica("chat-1", "chat", on="a1", retiring=True, reason=f"{REASON}rack r1: …")
    drained = replica("chat-2", "chat", on="b1", retiring=True, reason="node b1 drains")
    nodes = {"a1": (R1, ("pdu", "p1")), "b1": (R2,)}
    assert in_flight([leaving, drained], nodes) == {R1, ("pdu", "p1")}


def to(node: str):
    return SimpleNamespace(shards=(SimpleNamespace(node_id=node),))


def test_no_room_elsewhere_moves_nothing_and_says_so():
    standing = {"a1": [entry("chat-1", "standard", True)]}
    moves, why = plan_shed(fac({R1: hot(0)}), {"a1": (R1,)}, standing, set(), lambda c, a: None)
    assert moves == []
    assert why == [(R1, "rack r1 is hot and no replica on it has room elsewhere")]


def test_a_move_says_what_where_and_why():
    standing = {"a1": [entry("chat-1", "standard", True)]}
    moves, _ = plan_shed(
        fac({R1: hot(580)}, shed=Shedding(True, delay=60)),
        {"a1": (R1,), "b1": (R2,)},
        standing,
        set(),
        lambda c, a: to("b1"),
    )
    (move,) = moves
    assert move.said == "shed chat-1 of chat off rack r1 to b1: hot for 7 min (inlet 34 °C)"


def test_the_replacement_avoids_every_hot_domain():
    avoided = []

    def place(c, avoid):
        avoided.append(avoid)
        return to("c1")

    nodes = {"a1": (R1,), "b1": (R2,), "c1": (("rack", "r3"),)}
    standing = {"a1": [entry("chat-1", "standard", True)]}
    plan_shed(fac({R1: hot(0), R2: hot(900)}), nodes, standing, set(), place)
    assert avoided == [frozenset({"a1", "b1"})]


KINDS = st.sampled_from(["critical", "standard", "opportunistic"])


@settings(max_examples=200, deadline=None)
@given(
    replicas=st.lists(
        st.tuples(
            st.sets(st.sampled_from(["a1", "a2", "b1"]), min_size=1, max_size=2),
            KINDS,
            st.booleans(),
        ),
        max_size=12,
    ),
    racks=st.fixed_dictionaries(
        {
            "a1": st.sampled_from(["r1", "r2"]),
            "a2": st.sampled_from(["r1", "r2"]),
            "b1": st.sampled_from(["r1", "r2"]),
        }
    ),
    pdu_shared=st.booleans(),
    hot_pdu=st.booleans(),
    busy=st.sets(st.sampled_from([R1, R2, ("pdu", "p1")])),
    room=st.booleans(),
)
def test_never_two_moves_in_one_domain_nor_a_critical_minimum(
    replicas, racks, pdu_shared, hot_pdu, busy, room
):
    nodes = {
        n: ((("rack", r),) + ((("pdu", "p1"),) if pdu_shared or n == "a1" else ()))
        for n, r in racks.items()
    }
    states = {R1: hot(0), R2: hot(0)}
    if hot_pdu:
        states[("pdu", "p1")] = hot(0)
    standing: dict = {}
    for i, (on, cls, above) in enumerate(replicas):
        # A replica over several nodes is listed under each, as the context lists it.
        m = model(f"m{i}", capacity_class=cls)
        r = replica(f"m{i}-1", m.name, on=sorted(on))
        for node in on:
            standing.setdefault(node, []).append((r, m, above))
    hot_nodes = {n for n, ds in nodes.items() if any(d in states for d in ds)}
    avoided: list = []

    def place(c, avoid):
        avoided.append(avoid)
        return to("z9") if room else None

    moves, _ = plan_shed(fac(states), nodes, standing, set(busy), place)

    per_domain: dict = {}
    for m in moves:
        assert not (m.candidate.model.effective_class == "critical" and not m.candidate.above_min)
        # Every domain any of its nodes is in counts the move.
        mine = {d for n in m.candidate.replica.nodes for d in nodes[n]}
        assert set(m.domains) == mine
        for d in m.domains:
            assert d not in busy  # a move in flight holds its domain
            per_domain[d] = per_domain.get(d, 0) + 1
    assert all(n == 1 for n in per_domain.values()), per_domain
    assert all(hot_nodes <= a for a in avoided)  # the replacement never goes to a hot node
    assert room or not moves


def racked(node_id: str, rack: str):
    return gpu_node(node_id, gpus=2, labels={RACK_LABEL: rack})


def test_a_pass_starts_the_replacement_elsewhere_and_retires_the_shed_replica():
    chat, batch = model("chat", min=1), model("batch", min=1, capacity_class="opportunistic")
    snap = snapshot(
        [racked("a1", "r1"), racked("b1", "r2")],
        [chat, batch],
        [
            replica("chat-a", "chat", on="a1", gpus=(0,)),
            replica("batch-a", "batch", on="a1", gpus=(1,)),
        ],
    )
    at = NOW.timestamp()
    snap = replace(snap, facility=fac({R1: hot(at - 700)}, now=at))

    plan = run(snap)

    assert [(s.model, [sh.node_id for _, sh in s.shards]) for s in plan.starts] == [
        ("batch", ["b1"])
    ]
    assert [(r.replica_id, r.reason.split(":")[0]) for r in plan.retires] == [
        ("batch-a", "shed batch-a of batch off rack r1 to b1")
    ]
    assert "shed batch-a of batch off rack r1 to b1: hot for 12 min (inlet 34 °C)" in plan.events


def test_two_domains_shedding_in_one_pass_never_take_the_same_room():
    # r1 and r2 hot; the one free GPU outside them (c1's) takes one replacement, not two.
    batch = model("batch", min=2, capacity_class="opportunistic")
    snap = snapshot(
        [racked("a1", "r1"), racked("b1", "r2"), gpu_node("c1", gpus=1, labels={RACK_LABEL: "r3"})],
        [batch],
        [
            replica("batch-a", "batch", on="a1", gpus=(0,)),
            replica("batch-b", "batch", on="b1", gpus=(0,)),
        ],
    )
    at = NOW.timestamp()
    snap = replace(snap, facility=fac({R1: hot(at - 700), R2: hot(at - 700)}, now=at))

    plan = run(snap)

    assert [[sh.node_id for _, sh in s.shards] for s in plan.starts] == [["c1"]]
    assert len(plan.retires) == 1
    assert "rack r2 is hot and no replica on it has room elsewhere" in plan.events


def test_a_replica_over_several_nodes_is_shed_when_one_of_them_is_hot():
    # wide-1 spans a1 (hot r1) and b1 (r2, not hot): it is shed, and the move counts for
    # both racks, so r2 sees no other move this interval.
    wide = model("wide", min=2)
    standing_entry = (replica("wide-1", "wide", on=["a1", "b1"]), wide, True)
    standing = {"a1": [standing_entry], "b1": [standing_entry]}
    avoided = []

    def place(c, avoid):
        avoided.append(avoid)
        return SimpleNamespace(
            shards=(SimpleNamespace(node_id="c1"), SimpleNamespace(node_id="c2"))
        )

    nodes = {"a1": (R1,), "b1": (R2,), "c1": (("rack", "r3"),), "c2": (("rack", "r3"),)}
    moves, why = plan_shed(fac({R1: hot(0)}), nodes, standing, set(), place)

    (move,) = moves
    assert move.candidate.replica.id == "wide-1"
    assert move.domains == (R1, R2)
    assert move.said == "shed wide-1 of wide off rack r1 to c1, c2: hot for 17 min (inlet 34 °C)"
    assert avoided == [frozenset({"a1"})] and why == []


def test_a_critical_minimum_over_several_nodes_is_never_shed():
    crit = model("crit", min=1, capacity_class="critical")
    entry_ = (replica("crit-1", "crit", on=["a1", "b1"]), crit, False)
    moves, why = plan_shed(
        fac({R1: hot(0)}),
        {"a1": (R1,), "b1": (R2,)},
        {"a1": [entry_], "b1": [entry_]},
        set(),
        lambda c, a: to("z9"),
    )
    assert moves == []
    assert why == [(R1, "rack r1 is hot and has nothing that may be shed")]


def fabric_racked(node_id: str, rack: str, gpus: int = 1):
    return gpu_node(node_id, gpus=gpus, labels={RACK_LABEL: rack}, fabric="ib")


def wide_model(**kw):
    return model("wide", gpu_profile("two", tp=2, nodes=2), **kw)


def test_a_pass_moves_a_replica_over_several_nodes_onto_nodes_none_of_which_is_hot():
    # wide-a spans a1 (hot r1) and b1 (r2); b2 is free in r2 but c1 and c2 in r3 come
    # first: nodes not running the model yet. Its replacement is placed whole, through
    # the fabric group, before it retires.
    wide = wide_model(min=1, capacity_class="opportunistic")
    snap = snapshot(
        [
            fabric_racked("a1", "r1"),
            fabric_racked("b1", "r2"),
            fabric_racked("c1", "r3"),
            fabric_racked("c2", "r3"),
        ],
        [wide],
        [replica("wide-a", "wide", on=["a1", "b1"], gpus=(0,), profile="two")],
    )
    at = NOW.timestamp()
    snap = replace(snap, facility=fac({R1: hot(at - 700)}, now=at))

    plan = run(snap)

    assert [sorted(sh.node_id for _, sh in s.shards) for s in plan.starts] == [["c1", "c2"]]
    assert [(r.replica_id, r.reason.split(":")[0]) for r in plan.retires] == [
        ("wide-a", "shed wide-a of wide off rack r1 to c1, c2")
    ]


def test_a_replica_over_several_nodes_with_no_group_outside_the_hot_rack_stays():
    # The only other fabric group node is c1 in r1, hot too: no replacement, nothing moves.
    wide = wide_model(min=1, capacity_class="opportunistic")
    snap = snapshot(
        [fabric_racked("a1", "r1"), fabric_racked("b1", "r2"), fabric_racked("c1", "r1")],
        [wide],
        [replica("wide-a", "wide", on=["a1", "b1"], gpus=(0,), profile="two")],
    )
    at = NOW.timestamp()
    snap = replace(snap, facility=fac({R1: hot(at - 700)}, now=at))

    plan = run(snap)

    assert not plan.starts and not plan.retires
    assert "rack r1 is hot and no replica on it has room elsewhere" in plan.events


def test_observe_only_says_it_would_have_shed_and_does_nothing():
    chat = model("chat", min=1)
    snap = snapshot(
        [racked("a1", "r1"), racked("b1", "r2")], [chat], [replica("chat-a", "chat", on="a1")]
    )
    at = NOW.timestamp()
    snap = replace(snap, facility=fac({R1: hot(at - 700)}, now=at, enforce=False))

    plan = run(snap)

    assert not plan.starts and not plan.retires
    (said,) = [e for e in plan.events if "shed" in e]
    assert said == (
        "would have shed chat-a of chat off rack r1 to b1: hot for 12 min (inlet 34 °C)"
        " (LLMGW_FACILITY_ENFORCE is off)"
    )


@pytest.mark.parametrize(
    ("before", "after", "expected"),
    [
        ({}, {R1: "warm"}, {"a1": 0.8}),  # warm: capped
        ({R1: "warm"}, {R1: "hot"}, {}),  # still capped: hot is shedding's, the cap stays
        ({}, {R1: "hot"}, {"a1": 0.8}),  # straight to hot: capped too
        ({R1: "hot"}, {R1: "ok"}, {"a1": None}),  # cooled: let go
        ({R1: "warm"}, {R1: "unknown"}, {"a1": None}),  # no data: as ok, let go
        ({R1: "warm", ("pdu", "p1"): "warm"}, {("pdu", "p1"): "warm"}, {}),  # its PDU still is
        ({}, {R2: "warm"}, {"b1": 0.8}),  # only the warm rack's nodes
        ({R1: "ok"}, {R1: "unknown"}, {}),
    ],
)
def test_a_node_is_capped_while_any_of_its_domains_is_warm_or_hot(before, after, expected):
    nodes = {"a1": (R1, ("pdu", "p1")), "b1": (R2,)}
    assert power_caps(before, after, nodes, 0.8) == expected


_CONDITIONS = st.dictionaries(
    st.sampled_from([R1, R2, ("pdu", "p1")]),
    st.sampled_from(["ok", "warm", "hot", "unknown"]),
)


@given(before=_CONDITIONS, after=_CONDITIONS, share=st.floats(0.1, 1))
def test_a_change_sends_exactly_what_the_kept_caps_compare_by(before, after, share):
    from fleet.domain.capping import wanted

    nodes = {"a1": (R1, ("pdu", "p1")), "b1": (R2,), "c1": ()}
    expected = {
        n: wanted(after, ds, share)
        for n, ds in nodes.items()
        if wanted(before, ds, share) != wanted(after, ds, share)
    }
    assert power_caps(before, after, nodes, share) == expected


def test_a_move_in_the_explanation_is_not_taken_for_why_the_model_is_refused():
    from fleet.domain.refusals import SHED, one_line, settled

    moved = {"profile": SHED, "reasons": ["shed chat-a of chat off rack r1 to b1: hot for 7 min"]}
    assert (one_line([moved]), settled([moved])) == ("", ())


@settings(max_examples=100, deadline=None)
@given(
    steps=st.lists(st.floats(min_value=1, max_value=400), min_size=1, max_size=30),
    interval=st.floats(min_value=0, max_value=600),
    size=st.integers(min_value=1, max_value=6),
)
def test_over_passes_a_domain_never_sheds_twice_within_an_interval(steps, interval, size):
    """Passes at any times, each move kept as the shell keeps it (shed_at): a domain's moves
    are at least an interval apart, whatever is left to move."""
    nodes = {"a1": (R1,), "a2": (R1, R2), "b1": (R2,)}
    shed = Shedding(True, delay=0, interval=interval)
    left = {
        n: [(replica(f"{n}-{i}", "chat", on=n), model("chat", min=0), True) for i in range(size)]
        for n in ("a1", "a2", "b1")
    }
    shed_at: dict = {}
    moves: dict = {}
    now = 0.0
    for step in steps:
        now += step
        f = fac({R1: hot(-1), R2: hot(-1)}, now=now, shed=shed, shed_at=dict(shed_at))
        done, _ = plan_shed(f, nodes, left, set(), lambda c, a: to("z9"))
        for m in done:
            for d in m.domains:
                moves.setdefault(d, []).append(now)
                shed_at[d] = now
            node = next(iter(m.candidate.replica.nodes))
            left[node] = [e for e in left[node] if e[0].id != m.candidate.replica.id]
    for times in moves.values():
        assert all(b - a >= interval for a, b in zip(times, times[1:], strict=False)), times
