"""GPUs that something else holds are never given out (issue 12, item 7).

Two kinds of holder: an engine the agent adopted after a restart (the control
plane keeps or adopts its shard, so its replica holds the GPU like any other),
and a process llmgw did not start at all, which the agent reports per GPU as
`unknown_processes` and placement sees as `GpuView.held`.
"""

from collections import defaultdict

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from fleet.domain.placement import Inventory
from fleet.domain.types import HOLDING, GpuView

from .builders import (
    Cluster,
    gpu_node,
    gpu_profile,
    model,
    place,
    reasons_of,
    replica,
    snapshot,
)


@pytest.mark.parametrize(
    ("gpus", "held", "unhealthy", "tp", "given"),
    [
        (2, [0], [], 1, (1,)),
        (4, [1, 2], [], 2, (0, 3)),
        (4, [0], [1], 2, (2, 3)),
        (4, [], [], 4, (0, 1, 2, 3)),
    ],
)
def test_a_held_gpu_is_not_given_out(gpus, held, unhealthy, tp, given):
    node = gpu_node("n1", gpus=gpus, held=held, unhealthy=unhealthy)
    assert place([node], gpu_profile(tp=tp)).shards[0].gpu_indices == given


@pytest.mark.parametrize(
    ("gpus", "held", "unhealthy", "tp", "sentence"),
    [
        (1, [0], [], 1, "node n1 has 0 free h100-80g GPUs of 1, needs 1 (1 held by other processes)"),
        (4, [0, 1], [2], 2, "node n1 has 1 free h100-80g GPUs of 4, needs 2 (2 held by other processes)"),
        (2, [], [0], 2, "node n1 has 1 free h100-80g GPUs of 2, needs 2"),
    ],
)  # fmt: skip
def test_a_node_whose_gpus_are_held_is_refused_saying_so(gpus, held, unhealthy, tp, sentence):
    node = gpu_node("n1", gpus=gpus, held=held, unhealthy=unhealthy)
    assert reasons_of(place([node], gpu_profile(tp=tp))) == [sentence]


def test_a_gpu_an_adopted_engine_holds_is_not_given_out():
    # The restarted agent reported the engine it adopted; its replica holds GPU 0 as before.
    adopted = replica("adopted-1", "chat", on="n1", gpus=(0,))
    result = place([gpu_node("n1", gpus=2)], gpu_profile(), replicas=[adopted])
    assert result.shards[0].gpu_indices == (1,)
    result = place([gpu_node("n1", gpus=1)], gpu_profile(), replicas=[adopted])
    assert reasons_of(result) == ["node n1 has 0 free h100-80g GPUs of 1, needs 1"]


def test_a_held_gpu_stays_held_when_the_replica_on_it_is_given_back():
    # Preemption's trial gives victims' GPUs back: one held meanwhile is not freed by that.
    victim = replica("v1", "low", on="n1", gpus=(0, 1))
    inv = Inventory({"n1": gpu_node("n1", gpus=2, held=[1])}, [victim])
    trial = inv.trial(["n1"], release=[victim])
    assert trial.rooms["n1"].free_gpus == {"h100-80g": [0]}


def test_a_node_with_only_held_gpus_could_not_run_the_profile_even_empty():
    from fleet.domain.placement import could_ever_run

    assert not could_ever_run(gpu_node("n1", gpus=2, held=[0, 1]), gpu_profile())
    assert could_ever_run(gpu_node("n1", gpus=2, held=[0]), gpu_profile())


def test_held_is_placement_only_a_held_gpu_is_still_one_the_node_has():
    view = GpuView(0, "h100-80g", held=True)
    assert view.healthy and not view.free_to_place
    assert gpu_node("n1", gpus=2, held=[0]).gpu_totals == {"h100-80g": 2}


# The property: pass after pass, nothing is placed on a GPU held by an adopted engine (a
# replica that holds room) or by a process llmgw does not know.


@st.composite
def fleets(draw):
    nodes, adopted = [], []
    for i in range(draw(st.integers(1, 3))):
        count = draw(st.integers(1, 8))
        held = draw(st.sets(st.integers(0, count - 1), max_size=count))
        nodes.append(gpu_node(f"n{i}", gpus=count, held=held))
        free = [g for g in range(count) if g not in held]
        if free and draw(st.booleans()):
            taken = draw(st.lists(st.sampled_from(free), min_size=1, max_size=2, unique=True))
            adopted.append(replica(f"adopted-{i}", "adopted", on=f"n{i}", gpus=sorted(taken)))
    return nodes, adopted


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(fleet=fleets(), data=st.data())
def test_no_placement_on_a_gpu_held_by_an_adopted_or_unknown_process(fleet, data):
    nodes, adopted = fleet
    models = [
        model(
            f"m{i}",
            gpu_profile(tp=data.draw(st.sampled_from([1, 1, 2, 4]), label=f"m{i} tp")),
            min=data.draw(st.integers(0, 4), label=f"m{i} min"),
            max=4,
        )
        for i in range(data.draw(st.integers(1, 3), label="models"))
    ]
    # The adopted engines' model is in the catalog, wanting exactly the replicas adopted.
    models.append(model("adopted", gpu_profile(), min=len(adopted), max=len(adopted)))
    held = {(n.id, g.index) for n in nodes for g in n.gpus if g.held}
    c = Cluster(snapshot(nodes, models, adopted))
    for _ in range(6):
        c.wait(5)
        plan = c.step()
        adopted_now = {
            (s.node_id, i)
            for r in c.snap.replicas
            if r.id.startswith("adopted-") and r.state in HOLDING
            for s in r.shards
            for i in s.gpu_indices
        }
        given = defaultdict(list)
        for start in plan.starts:
            for _, p in start.shards:
                for i in p.gpu_indices:
                    given[(p.node_id, i)].append(start.replica_id)
        assert not held & given.keys(), f"placed on held GPUs {sorted(held & given.keys())}"
        assert not adopted_now & given.keys(), (
            f"placed on GPUs adopted engines hold {sorted(adopted_now & given.keys())}"
        )
        for r in c.snap.replicas:
            if r.state == "pending":
                c.report(r.id, data.draw(st.sampled_from(["ready", "failed"]), label=r.id))
            elif r.state == "stopping":
                c.report(r.id, "stopped")
