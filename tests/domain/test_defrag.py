"""Defragmentation across NVLink domains (docs/fabric.md, Defragmentation): decide()
scenarios, the dry run, and properties of what a plan may do."""

from dataclasses import replace

import pytest
from hypothesis import given, settings, strategies as st

from fleet.domain.defrag import MAX_MOVES, defrag_dry_run
from fleet.domain.refusals import one_line
from fleet.domain.types import NodeView
from llmgw.core.config import SettingError, load
from tenancy.quota import Policy, Quota, Resources

from .builders import NOW, TIMINGS, Cluster, gpu_node, gpu_profile, model, replica, run, snapshot

GB200 = "gb200"
A, B = "a1b2c3d4e5f60718293a4b5c6d7e8f90", "ffeeddccbbaa00998877665544332211"
ON = replace(TIMINGS, defrag=True)


def tray(node_id: str, domain: tuple[str, int], *, imex: bool | None = True) -> NodeView:
    """An NVL72 compute tray: four GB200 GPUs in `domain`, IMEX up unless said."""
    node = gpu_node(node_id, gpus=4, gpu_class=GB200)
    return replace(node, gpus=tuple(replace(g, domain=domain) for g in node.gpus), imex=imex)


def big(**kw):
    """A replica over four whole trays."""
    return model("big", gpu_profile("wide", gpu_class=GB200, tp=16, nodes=4), **kw)


def small(name: str = "small", min: int = 2, **kw):
    return model(name, gpu_profile("one", gpu_class=GB200), min=min, **kw)


TRAYS = [tray(f"a{i}", (A, 1)) for i in range(4)] + [tray(f"b{i}", (B, 1)) for i in range(4)]
# One small replica on a tray of each domain: neither has four trays free.
SPLIT = [
    replica("small-a", "small", on="a0", gpus=(0,), profile="one"),
    replica("small-b", "small", on="b0", gpus=(0,), profile="one"),
]


def fragmented(**kw):
    return snapshot(TRAYS, [big(), small()], SPLIT, **kw)


def defrag_entry(state):
    return next(e for e in state.explanation if e["profile"] == "defragmentation")


def test_off_the_plan_is_said_not_done():
    plan = run(fragmented())
    assert [s.model for s in plan.starts] == []
    assert plan.retires == [] and plan.stops == [] and plan.drains == []
    state = plan.states["big"]
    assert state.unplaceable
    (said,) = defrag_entry(state)["reasons"]
    assert said == (
        f"moving small-a of small from a0 to b1 would free 4 trays of domain {A} clique 1 "
        "for big (LLMGW_DEFRAG is off: said, not done)"
    )
    assert any(e.kind == "defrag" and said in e for e in plan.events)
    # The one line still says what placement says, not the plan.
    assert "moving" not in one_line(state.explanation)


def test_off_the_plan_is_said_once():
    c = Cluster(fragmented())
    c.step()
    c.wait(5)
    again = c.step()
    assert not [e for e in again.events if e.kind in ("defrag", "unplaceable")]
    assert defrag_entry(c.state("big"))


def test_on_the_replacement_starts_first_and_the_old_one_retires():
    plan = run(fragmented(), timings=ON)
    (start,) = plan.starts
    assert start.model == "small" and [n for n, _ in start.shards] == [f"{start.replica_id}-0"]
    assert [s.node_id for _, s in start.shards] == ["b1"]
    (retire,) = plan.retires
    assert retire.replica_id == "small-a" and retire.deadline is None
    assert plan.stops == [] and plan.drains == []
    state = plan.states["big"]
    assert not state.unplaceable
    assert sorted(r.node_id for r in state.reserved) == ["a0", "a1", "a2", "a3"]
    assert state.explanation[0]["reasons"] == ["waiting for room being freed by small-a"]


def test_on_the_big_replica_is_placed_once_the_moved_one_stopped():
    c = Cluster(fragmented(), timings=ON)
    (start,) = c.step().starts
    c.wait(5)
    assert not c.step().starts  # waiting: the replacement is not ready yet
    c.report(start.replica_id, "ready")
    c.wait(5)
    plan = c.step()
    assert [s.replica_id for s in plan.stops] == ["small-a"]
    c.all_stopped()
    c.wait(5)
    plan = c.step()
    placed = [s for s in plan.starts if s.model == "big"]
    assert placed and sorted(s.node_id for _, s in placed[0].shards) == ["a0", "a1", "a2", "a3"]


def test_a_replica_of_a_higher_class_is_not_moved():
    snap = snapshot(TRAYS, [big(), small(capacity_class="critical")], SPLIT)
    plan = run(snap, timings=ON)
    assert plan.starts == [] and plan.retires == []
    reasons = defrag_entry(plan.states["big"])["reasons"]
    assert reasons[0] == f"domain {A} clique 1: only 3 trays could be freed; the replica needs 4"


def test_a_young_replica_is_not_moved():
    young = [replace(r, ready_at=NOW) for r in SPLIT]
    plan = run(snapshot(TRAYS, [big(), small()], young), timings=ON)
    assert plan.starts == [] and plan.retires == []


def test_no_room_elsewhere_no_move():
    full = [
        replica(f"other-{n}", "other", on=n, gpus=(0, 1, 2, 3), profile="four")
        for n in ("b1", "b2", "b3")
    ]
    rest = replica("other-b0", "other", on="b0", gpus=(1, 2, 3), profile="four")
    other = model("other", gpu_profile("four", gpu_class=GB200, tp=4), min=4)
    snap = snapshot(TRAYS, [big(), small(), other], [*SPLIT, *full, rest])
    plan = run(snap, timings=ON)
    assert plan.retires == [] and plan.starts == []
    reasons = defrag_entry(plan.states["big"])["reasons"]
    assert (
        f"domain {A} clique 1: no room outside it for a replacement of small-a of small" in reasons
    )


def test_a_model_with_no_profile_over_several_trays_has_nothing_said():
    snap = snapshot(TRAYS[:1], [model("one", gpu_profile(gpu_class=GB200, tp=8))])
    plan = run(snap, timings=ON)
    state = plan.states["one"]
    assert state.unplaceable
    assert all(e["profile"] != "defragmentation" for e in state.explanation)


def test_the_dry_run_names_the_moves_and_changes_nothing():
    snap = fragmented()
    out = defrag_dry_run(big(), snap, NOW, TIMINGS)
    assert out["moves"] == [{"replica": "small-a", "model": "small", "from": ["a0"], "to": ["b1"]}]
    assert out["domain"] == f"domain {A} clique 1" and out["done"] is False
    assert out["summary"].startswith("moving small-a of small from a0 to b1")


@pytest.mark.parametrize(("raw", "doing"), [(None, False), ("on", True), ("off", False)])
def test_llmgw_defrag_is_off_unless_turned_on(tmp_path, raw, doing):
    env = {"LLMGW_HOME": str(tmp_path / "home")} | ({"LLMGW_DEFRAG": raw} if raw else {})
    assert load(env).timings.defrag is doing


def test_a_bad_llmgw_defrag_is_named(tmp_path):
    with pytest.raises(SettingError, match="LLMGW_DEFRAG must be 1 or 0"):
        load({"LLMGW_HOME": str(tmp_path / "home"), "LLMGW_DEFRAG": "maybe"})


# Properties: a defragmentation never leaves a model below its minimum, never stops
# anything, and moves exactly the replicas it names.

placed = st.lists(
    st.tuples(st.integers(0, 7), st.integers(1, 2), st.sampled_from(["s1", "s2"])),
    max_size=10,
)


@settings(max_examples=60, deadline=None)
@given(placed, st.integers(1, 3))
def test_a_defragmentation_moves_what_it_names_and_keeps_every_minimum(spots, min_):
    free = {n.id: 4 for n in TRAYS}
    replicas = []
    for i, (t, size, name) in enumerate(spots):
        node = TRAYS[t].id
        if free[node] < size:
            continue
        first = 4 - free[node]
        gpus = range(first, first + size)
        replicas.append(replica(f"{name}-{i}", name, on=node, gpus=gpus, profile=f"g{size}"))
        free[node] -= size
    profiles = (gpu_profile("g1", gpu_class=GB200), gpu_profile("g2", gpu_class=GB200, tp=2))
    models = [big()] + [model(n, *profiles, min=min_, max=10) for n in ("s1", "s2")]
    snap = snapshot(TRAYS, models, replicas)
    said, done = run(snap), run(snap, timings=ON)
    # Off, nothing is done that the steps did not do; on, the same and the moves.
    assert done.starts[: len(said.starts)] == said.starts
    moved = done.starts[len(said.starts) :]
    retired = {r.replica_id for r in done.retires} - {r.replica_id for r in said.retires}
    assert len(moved) == len(retired) <= MAX_MOVES
    assert all(s.model != "big" for s in moved)
    assert done.stops == said.stops and done.drains == said.drains
    if retired:
        (line,) = defrag_entry(done.states["big"])["reasons"]
        assert line.count(" from ") == len(retired)
        assert all(f"{rid} of " in line for rid in retired)
    for name in ("s1", "s2"):
        # Each moved replica's replacement starts as it retires: it runs as many.
        leaving = sum(1 for r in replicas if r.id in retired and r.model == name)
        assert leaving == sum(1 for s in moved if s.model == name)
    # A replacement never lands on a tray it leaves.
    trays = {r.nodes for r in replicas if r.id in retired}
    assert not {p.node_id for s in moved for _, p in s.shards} & set().union(*trays)


def test_the_domain_needing_fewest_moves_is_freed():
    two_on_a = [*SPLIT, replica("small-c", "small", on="a1", gpus=(0,), profile="one")]
    snap = snapshot(TRAYS, [big(), small(min=3)], two_on_a)
    (said,) = defrag_entry(run(snap).states["big"])["reasons"]
    assert said.startswith("moving small-b of small from b0 to ")
    assert f"free 4 trays of domain {B} clique 1" in said


def test_a_replica_over_several_trays_is_not_moved():
    wide = replica("pair-1", "pair", on=["a0", "b0"], gpus=(0,), profile="two")
    pair = model("pair", gpu_profile("two", gpu_class=GB200, tp=2, nodes=2))
    plan = run(snapshot(TRAYS, [big(), pair], [wide]), timings=ON)
    assert plan.retires == []
    reasons = defrag_entry(plan.states["big"])["reasons"]
    assert reasons[0] == f"domain {A} clique 1: only 3 trays could be freed; the replica needs 4"


def test_a_replica_already_retiring_counts_as_leaving():
    leaving = [replace(SPLIT[0], retiring=True), SPLIT[1]]
    plan = run(snapshot(TRAYS, [big(), small(min=1)], leaving), timings=ON)
    # small-b is its replacement: defragmentation moves nothing more and
    # keeps the trays for big while small-a leaves.
    assert plan.retires == []
    state = plan.states["big"]
    assert state.explanation[0]["reasons"] == ["waiting for room being freed by small-a"]
    assert sorted(r.node_id for r in state.reserved) == ["a0", "a1", "a2", "a3"]
    (kept,) = [r for r in state.reserved if r.node_id == "a0"]
    assert kept.victims == ("small-a",)


def test_a_replacement_past_its_owners_limit_is_no_move():
    limited = policy(Quota("team:ml", limit=Resources(gpus=2)))
    snap = replace(snapshot(TRAYS, [big(), small(owner="team:ml")], SPLIT), policy=limited)
    plan = run(snap, timings=ON)
    assert plan.retires == []
    reasons = defrag_entry(plan.states["big"])["reasons"]
    assert any("a replacement of small-a of small would pass a limit" in r for r in reasons)


def policy(*quotas: Quota) -> Policy:
    return Policy.build(quotas, {})
