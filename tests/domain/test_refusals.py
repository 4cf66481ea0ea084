"""The one line that says why a model cannot be placed names what binds (issue 37, 2).

The nodes that came closest (short of room with the right GPU class and engine,
fewest missing; then those able to run it but taking nothing now) are named in
placement's own words; every other refused node is counted once, by what refused it.
"""

import pytest
from hypothesis import given, settings, strategies as st

from fleet.domain.placement import Refusal
from fleet.domain.refusals import MAX_NAMED, binding, one_line

from .builders import cpu_node, cpu_profile, gpu_node, gpu_profile, inventory, place, replica


def summary_of(nodes, *profiles, held=()) -> str:
    result = place(nodes, *profiles, replicas=held)
    assert isinstance(result, Refusal), result
    return result.summary()


def test_the_issues_cluster_names_the_full_node_and_the_draining_one_not_the_cpu_node():
    # cpu-1 is judged first, and was all the old line said; the binding reasons are
    # gpu-a's GPUs and gpu-b's drain.
    nodes = [
        cpu_node("cpu-1"),
        gpu_node("gpu-a", gpus=8),
        gpu_node("gpu-b", gpus=8, draining=True, cordoned=True),
    ]
    full = [replica("big", "other", on="gpu-a", gpus=range(8))]
    assert summary_of(nodes, gpu_profile(tp=4), held=full) == (
        "gpu-a has 0 free h100-80g GPUs of 8, needs 4; gpu-b is draining; "
        "1 other node has no h100-80g GPUs"
    )


@pytest.mark.parametrize(
    ("nodes", "profile", "held", "said"),
    [
        # Fewest missing first: n2 lacks 1 GPU, n1 lacks 3.
        (
            [gpu_node("n1", gpus=4), gpu_node("n2", gpus=4)],
            gpu_profile(tp=4),
            [replica("a", "x", on="n1", gpus=range(3)), replica("b", "x", on="n2", gpus=(0,))],
            "n2 has 3 free h100-80g GPUs of 4, needs 4; n1 has 1 free h100-80g GPUs of 4, needs 4",
        ),
        # Short of room comes before unavailable, whatever the names' order.
        (
            [gpu_node("a", cordoned=True), gpu_node("b")],
            gpu_profile(tp=8),
            [replica("r", "x", on="b", gpus=(0,))],
            "b has 7 free h100-80g GPUs of 8, needs 8; a is cordoned",
        ),
        # A draining node that could never run it is counted, not named.
        (
            [cpu_node("c1", draining=True), gpu_node("g1")],
            gpu_profile(tp=8),
            [replica("r", "x", on="g1", gpus=(0, 1))],
            "g1 has 6 free h100-80g GPUs of 8, needs 8; 1 other node is draining",
        ),
        # No node came close: the first of the rest speaks, the others are counted.
        (
            [cpu_node("c1"), cpu_node("c2"), gpu_node("a1", gpu_class="a100-80g")],
            gpu_profile(),
            [],
            "a1 has no h100-80g GPUs; 2 other nodes have no h100-80g GPUs",
        ),
        # Memory short on a CPU node, engines missing elsewhere.
        (
            [cpu_node("c1", memory_gb=8), gpu_node("g1", engines={"vllm"})],
            cpu_profile(memory_gb=16),
            [],
            "c1 has 8 GB of memory with 8 GB free, needs 16; "
            "1 other node has no llamacpp engine installed",
        ),
        # A label that no node carries, on every node.
        (
            [gpu_node("g1"), gpu_node("g2")],
            gpu_profile(node_selector={"zone": "eu"}),
            [],
            "g1 lacks the label zone=eu; 1 other node lacks the label zone=eu",
        ),
        # An empty fleet.
        ([], gpu_profile(), [], "there are no nodes"),
    ],
)
def test_the_line_names_the_closest_and_counts_the_rest(nodes, profile, held, said):
    assert summary_of(nodes, profile, held=held) == said


def test_at_most_three_are_named_and_the_rest_counted_by_what_refused_them():
    nodes = [gpu_node(f"g{i}", gpus=2) for i in range(5)] + [cpu_node("c1")]
    held = [replica(f"r{i}", "x", on=f"g{i}", gpus=(0, 1)) for i in range(5)]
    said = summary_of(nodes, gpu_profile(tp=2), held=held)
    assert said == (
        "g0 has 0 free h100-80g GPUs of 2, needs 2; g1 has 0 free h100-80g GPUs of 2, "
        "needs 2; g2 has 0 free h100-80g GPUs of 2, needs 2; 2 other nodes have too few "
        "free h100-80g GPUs; 1 other node has no h100-80g GPUs"
    )


def test_every_node_is_counted_even_past_the_explanations_cut():
    nodes = [gpu_node(f"n{i:03}", cordoned=True) for i in range(40)]
    result = place(nodes, gpu_profile())
    assert result.summary() == (
        "n000 is cordoned; n001 is cordoned; n002 is cordoned; 37 other nodes are cordoned"
    )


def test_a_sentence_about_all_the_nodes_comes_first():
    nodes = [
        gpu_node("a1", fabric="ib-a"),
        gpu_node("b1", fabric="ib-b"),
        gpu_node("c1", fabric="ib-c", cordoned=True),
    ]
    said = summary_of(nodes, gpu_profile(tp=16, nodes=2))
    assert said == (
        "no llmgw.io/fabric group has 2 eligible nodes (the largest has 1); c1 is cordoned"
    )


def test_several_profiles_are_each_said_by_name():
    nodes = [cpu_node("c1", memory_gb=8)]
    said = summary_of(nodes, gpu_profile("tp1"), cpu_profile("cpu", memory_gb=16))
    assert said == (
        "profile tp1: c1 has no h100-80g GPUs. "
        "profile cpu: c1 has 8 GB of memory with 8 GB free, needs 16"
    )


@pytest.mark.parametrize(
    ("explanation", "line"),
    [
        # Stored before summaries: its first reason.
        ([{"profile": "gpu", "reasons": ["node n1 is cordoned"]}], "node n1 is cordoned"),
        # A wait says itself.
        (
            [{"profile": "", "reasons": ["waiting for room being freed by a-1"]}],
            "waiting for room being freed by a-1",
        ),
        # What preemption could not take is left to the explanation.
        (
            [
                {"profile": "gpu", "reasons": ["node n1 is cordoned"], "summary": "n1 is cordoned"},
                {
                    "profile": "preemption",
                    "reasons": ["no node could run it even if it were empty"],
                },
            ],
            "n1 is cordoned",
        ),
        ([], ""),
    ],
)
def test_one_line_of_a_stored_explanation(explanation, line):
    assert one_line(explanation) == line


# Random clusters: the line is never empty when a node refused, and each is counted once.


@st.composite
def clusters(draw):
    nodes, held = [], []
    for i in range(draw(st.integers(0, 12))):
        kind = draw(st.sampled_from(["gpu", "gpu", "a100", "cpu"]))
        flags = {
            "draining": draw(st.booleans()),
            "cordoned": draw(st.booleans()),
            "state": draw(st.sampled_from(["ready", "ready", "ready", "unreachable"])),
        }
        if kind == "cpu":
            nodes.append(cpu_node(f"n{i}", **flags))
            continue
        gpus = draw(st.integers(1, 8))
        cls = "a100-80g" if kind == "a100" else "h100-80g"
        nodes.append(gpu_node(f"n{i}", gpus=gpus, gpu_class=cls, **flags))
        used = draw(st.integers(0, gpus))
        if used:
            held.append(replica(f"r{i}", "x", on=f"n{i}", gpus=range(used)))
    tp = draw(st.sampled_from([1, 2, 4, 8]))
    return nodes, held, gpu_profile(tp=tp)


@settings(max_examples=200, deadline=None)
@given(clusters())
def test_every_refused_node_is_counted_exactly_once_and_the_line_is_never_empty(cluster):
    nodes, held, profile = cluster
    inv = inventory(nodes, held)
    result = inv.place([profile])
    if not isinstance(result, Refusal):
        return
    # At most 12 nodes: the explanation's reasons are every refusal, uncut.
    [(_, refused)] = result.reasons
    said = binding(refused)
    named = [r.node for r in said.named]
    assert len(set(named)) == len(named) <= MAX_NAMED
    assert len(named) + sum(n for _, n in said.counted) == len(nodes)
    assert said.text
    assert result.summary()
    # The closest are named: none counted came closer than the last one named.
    if said.named:
        last = said.named[-1].closeness()
        assert all(r.closeness() >= last for r in refused if r.node not in named)
