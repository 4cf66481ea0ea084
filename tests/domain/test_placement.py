"""Where a replica can run: the filters, their sentences, and the order (domain.md, Placement)."""

import pytest

from fleet.domain.placement import MAX_REASONS_PER_PROFILE, Inventory, Placement
from fleet.domain.types import FABRIC_LABEL

from .builders import (
    H100,
    cpu_node,
    cpu_profile,
    gpu_node,
    gpu_profile,
    nodes_of,
    place,
    reasons_of,
    replica,
)

# Which nodes are eligible


@pytest.mark.parametrize("state", ["unreachable", "lost"])
def test_a_node_that_is_not_ready_takes_nothing(state):
    result = place([gpu_node("n1", state=state)], gpu_profile())
    assert reasons_of(result) == [f"node n1 is {state}"]


def test_a_cordoned_node_takes_no_new_placements():
    result = place([gpu_node("n1", cordoned=True)], gpu_profile())
    assert reasons_of(result) == ["node n1 is cordoned"]


def test_a_draining_node_takes_no_new_placements():
    result = place([gpu_node("n1", draining=True)], gpu_profile())
    assert reasons_of(result) == ["node n1 is draining"]


def test_an_avoided_node_is_refused_as_already_running_the_model():
    result = place([gpu_node("n1")], gpu_profile(), avoid=["n1"])
    assert reasons_of(result) == ["node n1 already runs a replica of this model"]


def test_a_node_selector_needs_every_label():
    p = gpu_profile(node_selector={"zone": "a", "tier": "prod"})
    assert nodes_of(place([gpu_node("n1", labels={"zone": "a", "tier": "prod"})], p)) == ["n1"]
    result = place([gpu_node("n1", labels={"zone": "a", "tier": "dev"})], p)
    assert reasons_of(result) == ["node n1 lacks the label tier=prod"]


def test_a_node_without_the_engine_is_refused_naming_it():
    result = place([gpu_node("n1", engines={"llamacpp"})], gpu_profile(engine="vllm"))
    assert reasons_of(result) == ["node n1 has no vllm engine installed"]


def test_an_agent_that_never_probed_for_engines_constrains_nothing():
    assert nodes_of(place([gpu_node("n1", engines=None)], gpu_profile(engine="vllm"))) == ["n1"]


def test_a_node_without_the_gpu_class_is_refused_naming_the_class():
    result = place([gpu_node("n1", gpu_class="a100-80g")], gpu_profile(gpu_class=H100))
    assert reasons_of(result) == ["node n1 has no h100-80g GPUs"]


def test_gpu_refusal_reads_has_free_gpus_of_total_needs():
    taken = replica("r1", "other", on="n1", gpus=range(6))
    result = place([gpu_node("n1", gpus=8)], gpu_profile(tp=4), replicas=[taken])
    assert reasons_of(result) == ["node n1 has 2 free h100-80g GPUs of 8, needs 4"]


def test_an_unhealthy_gpu_is_not_given_out():
    result = place([gpu_node("n1", gpus=2, unhealthy=[0])], gpu_profile())
    assert result.shards[0].gpu_indices == (1,)
    result = place([gpu_node("n1", gpus=2, unhealthy=[0, 1])], gpu_profile())
    assert reasons_of(result) == ["node n1 has 0 free h100-80g GPUs of 2, needs 1"]


def test_the_gpus_given_are_the_lowest_free_indices():
    taken = replica("r1", "other", on="n1", gpus=(0, 2))
    result = place([gpu_node("n1", gpus=8)], gpu_profile(tp=2), replicas=[taken])
    assert result.shards[0].gpu_indices == (1, 3)


def test_memory_refusal_reads_has_gb_with_gb_free_needs():
    held = replica("r1", "other", on="n1", gpus=(), memory_gb=50)
    result = place([cpu_node("n1", memory_gb=64)], cpu_profile(memory_gb=16), replicas=[held])
    assert reasons_of(result) == ["node n1 has 64 GB of memory with 14 GB free, needs 16"]


def test_memory_exactly_enough_is_enough():
    held = replica("r1", "other", on="n1", gpus=(), memory_gb=48)
    assert nodes_of(
        place([cpu_node("n1", memory_gb=64)], cpu_profile(memory_gb=16), replicas=[held])
    )


def test_cores_refusal_reads_has_8_cpus_with_2_free_needs_3():
    held = [replica(f"r{i}", "other", on="n1", gpus=(), memory_gb=1, cores=3) for i in range(2)]
    result = place([cpu_node("n1", cpus=8)], cpu_profile(memory_gb=1, cores=3), replicas=held)
    assert reasons_of(result) == ["node n1 has 8 CPUs with 2 free, needs 3"]


def test_cpu_cores_are_reserved_as_memory_is():
    inventory = Inventory({"n1": cpu_node("n1", cpus=8)}, [])
    p = cpu_profile(memory_gb=1, cores=3)
    for _ in range(2):
        placed = inventory.place([p])
        assert isinstance(placed, Placement)
        assert placed.shards[0].cpu_cores == 3
        inventory.reserve("m", placed)
    # Six of eight given away: a third would need three.
    assert reasons_of(inventory.place([p])) == ["node n1 has 8 CPUs with 2 free, needs 3"]


def test_a_gpu_profile_reserves_no_cores_on_a_node_that_reports_cpus():
    result = place([gpu_node("n1", cpus=2)], gpu_profile(cpu_cores=16))
    assert result.shards[0].cpu_cores is None


def test_unknown_memory_constrains_nothing():
    result = place([cpu_node("n1", memory_gb=None)], cpu_profile(memory_gb=512))
    assert nodes_of(result) == ["n1"]


def test_unknown_cpus_constrain_nothing():
    result = place([cpu_node("n1", cpus=None)], cpu_profile(cores=64))
    assert nodes_of(result) == ["n1"]


def test_zero_memory_or_cpus_is_unknown_not_a_full_node():
    result = place([cpu_node("n1", memory_gb=0, cpus=0)], cpu_profile(memory_gb=8, cores=2))
    assert nodes_of(result) == ["n1"]


def test_a_profile_that_declares_no_memory_fits_a_full_node():
    held = replica("r1", "other", on="n1", gpus=(), memory_gb=64)
    assert nodes_of(place([cpu_node("n1")], cpu_profile(memory_gb=None), replicas=[held]))


def test_disk_refusal_reads_has_gb_of_disk_free_needs():
    result = place([gpu_node("n1", disk_free_gb=20)], gpu_profile(min_disk_gb=40))
    assert reasons_of(result) == ["node n1 has 20 GB of disk free, needs 40"]


def test_a_node_holding_the_weights_needs_no_disk_for_them():
    n1 = gpu_node("n1", disk_free_gb=1, weights=["org/llama"])
    assert nodes_of(place([n1], gpu_profile(min_disk_gb=40), source="org/llama")) == ["n1"]


def test_unknown_disk_constrains_nothing():
    assert nodes_of(place([gpu_node("n1", disk_free_gb=None)], gpu_profile(min_disk_gb=40)))


def test_replicas_that_no_longer_hold_room_free_it():
    for state in ("stopped", "failed"):
        gone = replica("r1", "other", on="n1", gpus=range(8), state=state)
        assert nodes_of(place([gpu_node("n1")], gpu_profile(), replicas=[gone])) == ["n1"]


@pytest.mark.parametrize("state", ["pending", "starting", "ready", "draining", "stopping"])
def test_replicas_that_hold_room_keep_it(state):
    held = replica("r1", "other", on="n1", gpus=range(8), state=state)
    assert reasons_of(place([gpu_node("n1")], gpu_profile(), replicas=[held]))


# Order among eligible nodes


def test_a_gpu_profile_packs_onto_the_fullest_node():
    nodes = [gpu_node("n1"), gpu_node("n2"), gpu_node("n3")]
    held = [
        replica("a", "other", on="n2", gpus=range(5)),
        replica("b", "other", on="n3", gpus=range(2)),
    ]
    assert nodes_of(place(nodes, gpu_profile(), replicas=held)) == ["n2"]


def test_packing_skips_a_node_too_full_for_the_profile():
    nodes = [gpu_node("n1"), gpu_node("n2")]
    held = [replica("a", "other", on="n1", gpus=range(7))]
    assert nodes_of(place(nodes, gpu_profile(tp=2), replicas=held)) == ["n2"]


def test_cpu_replicas_spread_over_nodes():
    nodes = [cpu_node("n1"), cpu_node("n2"), cpu_node("n3")]
    held = [
        replica("a", "other", on="n1", gpus=(), memory_gb=1),
        replica("b", "other", on="n1", gpus=(), memory_gb=1),
        replica("c", "other", on="n2", gpus=(), memory_gb=1),
    ]
    assert nodes_of(place(nodes, cpu_profile(), replicas=held)) == ["n3"]


def test_weights_holding_nodes_come_first():
    nodes = [
        gpu_node("n1"),
        gpu_node("n2", weights=["org/llama"]),
    ]
    # n1 is fuller and would win the packing; the weights on n2 win first.
    held = [replica("a", "other", on="n1", gpus=range(6))]
    result = place(nodes, gpu_profile(), replicas=held, source="org/llama")
    assert nodes_of(result) == ["n2"]


def test_weights_holding_nodes_come_first_for_cpu_profiles_too():
    nodes = [cpu_node("n1"), cpu_node("n2", weights=["/m/q4.gguf"])]
    held = [replica("a", "other", on="n2", gpus=(), memory_gb=1)]
    assert nodes_of(place(nodes, cpu_profile(), replicas=held, source="/m/q4.gguf")) == ["n2"]


def test_ties_go_to_the_lowest_node_id_whatever_the_order_given():
    nodes = [gpu_node("n3"), gpu_node("n1"), gpu_node("n2")]
    assert nodes_of(place(nodes, gpu_profile())) == ["n1"]


def test_profiles_are_tried_in_the_order_given():
    nodes = [gpu_node("n1"), cpu_node("c1")]
    assert place(nodes, cpu_profile("cpu"), gpu_profile("gpu")).profile.name == "cpu"
    assert place(nodes, gpu_profile("gpu"), cpu_profile("cpu")).profile.name == "gpu"


def test_a_later_profile_is_used_when_the_first_does_not_fit():
    result = place([cpu_node("c1")], gpu_profile("gpu"), cpu_profile("cpu"))
    assert result.profile.name == "cpu"


# Several nodes


def test_multi_node_profile_needs_one_fabric():
    p = gpu_profile(tp=16, nodes=2)
    split = [gpu_node("a1", fabric="ib-a"), gpu_node("b1", fabric="ib-b")]
    result = place(split, p)
    assert reasons_of(result)[-1] == (
        f"no {FABRIC_LABEL} group has 2 eligible nodes (the largest has 1)"
    )
    joined = [*split, gpu_node("b2", fabric="ib-b")]
    result = place(joined, p)
    assert sorted(nodes_of(result)) == ["b1", "b2"]
    assert [len(s.gpu_indices) for s in result.shards] == [8, 8]
    assert [s.rank for s in result.shards] == [0, 1]


def test_nodes_without_a_fabric_label_never_host_a_multi_node_replica():
    result = place([gpu_node("n1"), gpu_node("n2")], gpu_profile(tp=2, nodes=2))
    assert reasons_of(result) == [
        f"no {FABRIC_LABEL} group has 2 eligible nodes (the largest has 0)"
    ]


def test_an_ineligible_node_does_not_count_toward_its_fabric():
    nodes = [gpu_node("a1", fabric="ib"), gpu_node("a2", fabric="ib", cordoned=True)]
    result = place(nodes, gpu_profile(tp=2, nodes=2))
    assert reasons_of(result) == [
        "node a2 is cordoned",
        f"no {FABRIC_LABEL} group has 2 eligible nodes (the largest has 1)",
    ]


# Explanations


def test_the_explanation_names_each_node_and_its_figures():
    nodes = [
        gpu_node("n1", gpus=8, engines={"vllm"}),
        gpu_node("n2", gpu_class="a100-80g", engines={"vllm"}),
        cpu_node("c1", memory_gb=8),
    ]
    held = [replica("a", "other", on="n1", gpus=range(7))]
    result = place(nodes, gpu_profile("tp2", tp=2), cpu_profile("cpu", memory_gb=16), replicas=held)
    assert result.as_explanation() == [
        {
            "profile": "tp2",
            "reasons": [
                "node n1 has 1 free h100-80g GPUs of 8, needs 2",
                "node n2 has no h100-80g GPUs",
                "node c1 has no h100-80g GPUs",
            ],
            "summary": "n1 has 1 free h100-80g GPUs of 8, needs 2; 2 other nodes have no h100-80g GPUs",
        },
        {
            "profile": "cpu",
            "reasons": [
                "node n1 has no llamacpp engine installed",
                "node n2 has no llamacpp engine installed",
                "node c1 has 8 GB of memory with 8 GB free, needs 16",
            ],
            "summary": "c1 has 8 GB of memory with 8 GB free, needs 16; "
            "2 other nodes have no llamacpp engine installed",
        },
    ]
    assert result.summary() == (
        "profile tp2: n1 has 1 free h100-80g GPUs of 8, needs 2; 2 other nodes have no "
        "h100-80g GPUs. profile cpu: c1 has 8 GB of memory with 8 GB free, needs 16; "
        "2 other nodes have no llamacpp engine installed"
    )


def test_an_empty_fleet_says_there_are_no_nodes():
    assert reasons_of(place([], gpu_profile())) == ["there are no nodes"]


def test_a_long_explanation_is_cut_and_says_how_many_more():
    nodes = [gpu_node(f"n{i:03}", cordoned=True) for i in range(MAX_REASONS_PER_PROFILE + 5)]
    reasons = reasons_of(place(nodes, gpu_profile()))
    assert len(reasons) == MAX_REASONS_PER_PROFILE + 1
    assert reasons[-1] == "and 5 more nodes"


# The inventory within one pass


def test_placing_one_after_another_sees_what_the_previous_took():
    inventory = Inventory({"n1": gpu_node("n1", gpus=4)}, [])
    given = []
    for _ in range(2):
        placed = inventory.place([gpu_profile(tp=2)])
        inventory.reserve("m", placed)
        given.append(placed.shards[0].gpu_indices)
    assert given == [(0, 1), (2, 3)]
    assert reasons_of(inventory.place([gpu_profile(tp=2)])) == [
        "node n1 has 0 free h100-80g GPUs of 4, needs 2"
    ]


def test_each_shard_on_a_node_gets_its_own_port():
    held = replica("a", "other", on="n1", gpus=(0,))  # on port 20000
    inventory = Inventory({"n1": gpu_node("n1")}, [held])
    first = inventory.place([gpu_profile()])
    inventory.reserve("m", first)
    second = inventory.place([gpu_profile()])
    assert (first.shards[0].http_port, second.shards[0].http_port) == (20001, 20002)


def test_the_inventory_knows_which_nodes_run_a_model():
    held = [replica("a", "chat", on="n1"), replica("b", "chat", on="n2", state="failed")]
    inventory = Inventory({"n1": gpu_node("n1"), "n2": gpu_node("n2")}, held)
    assert inventory.model_nodes["chat"] == {"n1"}
