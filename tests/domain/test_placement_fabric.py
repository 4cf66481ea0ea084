"""Placement upon the GPU fabric (docs/fabric.md, Placement): GPUs out of service, NVLink
domains with IMEX for replicas over several nodes, and GPUs joined by NVLink inside one."""

from dataclasses import replace

from fleet.domain.placement import Inventory, Placement
from fleet.domain.types import FABRIC_LABEL, GpuView, NodeView

from .builders import (
    H100,
    Cluster,
    gpu_node,
    gpu_profile,
    model,
    nodes_of,
    place,
    reasons_of,
    replica,
    snapshot,
)

GB200 = "gb200"
A, B = "a1b2c3d4e5f60718293a4b5c6d7e8f90", "ffeeddccbbaa00998877665544332211"


def with_gpus(node: NodeView, **by_index: dict) -> NodeView:
    """The node with some GPUs changed: `g3={"problem": "..."}`."""
    gpus = tuple(replace(g, **by_index.get(f"g{g.index}", {})) for g in node.gpus)
    return replace(node, gpus=gpus)


def tray(node_id: str, domain: tuple[str, int] | None, *, imex: bool | None = True, **kw):
    """An NVL72 compute tray: four GB200 GPUs in `domain`, IMEX up unless said."""
    node = gpu_node(node_id, gpus=4, gpu_class=GB200, **kw)
    gpus = tuple(replace(g, domain=domain) for g in node.gpus)
    return replace(node, gpus=gpus, imex=imex)


def bridged(node_id: str, pairs=((0, 1), (2, 3)), gpus: int = 4, **kw) -> NodeView:
    """A PCIe node whose GPUs NVLink bridges join in pairs."""
    peers: dict[int, set[int]] = {i: set() for i in range(gpus)}
    for a, b in pairs:
        peers[a].add(b)
        peers[b].add(a)
    node = gpu_node(node_id, gpus=gpus, **kw)
    return replace(
        node, gpus=tuple(replace(g, nvlink_peers=frozenset(peers[g.index])) for g in node.gpus)
    )


ECC = "GPU 3 of n1 has 2 uncorrected ECC errors"


# GPUs out of service


def test_a_gpu_with_a_problem_is_not_given_out():
    node = with_gpus(gpu_node("n1"), g3={"problem": ECC})
    result = place([node], gpu_profile(tp=4))
    assert result.shards[0].gpu_indices == (0, 1, 2, 4)


def test_a_cordoned_gpu_is_not_given_out():
    node = with_gpus(gpu_node("n1", gpus=2), g0={"cordoned": True})
    assert place([node], gpu_profile()).shards[0].gpu_indices == (1,)


def test_the_refusal_names_the_gpu_and_its_problem_when_that_is_what_binds():
    node = with_gpus(gpu_node("n1"), g3={"problem": ECC}, g5={"cordoned": True})
    result = place([node], gpu_profile(tp=8))
    assert reasons_of(result) == [
        f"node n1 has 6 free {H100} GPUs of 8, needs 8: {ECC}; GPU 5 of node n1 is cordoned"
    ]
    assert result.summary() == reasons_of(result)[0][len("node ") :]


def test_many_gpus_out_of_service_are_named_three_and_counted():
    node = with_gpus(gpu_node("n1"), **{f"g{i}": {"cordoned": True} for i in range(5)})
    (said,) = reasons_of(place([node], gpu_profile(tp=8)))
    assert said.endswith("GPU 2 of node n1 is cordoned; and 2 more")


def test_when_the_node_is_short_anyway_the_usual_sentence_speaks():
    node = with_gpus(gpu_node("n1"), g7={"problem": ECC})
    held = replica("r1", "other", gpus=(0, 1, 2, 3))
    result = place([node], gpu_profile(tp=8), replicas=[held])
    assert reasons_of(result) == [f"node n1 has 3 free {H100} GPUs of 8, needs 8"]


def test_a_gpu_out_of_service_held_by_a_replica_does_not_bind():
    """In service, it would still be held: the node is short of GPUs, not of service."""
    node = with_gpus(gpu_node("n1", gpus=2), g1={"problem": ECC})
    result = place([node], gpu_profile(tp=2), replicas=[replica("r1", "other", gpus=(1,))])
    assert reasons_of(result) == [f"node n1 has 1 free {H100} GPUs of 2, needs 2"]


def test_a_replica_running_on_a_gpu_with_a_problem_is_left_alone():
    node = with_gpus(gpu_node("n1", gpus=2), g0={"problem": ECC})
    running = replica("r1", "m", gpus=(0,))
    c = Cluster(snapshot([node], [model("m", gpu_profile())], [running]))
    plan = c.step()
    assert not plan.stops and not plan.drains and not plan.starts
    assert [r.state for r in c.snap.replicas] == ["ready"]


def test_a_gpu_with_a_problem_is_not_given_back_when_its_replica_stops():
    node = with_gpus(gpu_node("n1", gpus=2), g0={"problem": ECC})
    inv = Inventory({"n1": node}, [replica("r1", "m", gpus=(0,))])
    assert inv.trial(["n1"], [replica("r1", "m", gpus=(0,))]).rooms["n1"].free_gpus == {H100: [1]}


# NVLink domains for replicas over several nodes


def test_a_replica_over_several_nodes_stays_in_one_domain():
    trays = [tray(f"a{i}", (A, 1)) for i in range(3)] + [tray(f"b{i}", (B, 0)) for i in range(4)]
    result = place(trays, gpu_profile(gpu_class=GB200, tp=16, nodes=4))
    assert sorted(nodes_of(result)) == ["b0", "b1", "b2", "b3"]


def test_two_cliques_of_one_cluster_are_two_domains():
    trays = [tray("a0", (A, 1)), tray("a1", (A, 2))]
    result = place(trays, gpu_profile(gpu_class=GB200, tp=8, nodes=2))
    assert reasons_of(result) == [
        f"domain {A} clique 1 has 4 free GPUs on 1 trays with IMEX up; "
        "the replica needs 8 on 2 trays"
    ]


def test_a_tray_without_imex_up_is_not_taken_and_the_refusal_counts_it():
    trays = [tray(f"a{i}", (A, 1)) for i in range(3)]
    trays += [tray("a3", (A, 1), imex=False), tray("a4", (A, 1), imex=None)]
    result = place(trays, gpu_profile(gpu_class=GB200, tp=16, nodes=4))
    assert reasons_of(result) == [
        f"domain {A} clique 1 has 12 free GPUs on 3 trays with IMEX up (2 more without); "
        "the replica needs 16 on 4 trays"
    ]


def test_the_refusal_names_the_domain_that_came_closest_and_each_refused_tray():
    full = tray("b2", (B, 0))
    trays = [tray("a0", (A, 1)), tray("b0", (B, 0)), tray("b1", (B, 0)), full]
    held = replica("r1", "other", on="b2", gpus=(0,))
    result = place(trays, gpu_profile(gpu_class=GB200, tp=12, nodes=3), replicas=[held])
    assert reasons_of(result) == [
        f"node b2 has 3 free {GB200} GPUs of 4, needs 4",
        f"domain {B} clique 0 has 8 free GPUs on 2 trays with IMEX up; "
        "the replica needs 12 on 3 trays",
    ]


def test_the_label_is_not_read_where_the_domain_is_known():
    trays = [tray("a0", (A, 1), fabric="rack-1"), tray("b0", (B, 0), fabric="rack-1")]
    result = place(trays, gpu_profile(gpu_class=GB200, tp=8, nodes=2))
    assert reasons_of(result) == [
        f"domain {A} clique 1 has 4 free GPUs on 1 trays with IMEX up; "
        "the replica needs 8 on 2 trays"
    ]


def test_the_label_keeps_working_where_no_gpu_reports_a_domain():
    fleet = [
        tray("a0", (A, 1)),
        tray("a1", (A, 1)),
        gpu_node("h1", fabric="ib"),
        gpu_node("h2", fabric="ib"),
    ]
    assert sorted(nodes_of(place(fleet, gpu_profile(tp=16, nodes=2)))) == ["h1", "h2"]
    result = place(fleet[:3], gpu_profile(tp=16, nodes=2))
    assert reasons_of(result)[-1] == (
        f"no {FABRIC_LABEL} group has 2 eligible nodes (the largest has 1)"
    )


def test_a_tray_with_gpus_in_two_domains_goes_with_neither():
    split = tray("a1", (A, 1))
    split = replace(
        split, gpus=(*split.gpus[:2], *(replace(g, domain=(B, 0)) for g in split.gpus[2:]))
    )
    result = place([tray("a0", (A, 1)), split], gpu_profile(gpu_class=GB200, tp=8, nodes=2))
    assert not isinstance(result, Placement)


def test_a_tray_whose_gpus_are_all_out_of_service_is_refused_for_itself():
    sick = with_gpus(tray("a1", (A, 1)), **{f"g{i}": {"problem": ECC} for i in range(4)})
    result = place([tray("a0", (A, 1)), sick], gpu_profile(gpu_class=GB200, tp=8, nodes=2))
    reasons = reasons_of(result)
    assert reasons[0].startswith(f"node a1 has 0 free {GB200} GPUs of 4, needs 4: {ECC}")
    assert reasons[-1] == (
        f"domain {A} clique 1 has 4 free GPUs on 1 trays with IMEX up; "
        "the replica needs 8 on 2 trays"
    )


def test_preemption_makes_room_within_a_domain():
    """Without a label: the domain is the fabric the search makes room in."""
    trays = [tray(f"a{i}", (A, 1)) for i in range(2)]
    low = model("low", gpu_profile("g", gpu_class=GB200, tp=4), capacity_class="opportunistic")
    big = model("big", gpu_profile("g", gpu_class=GB200, tp=8, nodes=2), capacity_class="critical")
    running = replica("r1", "low", on="a0", gpus=(0, 1, 2, 3), profile="g")
    plan = Cluster(snapshot(trays, [low, big], [running])).step()
    assert [(d.replica_id, d.preempted_for) for d in plan.drains] == [("r1", "big")]


# GPUs joined by NVLink inside one node


def test_a_shard_takes_gpus_joined_by_nvlink():
    node = bridged("n1")
    held = replica("r1", "other", gpus=(0,))
    assert place([node], gpu_profile(tp=2), replicas=[held]).shards[0].gpu_indices == (2, 3)


def test_a_node_that_can_give_a_joined_set_comes_before_a_fuller_one_that_cannot():
    fuller = bridged("n1")
    emptier = bridged("n2")
    held = [replica("r1", "other", on="n1", gpus=(1, 3))]
    result = place([fuller, emptier], gpu_profile(tp=2), replicas=held)
    assert nodes_of(result) == ["n2"] and result.shards[0].gpu_indices == (0, 1)


def test_a_node_that_says_nothing_of_its_links_is_not_put_behind():
    quiet = gpu_node("n1", gpus=2)
    joined = bridged("n2")
    assert nodes_of(place([quiet, joined], gpu_profile(tp=2))) == ["n1"]


def test_one_gpu_shards_are_not_ordered_by_links():
    node = bridged("n1")
    held = replica("r1", "other", gpus=(0,))
    assert place([node], gpu_profile(), replicas=[held]).shards[0].gpu_indices == (1,)


def test_an_nvswitch_board_where_every_gpu_reaches_every_other_takes_the_lowest():
    every = {i: frozenset(set(range(8)) - {i}) for i in range(8)}
    node = gpu_node("n1")
    node = replace(
        node,
        gpus=tuple(GpuView(g.index, g.gpu_class, nvlink_peers=every[g.index]) for g in node.gpus),
    )
    assert place([node], gpu_profile(tp=4)).shards[0].gpu_indices == (0, 1, 2, 3)
