"""Spreading over PDUs as over racks, and over the design's location tree: site, room,
row (docs/facility.md, "Spreading a model")."""

from __future__ import annotations

from hypothesis import given, settings, strategies as st

from fleet.domain.power import PDU_LABEL, RACK_LABEL, ZONE_LABEL
from fleet.domain.spread import (
    LEVELS,
    ROOM_LABEL,
    ROW_LABEL,
    SITE_LABEL,
    Spread,
    location_of,
    places_of,
)

from .builders import gpu_node, model, run, snapshot


def at(node_id: str, **labels: str):
    named = {
        "rack": RACK_LABEL,
        "pdu": PDU_LABEL,
        "row": ROW_LABEL,
        "room": ROOM_LABEL,
        "zone": ZONE_LABEL,
        "site": SITE_LABEL,
    }
    return gpu_node(node_id, labels={named[k]: v for k, v in labels.items()})


def placed_on(plan) -> list[str]:
    return [p.node_id for s in plan.starts for _, p in s.shards]


def test_replicas_spread_over_pdus_when_the_racks_are_even():
    # One rack fed by two PDUs: the second replica goes to the other PDU.
    nodes = [
        at("a1", rack="r1", pdu="pa"),
        at("a2", rack="r1", pdu="pa"),
        at("b1", rack="r1", pdu="pb"),
    ]
    assert placed_on(run(snapshot(nodes, [model("chat", min=2)]))) == ["a1", "b1"]


def test_a_dual_fed_node_counts_as_full_as_its_fuller_pdu():
    spread = Spread({"n1": {PDU_LABEL: "pa,pb"}, "n2": {PDU_LABEL: "pb"}, "n3": {PDU_LABEL: "pc"}})
    spread.add("m", ["n2"])  # one replica on pb
    assert spread.key("m", "n1")[LEVELS.index("pdu")] == 1
    assert spread.key("m", "n3")[LEVELS.index("pdu")] == 0


def test_replicas_spread_over_rows_rooms_and_sites_when_racks_are_even():
    for level in ("row", "room", "site"):
        nodes = [
            at("a1", rack="r1", **{level: "x"}),
            at("a2", rack="r2", **{level: "x"}),
            at("b1", rack="r3", **{level: "y"}),
        ]
        plan = run(snapshot(nodes, [model("chat", min=2)]))
        assert placed_on(plan) == ["a1", "b1"], level


def test_the_rack_comes_before_the_larger_places():
    # r1 holds one in site x; r2 is empty but also in x; r3 is in y but holds one.
    nodes = [
        at("a1", rack="r1", site="x"),
        at("a2", rack="r2", site="x"),
        at("b1", rack="r3", site="y"),
    ]
    spread = Spread({n.id: n.labels for n in nodes})
    spread.add("m", ["a1"])
    spread.add("m", ["b1"])
    assert min(("a1", "a2", "b1"), key=lambda n: spread.key("m", n)) == "a2"


def test_a_node_without_the_tree_labels_is_a_place_of_its_own_size():
    assert places_of("n1", {}) == (
        ("node n1",),
        ("pdu of node n1",),
        ("node n1",),
        ("node n1",),
        ("node n1",),
        ("node n1",),
    )
    assert places_of("n1", {RACK_LABEL: "r1", ROOM_LABEL: "hall-b"})[2:] == (
        ("r1",),
        ("room hall-b",),
        ("room hall-b",),
        ("room hall-b",),
    )


def test_the_location_names_the_tree():
    labels = {SITE_LABEL: "sto1", ROOM_LABEL: "hall-b", ROW_LABEL: "12", RACK_LABEL: "r12-07"}
    assert location_of(labels) == {"site": "sto1", "room": "hall-b", "row": "12", "rack": "r12-07"}


@st.composite
def fleets(draw):
    n = draw(st.integers(2, 8))
    labels = {}
    for i in range(n):
        ls = {}
        for label, values in (
            (RACK_LABEL, ["r1", "r2", "r3"]),
            (PDU_LABEL, ["pa", "pb", "pa,pb"]),
            (ROW_LABEL, ["1", "2"]),
            (SITE_LABEL, ["s1", "s2"]),
        ):
            if draw(st.booleans()):
                ls[label] = draw(st.sampled_from(values))
        labels[f"n{i}"] = ls
    adds = draw(st.lists(st.sampled_from(sorted(labels)), max_size=10))
    return labels, adds


@settings(max_examples=200, deadline=None)
@given(case=fleets())
def test_no_node_is_below_the_floor_so_the_index_may_stop_there(case):
    labels, adds = case
    spread = Spread(labels)
    for node_id in adds:
        spread.add("m", [node_id])
    floor = spread.floor("m")
    for node_id in labels:
        key = spread.key("m", node_id)
        assert all(k >= f for k, f in zip(key, floor, strict=True)), (node_id, key, floor)
