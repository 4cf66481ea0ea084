"""Large inventories place one-node GPU replicas through an index of free GPUs: it must pick
exactly the node and GPUs that judging every node in preference order would."""

from __future__ import annotations

from hypothesis import given, settings, strategies as st

from catalog.domain import Profile
from fleet.domain import placement
from fleet.domain.placement import Inventory, Placement

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


def placed_by(inv: Inventory, index_from: int, profile: Profile, avoid, source):
    was = placement.INDEX_FROM
    placement.INDEX_FROM = index_from
    try:
        return inv.place([profile], avoid=avoid, weights_source=source)
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
