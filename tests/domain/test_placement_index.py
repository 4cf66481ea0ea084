"""Large inventories place one-node GPU replicas through an index of free GPUs: it must pick
exactly the node and GPUs that judging every node in preference order would."""

from __future__ import annotations

from hypothesis import given, settings, strategies as st

from catalog.domain import Profile
from fleet.domain.placement import Inventory, Placement, inventory as placement
from fleet.domain.power import (
    PDU_LABEL,
    PHASE_LABEL,
    RACK_LABEL,
    ZONE_LABEL,
    Budget,
    GpuPower,
    Power,
)

from .builders import gpu_node
from .test_placement_properties import ENGINES, GPU_CLASSES, SOURCES, nodes


@st.composite
def gpu_profiles(draw) -> Profile:
    return Profile(
        name="p",
        engine=draw(st.sampled_from(ENGINES)),
        gpu_class=draw(st.sampled_from(GPU_CLASSES)),
        tp=draw(st.sampled_from([1, 2, 4, 8])),
        node_selector=draw(st.sampled_from([{}, {}, {"zone": "a"}])),
    )


def placed_by(inv: Inventory, index_from: int, profile: Profile, avoid, source, model=""):
    was = placement.INDEX_FROM
    placement.INDEX_FROM = index_from
    try:
        return inv.place([profile], avoid=avoid, weights_source=source, model=model)
    finally:
        placement.INDEX_FROM = was


@settings(max_examples=150, deadline=None)
@given(
    nodes(),
    st.lists(
        st.tuples(
            gpu_profiles(),
            st.sampled_from(["", *SOURCES]),
            st.frozensets(st.sampled_from(["n0", "n1", "n2"]), max_size=1),
        ),
        min_size=1,
        max_size=12,
    ),
)
def test_the_index_places_where_judging_every_node_would(fleet, asks):
    assert_the_index_places_as_judging_every_node(fleet, asks)


def assert_the_index_places_as_judging_every_node(fleet, asks) -> None:
    """Each ask placed through the index and by judging every node lands on the same GPUs,
    or both refuse it the same way."""
    by_id = {n.id: n for n in fleet}
    fast, slow = Inventory(by_id, ()), Inventory(by_id, ())
    for profile, source, avoid in asks:
        a = placed_by(fast, 0, profile, avoid, source)
        b = placed_by(slow, 10**9, profile, avoid, source)
        if isinstance(b, Placement):
            assert isinstance(a, Placement)
            assert [(s.node_id, s.gpu_indices) for s in a.shards] == [
                (s.node_id, s.gpu_indices) for s in b.shards
            ]
            fast.reserve("m", a)
            slow.reserve("m", b)
        else:
            assert a == b, "when nothing fits, both say why the same way"


@st.composite
def racked(draw):
    """A fleet of GPU nodes in racks and zones (some without), on PDUs and their phases,
    with power limits reported for some, under budgets for some racks, PDUs and phases."""
    out, gpus = [], {}
    for i in range(draw(st.integers(1, 12))):
        labels = {}
        if rack := draw(st.sampled_from(["r1", "r2", "r3", None])):
            labels[RACK_LABEL] = rack
        if zone := draw(st.sampled_from(["z1", "z2", None])):
            labels[ZONE_LABEL] = zone
        if pdu := draw(st.sampled_from(["pa", "pb", "pa,pb", None])):
            labels[PDU_LABEL] = pdu
            if draw(st.booleans()):  # on a phase of each PDU
                phases = [draw(st.sampled_from(["L1", "L2", "L3"])) for _ in pdu.split(",")]
                labels[PHASE_LABEL] = ",".join(phases)
        count = draw(st.integers(1, 8))
        out.append(
            gpu_node(
                f"n{i}",
                gpus=count,
                labels=labels,
                weights=draw(st.sets(st.sampled_from(SOURCES), max_size=1)),
            )
        )
        if draw(st.booleans()):
            gpus[f"n{i}"] = {g: GpuPower(700.0) for g in range(count)}
    budgets = tuple(
        Budget(
            kind,
            name,
            draw(st.integers(0, 20_000)),
            margin=draw(st.sampled_from([0.0, 0.1])),
            other_w=draw(st.sampled_from([0.0, 500.0])),
        )
        for kind, name in (
            ("rack", "r1"),
            ("rack", "r2"),
            ("pdu", "pa"),
            ("pdu", "pb"),
            ("phase", "pa/L1"),
            ("phase", "pa/L2"),
            ("phase", "pb/L3"),
        )
        if draw(st.booleans())
    )
    return out, Power(budgets, gpus)


@settings(max_examples=150, deadline=None)
@given(
    racked(),
    st.lists(
        st.tuples(
            st.sampled_from(["m1", "m2"]),
            st.sampled_from([1, 2, 4]),
            st.sampled_from(["", *SOURCES]),
            st.frozensets(st.sampled_from(["n0", "n1", "n2"]), max_size=1),
        ),
        min_size=1,
        max_size=12,
    ),
)
def test_spread_over_racks_the_index_places_where_judging_every_node_would(fleet, asks):
    nodes, power = fleet
    by_id = {n.id: n for n in nodes}
    fast, slow = Inventory(by_id, (), power=power), Inventory(by_id, (), power=power)
    for model, tp, source, avoid in asks:
        profile = Profile(name="p", engine="vllm", gpu_class="h100-80g", tp=tp)
        a = placed_by(fast, 0, profile, avoid, source, model)
        b = placed_by(slow, 10**9, profile, avoid, source, model)
        assert isinstance(a, Placement) == isinstance(b, Placement)
        if isinstance(b, Placement):
            assert [(s.node_id, s.gpu_indices) for s in a.shards] == [
                (s.node_id, s.gpu_indices) for s in b.shards
            ]
            assert a.said == b.said
            fast.reserve(model, a)
            slow.reserve(model, b)
