"""Placement's invariants upon a random GPU fabric, pass after pass: no GPU given twice, a
replica over several nodes never across two known NVLink domains (nor onto a tray
without IMEX up), a GPU with a problem or cordoned never newly given a replica; and
the index of large fleets places where judging every node would, links and all."""

from dataclasses import replace

from hypothesis import HealthCheck, given, settings, strategies as st

from catalog.domain import ModelSpec, Profile
from fleet.domain.types import FABRIC_LABEL, NodeView

from .builders import H100, Cluster, gpu_node, snapshot
from .test_placement_index import assert_the_index_places_as_judging_every_node, gpu_profiles
from .test_placement_properties import (
    SOURCES,
    agents_report,
    assert_nothing_given_twice,
    catalogs,
    nodes,
    sometimes,
)

# The first domain most often, so that replicas over several nodes find one.
DOMAINS = (("a" * 32, 1), ("a" * 32, 1), None, ("a" * 32, 2), ("b" * 32, 0))
LINKS = ("none", "pairs", "all")


def peers_of(kind: str, index: int, count: int) -> frozenset[int]:
    if kind == "pairs":
        mate = index ^ 1
        return frozenset({mate}) if mate < count else frozenset()
    if kind == "all":
        return frozenset(range(count)) - {index}
    return frozenset()


@st.composite
def on_a_fabric(draw, node: NodeView) -> NodeView:
    """The node with a fabric of its own drawn: a domain (sometimes split), IMEX, links,
    and GPUs with problems or cordoned."""
    domain = draw(st.sampled_from(DOMAINS))
    links = draw(st.sampled_from(LINKS))
    count = len(node.gpus)
    gpus = []
    for g in node.gpus:
        gpus.append(
            replace(
                g,
                domain=draw(st.sampled_from(DOMAINS)) if draw(sometimes(10)) else domain,
                nvlink_peers=peers_of(links, g.index, count),
                problem=f"GPU {g.index} of node {node.id} is sick" if draw(sometimes(6)) else None,
                cordoned=draw(sometimes(10)),
            )
        )
    return replace(node, gpus=tuple(gpus), imex=draw(st.sampled_from([True, True, False, None])))


@st.composite
def fabrics(draw) -> list[NodeView]:
    return [draw(on_a_fabric(n)) for n in draw(nodes())]


@st.composite
def racks(draw) -> list[NodeView]:
    """Trays of one GPU class, some labelled: replicas over several nodes find room."""
    out = []
    for i in range(draw(st.integers(2, 6))):
        fabric = draw(st.sampled_from([None, "ib-a"]))
        node = gpu_node(f"n{i}", gpus=draw(st.sampled_from([2, 4])), gpu_class=H100, fabric=fabric)
        out.append(draw(on_a_fabric(node)))
    return out


@st.composite
def gpu_models(draw) -> list[ModelSpec]:
    """Models of one to three profiles over one to three nodes, wanting one or two."""
    out = []
    for i in range(draw(st.integers(1, 4))):
        profiles = []
        for j in range(draw(st.integers(1, 2))):
            spread = draw(st.sampled_from([1, 2, 2, 3]))
            tp = draw(st.sampled_from([1, 2, 4])) * spread
            profiles.append(Profile(f"p{j}", engine="vllm", gpu_class=H100, tp=tp, nodes=spread))
        lo = draw(st.integers(0, 2))
        out.append(
            ModelSpec(
                name=f"m{i}",
                profiles=tuple(profiles),
                min_replicas=lo,
                max_replicas=lo + draw(st.integers(0 if lo else 1, 1)),
                capacity_class=draw(st.sampled_from(["", "critical", "opportunistic"])),
            )
        )
    return out


def one_h100(tp: int) -> Profile:
    return Profile("p", engine="vllm", gpu_class=H100, tp=tp)


def assert_every_start_kept_the_fabric(before, plan) -> None:
    for start in plan.starts:
        shards = [p for _, p in start.shards]
        used = []
        for p in shards:
            node = before.nodes[p.node_id]
            by_index = {g.index: g for g in node.gpus}
            for i in p.gpu_indices:
                gpu = by_index[i]
                # Said again without free_to_place, so a change to it is caught here too.
                assert gpu.problem is None and not gpu.cordoned and gpu.healthy and not gpu.held, (
                    f"{start.replica_id} got {p.node_id}:{i}: {gpu}"
                )
                used.append((node, gpu))
        if len(shards) < 2 or not used:
            continue
        domains = {g.domain for _, g in used}
        if domains != {None}:
            assert len(domains) == 1 and None not in domains, f"across domains {domains}"
            assert all(n.imex is True for n, _ in used), "on a tray without IMEX up"
        else:
            fabrics = {before.nodes[p.node_id].labels.get(FABRIC_LABEL) for p in shards}
            assert len(fabrics) == 1 and None not in fabrics, f"across fabrics {fabrics}"


@settings(
    max_examples=150,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(fleet=fabrics(), catalog=catalogs(), data=st.data())
def test_passes_upon_a_fabric_keep_it(fleet, catalog, data):
    models, states = catalog
    passes(Cluster(snapshot(fleet, models, states=states)), data)


@settings(
    max_examples=150,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(fleet=racks(), models=gpu_models(), data=st.data())
def test_replicas_over_several_nodes_keep_the_fabric(fleet, models, data):
    passes(Cluster(snapshot(fleet, models)), data)


def passes(c: Cluster, data) -> None:
    """Six passes, the agents reporting random outcomes, each held to the fabric."""
    for _ in range(6):
        c.wait(data.draw(st.sampled_from([5, 20, 70]), label="wait"))
        before = c.snap
        plan = c.step()
        assert_every_start_kept_the_fabric(before, plan)
        assert_nothing_given_twice(c.snap)
        agents_report(c, data)


@settings(max_examples=200, deadline=None)
@given(
    st.one_of(fabrics(), racks()),
    st.lists(
        st.tuples(
            st.one_of(gpu_profiles(), st.sampled_from([1, 2, 2]).map(one_h100)),
            st.sampled_from(["", *SOURCES]),
            st.frozensets(st.sampled_from(["n0", "n1", "n2"]), max_size=1),
        ),
        min_size=1,
        max_size=12,
    ),
)
def test_the_index_follows_the_links(fleet, asks):
    assert_the_index_places_as_judging_every_node(fleet, asks)
