"""Placement under the facility's conditions and holds (docs/facility.md, "Conditions"):
hot refused as a cordon would, warm scored down, holds always enforced, observe-only says
what it would have done and does nothing, and missing data refuses nothing."""

from __future__ import annotations

from dataclasses import replace

from hypothesis import HealthCheck, given, settings, strategies as st

from fleet.domain.conditions import (
    Facility,
    Hold,
    Readings,
    State,
    Thresholds,
    step,
)
from fleet.domain.placement import INDEX_FROM
from fleet.domain.power import RACK_LABEL

from .builders import gpu_node, model, run, snapshot

T = Thresholds()


def racked(node_id: str, rack: str, **kw):
    return gpu_node(node_id, labels={RACK_LABEL: rack}, **kw)


def condition(c: float, for_s: float = 400) -> State:
    """A domain whose inlet has read `c` °C for `for_s` seconds (from ok)."""
    s = step(State(), Readings(inlet_c=20), 0, T)
    t = 10.0
    while t <= 10 + for_s:
        s = step(s, Readings(inlet_c=c), t, T)
        t += 10
    return s


HOT, WARM = condition(33), condition(28)
FLEET = [racked("a1", "r1", gpus=1), racked("b1", "r2", gpus=1), racked("c1", "r3", gpus=1)]


def placed_on(plan) -> list[str]:
    return [p.node_id for s in plan.starts for _, p in s.shards]


def with_facility(snap, **kw):
    return replace(snap, facility=Facility(now=500, **kw))


def test_enforced_a_hot_rack_is_refused_as_a_cordon_would_and_a_warm_one_comes_last():
    fac = {("rack", "r1"): HOT, ("rack", "r2"): WARM}
    snap = with_facility(snapshot(FLEET, [model("chat", min=3)]), states=fac, enforce=True)

    plan = run(snap)

    assert placed_on(plan) == ["c1", "b1"]  # r3 ok first, r2 warm after; r1 hot refused
    said = [r for e in plan.states["chat"].explanation for r in e["reasons"]]
    assert any(r.startswith("node a1: rack r1 is hot (inlet 33 °C for") for r in said), said


def test_observe_only_places_as_before_and_says_what_it_would_have_refused():
    fac = {("rack", "r1"): HOT}
    before = run(snapshot(FLEET, [model("chat", min=1)]))
    snap = with_facility(snapshot(FLEET, [model("chat", min=1)]), states=fac, enforce=False)

    plan = run(snap)

    assert placed_on(plan) == placed_on(before) == ["a1"]
    assert "would have refused node a1: rack r1 is hot (inlet 33 °C for" in plan.starts[0].reason
    assert any("would have refused node a1" in str(e) for e in plan.events)


def test_a_hold_refuses_new_placements_in_its_domain_even_observing():
    hold = (Hold("rack", "r1", "breaker work", "fac-team"),)
    snap = with_facility(snapshot(FLEET, [model("chat", min=1)]), holds=hold, enforce=False)

    plan = run(snap)

    assert placed_on(plan) == ["b1"]


def test_a_cooled_rack_takes_work_again():
    cooled = step(HOT, Readings(inlet_c=20), 500, T)
    cooled = step(cooled, Readings(inlet_c=20), 801, T)
    fleet = [racked("a1", "r1")]
    snap = with_facility(
        snapshot(fleet, [model("chat", min=1)]), states={("rack", "r1"): cooled}, enforce=True
    )

    assert cooled.condition == "ok"
    assert placed_on(run(snap)) == ["a1"]


def test_only_hot_racks_left_nothing_is_placed_and_the_sentence_names_the_rack():
    fac = {("rack", "r1"): HOT, ("rack", "r2"): HOT, ("rack", "r3"): HOT}
    snap = with_facility(snapshot(FLEET, [model("chat", min=1)]), states=fac, enforce=True)

    plan = run(snap)

    assert placed_on(plan) == []
    assert plan.states["chat"].unplaceable


def test_on_a_large_fleet_the_index_gives_way_to_the_conditions():
    fleet = [racked(f"n{i:03}", f"r{i % 4}") for i in range(INDEX_FROM)]
    fac = {("rack", "r0"): WARM, ("rack", "r1"): HOT}
    snap = with_facility(snapshot(fleet, [model("chat", min=1)]), states=fac, enforce=True)

    plan = run(snap)

    # n000 (r0, warm) and n001 (r1, hot) would come first by id; n002 is in r2, ok.
    assert placed_on(plan) == ["n002"]


readings_st = st.one_of(
    st.none(),
    st.builds(
        Readings,
        inlet_c=st.none() | st.floats(-10, 80),
        cooling_alarm=st.none() | st.booleans(),
        gpus=st.integers(0, 8),
        throttled=st.integers(0, 8),
    ),
)


@settings(max_examples=40, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(readings_st, max_size=12), st.booleans())
def test_whatever_came_before_missing_data_places_as_if_there_were_no_facility(history, enforce):
    states = {}
    for rack in ("r1", "r2", "r3"):
        s, t = State(), 0.0
        for r in history:
            t += 60
            s = step(s, r, t, T)
        states[("rack", rack)] = step(s, None, t + 60, T)  # then nothing fresh
    bare = snapshot(FLEET, [model("chat", min=3)])

    plan = run(with_facility(bare, states=states, enforce=enforce))

    assert placed_on(plan) == placed_on(run(bare))
    assert all("would have" not in s.reason for s in plan.starts)


def test_headroom_says_the_hot_rack_that_stops_one_more():
    from fleet.domain.capacity import headroom
    from fleet.domain.placement import Inventory
    from tenancy.quota import Policy

    fleet = [racked("n1", "r1", gpus=2), racked("n2", "r2", gpus=1)]
    fac = Facility({("rack", "r2"): HOT}, enforce=True, now=500)
    inv = Inventory({n.id: n for n in fleet}, (), facility=fac)

    room = headroom(model("chat", max=8), inv, 0, 8, Policy(), {}, {})

    assert room.more == 2
    assert any(b.startswith("node n2: rack r2 is hot (inlet 33 °C for") for b in room.blocked), (
        room.blocked
    )
