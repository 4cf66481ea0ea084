"""One reconciler pass, and several in a row, on a fake clock (domain.md, The reconciler)."""

from dataclasses import replace
from datetime import timedelta

import pytest

from fleet.domain.housekeeping import SETTLING
from fleet.domain.plan import duration
from fleet.domain.reconcile import desired_replicas
from fleet.domain.types import Failure, ModelState
from llmgw.core.config import Timings

from .builders import (
    NOW,
    TIMINGS,
    Cluster,
    ago,
    at,
    cpu_node,
    cpu_profile,
    gpu_node,
    gpu_profile,
    model,
    replica,
    run,
    snapshot,
)


def started(plan):
    """Each start as (replica id, profile, nodes, GPU indices per shard)."""
    return [
        (
            s.replica_id,
            s.profile.name,
            [p.node_id for _, p in s.shards],
            [p.gpu_indices for _, p in s.shards],
        )
        for s in plan.starts
    ]


def started_on(plan):
    return [[p.node_id for _, p in s.shards] for s in plan.starts]


def stopped(plan):
    return [s.replica_id for s in plan.stops]


# Node liveness


@pytest.mark.parametrize(
    ("silent_s", "state"),
    [(14, "ready"), (15, "unreachable"), (59, "unreachable"), (60, "lost"), (3600, "lost")],
)
def test_a_node_silent_for_15s_is_unreachable_and_for_60s_lost(silent_s, state):
    plan = run(snapshot([gpu_node("n1")], heard={"n1": ago(silent_s)}))
    changes = [(c.node_id, c.state) for c in plan.node_changes]
    assert changes == ([] if state == "ready" else [("n1", state)])


def test_a_node_change_says_how_long_nothing_was_heard():
    plan = run(snapshot([gpu_node("n1")], heard={"n1": ago(75)}))
    assert plan.node_changes[0].reason == "nothing heard for 1m15s"
    assert plan.events == ["node n1 is lost: nothing heard for 1m15s"]


def test_an_unreachable_node_is_not_marked_again():
    plan = run(snapshot([gpu_node("n1", state="unreachable")], heard={"n1": ago(30)}))
    assert plan.node_changes == []


def test_the_timings_are_settings():
    quick = Timings(unreachable=5, lost=10)
    plan = run(snapshot([gpu_node("n1")], heard={"n1": ago(10)}), timings=quick)
    assert [c.state for c in plan.node_changes] == ["lost"]


def test_silence_is_counted_from_the_control_plane_restart_at_the_earliest():
    node, heard = gpu_node("n1"), {"n1": ago(3600)}
    assert run(snapshot([node], silence_floor=ago(10), heard=heard)).node_changes == []
    plan = run(snapshot([node], silence_floor=ago(20), heard=heard))
    assert [c.state for c in plan.node_changes] == ["unreachable"]


def test_an_unreachable_node_keeps_its_replicas_and_their_room():
    snap = snapshot(
        [gpu_node("n1"), gpu_node("n2")],
        [model("chat")],
        [replica("a", "chat", on="n1")],
        heard={"n1": ago(20)},
    )
    plan = run(snap)
    assert plan.forgets == [] and plan.stops == [] and plan.starts == []


def test_a_lost_node_frees_its_replicas_without_counting_a_failure():
    snap = snapshot(
        [gpu_node("n1"), gpu_node("n2")],
        [model("chat")],
        [replica("a", "chat", on="n1")],
        heard={"n1": ago(60)},
    )
    plan = run(snap)
    assert [(f.replica_id, f.reason) for f in plan.forgets] == [("a", "node n1 was lost")]
    assert plan.stops == []  # nothing left to stop: its only node is gone
    assert started_on(plan) == [["n2"]]  # replaced in the same pass
    state = plan.states["chat"]
    assert (state.failures, state.backoff_until, state.parked_since) == (0, None, None)
    assert "replica a of chat lost with node n1" in plan.events


def test_a_replica_on_a_node_the_fleet_no_longer_knows_is_lost_with_it():
    snap = snapshot([gpu_node("n2")], [model("chat")], [replica("a", "chat", on="gone")])
    plan = run(snap)
    assert [f.reason for f in plan.forgets] == ["node gone was lost"]
    assert started_on(plan) == [["n2"]]


def test_a_multi_node_replica_losing_one_node_stops_its_other_shards_at_once():
    p = gpu_profile(tp=2, nodes=2)
    snap = snapshot(
        [gpu_node("a1", fabric="ib"), gpu_node("a2", fabric="ib")],
        [model("train", p)],
        [replica("t", "train", on=("a1", "a2"))],
        heard={"a1": ago(61)},
    )
    plan = run(snap)
    assert [(s.replica_id, s.grace_s, s.reason) for s in plan.stops] == [
        ("t", 0, "node a1 was lost")
    ]
    assert [f.replica_id for f in plan.forgets] == ["t"]
    assert plan.states["train"].failures == 0


# Failures, backoff and parking


def test_a_node_drain_with_no_room_for_a_replacement_ends_after_the_drain_grace():
    on_a = replica("r", "chat", on="n1", gpus=(0, 1, 2, 3, 4, 5, 6, 7))
    draining = gpu_node("n1", draining=True, cordoned=True)
    plan = run(snapshot([draining], [model("chat")], [on_a]))
    [retire] = plan.retires
    assert (retire.replica_id, retire.deadline) == ("r", at(300))
    assert plan.stops == []  # nowhere to put a replacement: it keeps serving for now
    later = replace(on_a, retiring=True, drain_deadline=at(300))
    heard = {"n1": at(299)}
    assert run(snapshot([draining], [model("chat")], [later], heard=heard), now=at(299)).stops == []
    [stop] = run(snapshot([draining], [model("chat")], [later], heard=heard), now=at(300)).stops
    assert stop.replica_id == "r" and "no room for a replacement" in stop.reason


def test_a_replica_still_stopping_past_its_grace_is_asked_to_stop_again():
    snap = snapshot(
        [gpu_node("n1")],
        [model("chat", min=0)],
        [
            replica("old", "chat", on="n1", gpus=(0,), state="stopping", state_since=ago(61)),
            replica("new", "chat", on="n1", gpus=(1,), state="stopping", state_since=ago(59)),
        ],
    )
    plan = run(snap)
    assert [s.replica_id for s in plan.stops] == ["old"]


def test_one_failed_shard_of_a_multi_node_replica_stops_the_others_before_its_room_is_free():
    failed = replica(
        "mn", "chat", on=("n1", "n2"), gpus=(0, 1), state="failed", reason="rank 1 died"
    )
    failed = replace(failed, shards=(failed.shards[0], replace(failed.shards[1], state="failed")))
    snap = snapshot([gpu_node("n1"), gpu_node("n2")], [model("chat", min=0)], [failed])
    plan = run(snap)
    assert [s.replica_id for s in plan.stops] == ["mn"]
    assert plan.forgets == []
    assert plan.states["chat"].failures == 1


def test_a_slow_start_is_not_timed_out_while_agents_are_still_reporting_after_a_restart():
    slow = replica("s", "chat", on="n1", gpus=(0,), state="starting", created=ago(3600))
    plan = run(snapshot([gpu_node("n1")], [model("chat")], [slow], settling=True))
    assert plan.stops == []
    # Once settled, the time counts from the restart, not from before it.
    plan = run(snapshot([gpu_node("n1")], [model("chat")], [slow], silence_floor=ago(60)))
    assert plan.stops == []


def test_a_failed_replica_is_forgotten_counts_a_failure_and_backs_off_10s():
    snap = snapshot(
        [gpu_node("n1")],
        [model("chat")],
        [replica("a", "chat", state="failed", reason="exit code 1")],
    )
    plan = run(snap)
    assert [(f.replica_id, f.reason) for f in plan.forgets] == [("a", "exit code 1")]
    state = plan.states["chat"]
    assert (state.failures, state.last_failure_at, state.backoff_until) == (1, NOW, at(10))
    assert plan.starts == []
    assert state.explanation == (
        {
            "profile": "",
            "reasons": [f"backing off after 1 failures; next try at {at(10):%H:%M:%S} UTC"],
        },
    )


def test_a_failure_keeps_what_the_engine_said_with_the_model():
    said = Failure("a", "n1", 1, "The engine exited with code 1.\nerror: no such file m.gguf")
    snap = replace(
        snapshot(
            [gpu_node("n1")],
            [model("chat")],
            [replica("a", "chat", state="failed", reason="shard a-0 on node n1 failed")],
        ),
        failures={"a": said},
    )
    state = run(snap).states["chat"]
    assert state.last_failure == replace(said, at=NOW)
    assert state.last_failure.summary == "error: no such file m.gguf"


def test_a_failure_the_agent_said_nothing_of_keeps_its_reason():
    snap = snapshot(
        [gpu_node("n1")], [model("chat")], [replica("a", "chat", state="failed", reason="gone")]
    )
    assert run(snap).states["chat"].last_failure == Failure("a", "n1", None, "gone", NOW)


def test_the_last_failure_is_the_latest_and_goes_once_a_replica_is_ready():
    older = Failure("a", "n1", 1, "first", ago(100))
    state = ModelState("chat", failures=1, last_failure_at=ago(100), last_failure=older)
    snap = snapshot(
        [gpu_node("n1")],
        [model("chat", min=2)],
        [replica("b", "chat", state="failed", reason="second")],
        [state],
    )
    assert run(snap).states["chat"].last_failure == Failure("b", "n1", None, "second", NOW)
    ready = snapshot(
        [gpu_node("n1")], [model("chat")], [replica("c", "chat", ready_at=ago(10))], [state]
    )
    after = run(ready).states["chat"]
    assert (after.failures, after.last_failure) == (0, None)


def test_once_the_backoff_has_passed_it_tries_again():
    state = ModelState("chat", failures=1, last_failure_at=ago(10), backoff_until=NOW)
    plan = run(snapshot([gpu_node("n1")], [model("chat")], states=[state]))
    assert started_on(plan) == [["n1"]]
    assert plan.states["chat"].failures == 1  # until a replica reaches ready


@pytest.mark.parametrize(
    ("failures_before", "backoff_s"),
    [(0, 10), (1, 20), (2, 40), (3, 80), (4, 160), (5, 300), (6, 300), (20, 300)],
)
def test_backoff_doubles_from_10s_to_at_most_5m(failures_before, backoff_s):
    never_park = Timings(park_after=100)
    state = ModelState("chat", failures=failures_before, last_failure_at=ago(1000))
    snap = snapshot(
        [gpu_node("n1")], [model("chat")], [replica("a", "chat", state="failed")], [state]
    )
    after = run(snap, timings=never_park).states["chat"]
    assert after.backoff_until - NOW == timedelta(seconds=backoff_s)


def test_five_failures_in_a_row_park_the_model():
    c = Cluster(snapshot([gpu_node("n1")], [model("chat")]))
    for attempt in range(1, 6):
        plan = c.step()
        [(replica_id, *_)] = started(plan)
        c.report(replica_id, "failed", reason=f"exit code {attempt}")
        plan = c.step()
        assert plan.starts == []
        assert c.state("chat").failures == attempt
        c.wait((c.state("chat").backoff_until - c.now).total_seconds())
    state = c.state("chat")
    assert state.parked_since == c.now - timedelta(seconds=160)
    assert state.parked_reason == "exit code 5"
    parked = [e for e in plan.events if e.kind == "park"]
    assert parked == [
        "model chat parked after 5 failures in a row: exit code 5; llmgw ctl retry chat to try again"
    ]
    c.wait(3600)
    plan = c.step()
    assert plan.starts == []
    assert c.state("chat").explanation == (
        {
            "profile": "",
            "reasons": [
                "parked after 5 failures in a row: exit code 5; llmgw ctl retry to try again"
            ],
        },
    )


def test_a_parked_model_keeps_its_first_reason_through_later_failures():
    state = ModelState("chat", failures=5, parked_since=ago(100), parked_reason="out of memory")
    snap = snapshot(
        [gpu_node("n1")],
        [model("chat", min=2)],
        [replica("b", "chat", state="failed", reason="exit code 9")],
        [state],
    )
    after = run(snap).states["chat"]
    assert (after.parked_since, after.parked_reason) == (ago(100), "out of memory")


def test_a_replica_that_passes_its_startup_timeout_is_stopped_and_counts_a_failure():
    m = model("chat", gpu_profile(startup_timeout_s=120))
    snap = snapshot(
        [gpu_node("n1")], [m], [replica("a", "chat", state="starting", created=ago(121))]
    )
    plan = run(snap)
    assert [(s.replica_id, s.grace_s, s.reason) for s in plan.stops] == [
        ("a", 0, "replica a did not become ready within 2m0s")
    ]
    state = plan.states["chat"]
    assert (state.failures, state.backoff_until) == (1, at(10))
    assert state.last_failure == Failure(
        "a", "n1", None, "replica a did not become ready within 2m0s", NOW
    )
    assert plan.starts == []  # backing off, and the stopping one still holds its room


def test_a_replica_within_its_startup_timeout_is_left_to_start():
    m = model("chat", gpu_profile(startup_timeout_s=120))
    snap = snapshot(
        [gpu_node("n1")], [m], [replica("a", "chat", state="pending", created=ago(120))]
    )
    plan = run(snap)
    assert plan.empty
    assert plan.states["chat"].failures == 0


def test_a_replica_reaching_ready_clears_the_count():
    state = ModelState("chat", failures=3, last_failure_at=ago(100), backoff_until=ago(90))
    snap = snapshot(
        [gpu_node("n1")], [model("chat")], [replica("a", "chat", ready_at=ago(10))], [state]
    )
    after = run(snap).states["chat"]
    assert (after.failures, after.backoff_until) == (0, None)


def test_a_replica_ready_since_before_the_failures_does_not_clear_them():
    state = ModelState("chat", failures=3, last_failure_at=ago(100), backoff_until=at(60))
    snap = snapshot(
        [gpu_node("n1"), gpu_node("n2")],
        [model("chat", min=2)],
        [replica("a", "chat", ready_at=ago(1000))],
        [state],
    )
    assert run(snap).states["chat"].failures == 3


def test_a_failure_not_counted_against_the_model_backs_nothing_off():
    snap = snapshot(
        [gpu_node("n1")],
        [model("chat")],
        [replica("a", "chat", state="failed", counts_as_failure=False)],
    )
    plan = run(snap)
    assert plan.states["chat"].failures == 0
    assert started_on(plan) == [["n1"]]


# How many are wanted


@pytest.mark.parametrize(
    ("lo", "hi", "extra", "wanted"),
    [(1, 1, 0, 1), (2, 5, 0, 2), (2, 5, 2, 4), (2, 5, 9, 5), (0, 0, 0, 0)],
)
def test_desired_is_min_plus_what_load_added_at_most_max(lo, hi, extra, wanted):
    m = model("chat", min=lo, max=hi)
    assert desired_replicas(m, ModelState("chat", extra=extra), NOW) == wanted


@pytest.mark.parametrize(
    ("asked", "wanted"), [(ago(1), 1), (ago(599), 1), (ago(600), 0), (None, 0)]
)
def test_on_demand_model_wants_one_while_asked_for(asked, wanted):
    m = model("chat", min=0, max=3, idle_timeout_s=600)
    state = ModelState("chat", last_requested_at=asked)
    assert desired_replicas(m, state, NOW) == wanted
    plan = run(snapshot([gpu_node("n1")], [m], states=[state]))
    assert len(plan.starts) == wanted
    assert plan.states["chat"].desired == wanted


def test_an_on_demand_replica_unused_past_its_idle_timeout_stops():
    m = model("chat", min=0, max=1, idle_timeout_s=600)
    state = ModelState("chat", last_requested_at=ago(601))
    snap = snapshot([gpu_node("n1")], [m], [replica("a", "chat", last_used_at=ago(601))], [state])
    plan = run(snap)
    assert [(s.replica_id, s.reason) for s in plan.stops] == [
        ("a", "replica a idle past its idle timeout")
    ]
    assert plan.drains == []


def test_an_on_demand_replica_its_engine_reports_busy_is_not_stopped():
    # Asked for long ago, but a request is still running on it: it is in use, not idle.
    m = model("chat", min=0, max=1, idle_timeout_s=600)
    state = ModelState("chat", last_requested_at=ago(900))
    snap = snapshot([gpu_node("n1")], [m], [replica("a", "chat", last_used_at=ago(5))], [state])
    plan = run(snap)
    assert plan.stops == [] and plan.drains == []
    assert plan.states["chat"].desired == 1


def test_pending_starting_and_ready_replicas_count_toward_desired():
    snap = snapshot(
        [gpu_node(f"n{i}") for i in range(4)],
        [model("chat", min=3)],
        [
            replica("a", "chat", on="n0", state="pending", created=ago(10)),
            replica("b", "chat", on="n1", state="starting", created=ago(10)),
            replica("c", "chat", on="n2", state="ready"),
        ],
    )
    assert run(snap).empty


def test_a_draining_replica_holds_its_room_but_does_not_count():
    snap = snapshot(
        [gpu_node("n1", gpus=1), gpu_node("n2", gpus=1)],
        [model("chat")],
        [replica("a", "chat", on="n1", state="draining", drain_deadline=at(60))],
    )
    plan = run(snap)
    assert started_on(plan) == [["n2"]]


# Too few


def test_the_missing_replicas_are_placed_and_the_desired_count_recorded():
    snap = snapshot([gpu_node("n1"), gpu_node("n2")], [model("chat", min=2)])
    plan = run(snap)
    assert started(plan) == [
        ("chat-1", "gpu", ["n1"], [(0,)]),
        ("chat-2", "gpu", ["n2"], [(0,)]),
    ]
    assert [s.reason for s in plan.starts] == ["placed on n1", "placed on n2"]
    assert "replica chat-1 of chat placed on n1 (gpu)" in plan.events
    assert plan.states["chat"].desired == 2


def test_a_models_replicas_go_to_nodes_that_do_not_run_it_yet():
    # Packing alone would put the second beside the first on the fuller n1.
    snap = snapshot(
        [gpu_node("n1"), gpu_node("n2")],
        [model("chat", min=2)],
        [replica("a", "chat", on="n1")],
    )
    assert started_on(run(snap)) == [["n2"]]


def test_a_model_shares_a_node_with_itself_when_that_is_the_only_obstacle():
    snap = snapshot([gpu_node("n1")], [model("chat", min=3)], [replica("a", "chat", on="n1")])
    plan = run(snap)
    assert started(plan) == [
        ("chat-1", "gpu", ["n1"], [(1,)]),
        ("chat-2", "gpu", ["n1"], [(2,)]),
    ]


def test_placing_several_replicas_in_one_pass_sees_what_the_previous_took():
    snap = snapshot([gpu_node("n1", gpus=8)], [model("chat", gpu_profile(tp=4), min=3)])
    plan = run(snap)
    assert [gpus for *_, gpus in started(plan)] == [[(0, 1, 2, 3)], [(4, 5, 6, 7)]]
    state = plan.states["chat"]
    assert state.unplaceable
    assert state.explanation == (
        {
            "profile": "gpu",
            "reasons": ["node n1 has 0 free h100-80g GPUs of 8, needs 4"],
            "summary": "n1 has 0 free h100-80g GPUs of 8, needs 4",
        },
    )


def test_two_models_in_one_pass_do_not_share_a_gpu():
    snap = snapshot(
        [gpu_node("n1", gpus=8)],
        [model("alpha", gpu_profile(tp=8)), model("beta", gpu_profile(tp=8))],
    )
    plan = run(snap)
    assert [s.model for s in plan.starts] == ["alpha"]
    assert plan.states["beta"].unplaceable


def test_reserved_cores_bound_how_many_cpu_replicas_fit():
    m = model("coder", cpu_profile(memory_gb=6, cores=3), min=3)
    plan = run(snapshot([cpu_node("c1", cpus=8, memory_gb=64)], [m]))
    assert [[p.cpu_cores for _, p in s.shards] for s in plan.starts] == [[3], [3]]
    assert plan.states["coder"].explanation == (
        {
            "profile": "cpu",
            "reasons": ["node c1 has 8 CPUs with 2 free, needs 3"],
            "summary": "c1 has 8 CPUs with 2 free, needs 3",
        },
    )


def test_higher_class_models_are_placed_first():
    snap = snapshot(
        [gpu_node("n1", gpus=8)],
        [
            model("alpha", gpu_profile(tp=8)),
            model("zeta", gpu_profile(tp=8), capacity_class="critical"),
        ],
    )
    assert [s.model for s in run(snap).starts] == ["zeta"]


def test_an_on_demand_model_without_a_class_waits_behind_a_standard_one():
    snap = snapshot(
        [gpu_node("n1", gpus=8)],
        [model("alpha", gpu_profile(tp=8), min=0, max=1), model("zeta", gpu_profile(tp=8))],
        states=[ModelState("alpha", last_requested_at=ago(1))],
    )
    assert [s.model for s in run(snap).starts] == ["zeta"]


def test_within_a_class_models_are_placed_by_name():
    snap = snapshot(
        [gpu_node("n1", gpus=8)],
        [model("beta", gpu_profile(tp=8)), model("alpha", gpu_profile(tp=8))],
    )
    assert [s.model for s in run(snap).starts] == ["alpha"]


def test_a_higher_priority_profile_is_tried_first_and_equals_keep_catalog_order():
    m = model(
        "chat",
        gpu_profile("first"),
        gpu_profile("second"),
        gpu_profile("preferred", priority=5),
    )
    assert started(run(snapshot([gpu_node("n1")], [m])))[0][1] == "preferred"
    m = model("chat", gpu_profile("first"), gpu_profile("second"))
    assert started(run(snapshot([gpu_node("n1")], [m])))[0][1] == "first"


def test_a_model_with_no_room_is_unplaceable_and_says_why_once():
    c = Cluster(snapshot([gpu_node("n1", gpus=4)], [model("chat", gpu_profile(tp=8))]))
    plan = c.step()
    why = "node n1 has 4 free h100-80g GPUs of 4, needs 8"
    assert plan.starts == []
    assert c.state("chat").unplaceable
    assert c.state("chat").explanation == (
        {"profile": "gpu", "reasons": [why], "summary": why.removeprefix("node ")},
        {"profile": "preemption", "reasons": ["no node could run chat even if it were empty"]},
    )
    assert plan.events == ["model chat cannot be placed: n1 has 4 free h100-80g GPUs of 4, needs 8"]
    c.wait(5)
    assert c.step().events == []  # still unplaceable: not said again every pass
    # A different reason is said again: a smaller node now stands in the way.
    c.change(nodes={"n1": gpu_node("n1", gpus=2)})
    plan = c.step()
    assert [e.kind for e in plan.events] == ["unplaceable"]
    assert "n1 has 2 free h100-80g GPUs of 2, needs 8" in plan.events[0]


def test_a_model_that_finds_room_is_no_longer_unplaceable():
    c = Cluster(snapshot([gpu_node("n1", gpus=4)], [model("chat", gpu_profile(tp=8))]))
    c.step()
    c.change(nodes={**c.snap.nodes, "n2": gpu_node("n2", gpus=8)})
    plan = c.step()
    assert started_on(plan) == [["n2"]]
    assert (c.state("chat").unplaceable, c.state("chat").explanation) == (False, ())


def test_nothing_is_placed_while_settling():
    snap = snapshot([gpu_node("n1")], [model("chat")], settling=True)
    plan = run(snap)
    assert plan.starts == []
    assert plan.states["chat"].explanation == ({"profile": "", "reasons": [SETTLING]},)
    assert not plan.states["chat"].unplaceable
    assert started_on(run(replace(snap, settling=False))) == [["n1"]]


def test_replicas_known_before_a_restart_count_while_settling_so_nothing_runs_twice():
    snap = snapshot(
        [gpu_node("n1")],
        [model("chat")],
        [replica("a", "chat", on="n1")],
        settling=True,
    )
    plan = run(replace(snap, settling=False))
    assert plan.empty


# Too many


def test_scale_down_drains_the_newest():
    snap = snapshot(
        [gpu_node(f"n{i}") for i in range(3)],
        [model("chat", min=1)],
        [
            replica("old", "chat", on="n0", created=ago(3000)),
            replica("mid", "chat", on="n1", created=ago(2000)),
            replica("new", "chat", on="n2", created=ago(1000)),
        ],
    )
    plan = run(snap)
    assert [(d.replica_id, d.deadline) for d in plan.drains] == [("new", at(300)), ("mid", at(300))]
    assert plan.drains[0].reason == "replica new drains: chat scaled down to 1"
    assert plan.stops == []


def test_scaling_down_stops_a_replica_that_is_not_ready_yet_instead_of_draining_it():
    snap = snapshot(
        [gpu_node("n0"), gpu_node("n1")],
        [model("chat", min=1)],
        [
            replica("old", "chat", on="n0", created=ago(3000)),
            replica("new", "chat", on="n1", state="starting", created=ago(10)),
        ],
    )
    plan = run(snap)
    assert [(s.replica_id, s.reason) for s in plan.stops] == [("new", "replica new scaled down")]
    assert plan.drains == []


def test_a_drained_replica_stops_after_5_minutes():
    c = Cluster(
        snapshot(
            [gpu_node("n0"), gpu_node("n1")],
            [model("chat", min=2)],
            [
                replica("old", "chat", on="n0", created=ago(3000)),
                replica("new", "chat", on="n1", created=ago(1000)),
            ],
        )
    )
    c.change(models={"chat": model("chat", min=1)})
    assert [d.replica_id for d in c.step().drains] == ["new"]
    c.wait(299)
    assert c.step().empty
    c.wait(1)
    plan = c.step()
    assert stopped(plan) == ["new"]
    assert plan.stops[0].reason == "stopping drained replica new: no replacement after 5m0s"


def test_a_removed_models_replicas_stop():
    snap = snapshot(
        [gpu_node("n1")],
        [model("kept")],
        [
            replica("k", "kept", on="n1", gpus=(0,)),
            replica("a", "gone", on="n1", gpus=(1,)),
            replica("b", "gone", on="n1", gpus=(2,), state="draining"),
            replica("c", "gone", on="n1", gpus=(3,), state="stopping", state_since=ago(5)),
        ],
    )
    plan = run(snap)
    assert [(s.replica_id, s.grace_s, s.reason) for s in plan.stops] == [
        ("a", 30, "model gone was removed"),
        ("b", 30, "model gone was removed"),
    ]
    assert "gone" not in plan.states


def test_a_stopped_replica_is_forgotten():
    snap = snapshot([gpu_node("n1")], [model("chat")], [replica("a", "chat", state="stopped")])
    plan = run(snap)
    assert [(f.replica_id, f.reason) for f in plan.forgets] == [("a", "stopped")]
    assert plan.states["chat"].failures == 0


# Restarts and draining nodes


def test_restart_retires_one_replica_at_a_time_replacement_first():
    c = Cluster(
        snapshot(
            [gpu_node("n1"), gpu_node("n2"), gpu_node("n3")],
            [model("chat", min=2)],
            [
                replica("a", "chat", on="n1", created=ago(3600)),
                replica("b", "chat", on="n2", created=ago(1800)),
            ],
        )
    )
    c.set_state("chat", restart_requested_at=NOW)
    c.wait(1)

    plan = c.step()  # the oldest retires, and its replacement is placed beside it
    assert [(r.replica_id, r.reason) for r in plan.retires] == [("a", "restarting")]
    assert started_on(plan) == [["n3"]]
    assert plan.stops == [] and plan.drains == []

    c.wait(5)
    c.report("chat-1", "starting")
    assert c.step().empty  # the old one serves until the new one is ready

    c.wait(5)
    c.report("chat-1", "ready")
    plan = c.step()
    assert stopped(plan) == ["a"]
    assert plan.retires == []  # b waits until a is gone

    c.wait(5)
    assert c.step().empty
    c.all_stopped()
    c.wait(5)
    plan = c.step()
    assert [r.replica_id for r in plan.retires] == ["b"]
    assert started_on(plan) == [["n1"]]

    c.wait(5)
    c.report("chat-2", "ready")
    assert stopped(c.step()) == ["b"]
    c.all_stopped()
    c.wait(5)
    plan = c.step()
    assert "model chat restarted" in plan.events
    assert c.state("chat").restart_requested_at is None
    assert sorted(c.ids()) == ["chat-1", "chat-2"]


def test_a_restart_with_no_room_for_a_replacement_stops_the_old_one_first_and_says_so():
    c = Cluster(
        snapshot([gpu_node("n1")], [model("chat", gpu_profile(tp=8))], [replica("a", "chat")])
    )
    c.set_state("chat", restart_requested_at=NOW)
    c.wait(1)
    plan = c.step()
    assert [r.replica_id for r in plan.retires] == ["a"]
    assert plan.starts == []
    (stop,) = plan.stops
    assert stop.replica_id == "a"
    assert stop.reason.startswith(
        "replica a of chat stops before its replacement starts: no room for both ("
    )
    assert stop.reason.endswith("the replacement is placed into the room it frees")
    assert stop.reason in plan.events

    c.wait(5)
    assert c.step().stops == []  # stopping: nothing more is stopped for it
    c.all_stopped()
    c.wait(5)
    assert started_on(c.step()) == [["n1"]]


def test_a_draining_node_moves_its_replicas_replacement_first():
    c = Cluster(
        snapshot(
            [gpu_node("n1", draining=True), gpu_node("n2")],
            [model("chat")],
            [replica("a", "chat", on="n1")],
        )
    )
    plan = c.step()
    assert [(r.replica_id, r.reason) for r in plan.retires] == [("a", "its node n1 is draining")]
    assert started_on(plan) == [["n2"]]
    assert plan.stops == []
    c.wait(5)
    c.report("chat-1", "ready")
    plan = c.step()
    assert stopped(plan) == ["a"]
    assert plan.retires == []


def test_a_replica_on_a_draining_node_that_is_not_ready_yet_stops_at_once():
    snap = snapshot(
        [gpu_node("n1", draining=True), gpu_node("n2")],
        [model("chat")],
        [replica("a", "chat", on="n1", state="starting", created=ago(5))],
    )
    plan = run(snap)
    assert [(s.replica_id, s.reason) for s in plan.stops] == [
        ("a", "replica a retired before it was ready")
    ]
    assert started_on(plan) == [["n2"]]


def test_a_changed_profile_restarts_nothing_by_itself():
    m = model("chat", gpu_profile(args=("--max-model-len", "8192")))
    outdated = replace(replica("a", "chat"), profile_fp=gpu_profile().fingerprint())
    assert outdated.profile_fp != m.profiles[0].fingerprint()
    plan = run(snapshot([gpu_node("n1"), gpu_node("n2")], [m], [outdated]))
    assert plan.empty


# Small things the sentences rely on


@pytest.mark.parametrize(
    ("seconds", "text"), [(0, "0s"), (10, "10s"), (60, "1m0s"), (300, "5m0s"), (3723, "1h2m3s")]
)
def test_durations_are_written_as_the_seed_writes_them(seconds, text):
    assert duration(seconds) == text


@pytest.mark.parametrize(
    ("node", "shown"),
    [
        (gpu_node("n", state="lost", draining=True, cordoned=True), "lost"),
        (gpu_node("n", state="unreachable", cordoned=True), "unreachable"),
        (gpu_node("n", draining=True, cordoned=True), "draining"),
        (gpu_node("n", cordoned=True), "cordoned"),
        (gpu_node("n"), "ready"),
    ],
)
def test_lost_and_unreachable_show_first_then_draining_then_cordoned(node, shown):
    assert node.shown_state == shown


def test_the_default_timings_are_the_spec_figures():
    t = TIMINGS
    assert (t.unreachable, t.lost, t.settle) == (15, 60, 30)
    assert (t.backoff_base, t.backoff_max, t.park_after) == (10, 300, 5)
    assert (t.drain_grace, t.preempt_grace) == (300, 30)
