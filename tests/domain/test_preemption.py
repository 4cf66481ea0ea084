"""Preemption, driven pass by pass: the seed's preemption_test.go and quotas_test.go, and a
scenario for each bullet of domain.md's "Preemption, beyond the seed"."""

from __future__ import annotations

from dataclasses import replace

from fleet.domain.capacity import preemption_dry_run
from fleet.domain.preemption import Context, preempt
from fleet.domain.reconcile import held_for
from fleet.domain.types import ModelState
from tenancy.quota import Policy, Quota, Resources

from .builders import (
    NOW,
    TIMINGS,
    Cluster,
    cpu_node,
    cpu_profile,
    gpu_node,
    gpu_profile,
    model,
    replica,
    run,
    snapshot,
)

TP8 = gpu_profile("tp8", tp=8)
PARENTS = {"team:ml": ("org:acme",), "team:web": ("org:acme",)}


def gpu_model(name, capacity_class="", min=1, **kw):
    """Runs on one whole 8-GPU node."""
    return model(name, kw.pop("profile", TP8), min=min, capacity_class=capacity_class, **kw)


def with_min(m, n):
    return replace(m, min_replicas=n, max_replicas=max(n, m.max_replicas if n else 1))


def settle(c: Cluster, passes: int) -> None:
    """Passes until nothing changes: what starts becomes ready, what stops is gone, and
    preempted replicas run out their grace between passes."""
    for _ in range(passes):
        c.step()
        for r in c.snap.replicas:
            if r.state in ("pending", "starting"):
                c.report(r.id, "ready")
        c.all_stopped()
        c.wait(TIMINGS.preempt_grace + 1)


def live(c: Cluster, name: str) -> int:
    return sum(
        1
        for r in c.snap.replicas
        if r.model == name and r.state in ("pending", "starting", "ready")
    )


def preempted_for(c: Cluster, name: str) -> list[str]:
    return sorted(r.model for r in c.snap.replicas if r.preempted_for == name)


def fill_then_want(want, have, *nodes, policy: Policy = Policy(), others=()) -> Cluster:
    """Place `have` (and `others`), age them past the minimum lifetime, then add `want`."""
    c = Cluster(snapshot(nodes, [have, *others, with_min(want, 0)]))
    c.change(policy=policy)
    settle(c, 3)
    assert live(c, have.name) == have.min_replicas, c.snap.replicas
    c.wait(TIMINGS.min_lifetime + 60)
    c.change(models={m.name: m for m in (have, *others, want)})
    return c


def quotas(*qs: Quota) -> Policy:
    return Policy.build(qs, PARENTS)


def gpus(n: int) -> Resources:
    return Resources(gpus=n)


# The seed's scenarios.


def test_a_critical_model_takes_a_standard_models_node():
    c = fill_then_want(gpu_model("vital", "critical"), gpu_model("chat"), gpu_node("1"))
    c.step()
    assert preempted_for(c, "vital") == ["chat"]
    (victim,) = [r for r in c.snap.replicas if r.preempted_for]
    assert victim.state == "draining"
    assert (victim.drain_deadline - c.now).total_seconds() == TIMINGS.preempt_grace
    chat = c.state("chat")
    assert (chat.held_for, chat.preempted) == ("vital", 1)
    settle(c, 4)
    assert live(c, "vital") == 1
    # Held until vital had its replica, then short again with no room: it never took the
    # node back, not even for a moment.
    assert live(c, "chat") == 0
    assert sum(1 for r in c.snap.replicas if r.model == "chat") == 0


def test_a_standard_model_does_not_take_anothers_minimum():
    c = fill_then_want(gpu_model("second"), gpu_model("first"), gpu_node("1"))
    settle(c, 3)
    assert (live(c, "first"), live(c, "second")) == (1, 0)
    assert c.state("second").unplaceable
    reasons = [r for e in c.state("second").explanation for r in e["reasons"]]
    assert any("is standard like second, and at its own minimum" in r for r in reasons)


def test_within_a_class_only_what_was_grown_into_is_taken():
    busy = replace(gpu_model("busy"), max_replicas=2)
    c = Cluster(snapshot([gpu_node("1"), gpu_node("2")], [busy, with_min(gpu_model("new"), 0)]))
    settle(c, 2)
    c.set_state("busy", extra=1)
    settle(c, 3)
    assert live(c, "busy") == 2
    c.wait(TIMINGS.min_lifetime + 60)
    c.change(models={"busy": busy, "new": gpu_model("new")})
    settle(c, 5)
    assert (live(c, "busy"), live(c, "new")) == (1, 1)


def test_nothing_is_stopped_that_would_not_make_room():
    # Two 5-GPU nodes, each half used by an opportunistic model; the critical one needs a
    # whole 8-GPU node, which neither is even when empty.
    half = model("half", gpu_profile("tp4", tp=4), min=2, capacity_class="opportunistic")
    c = fill_then_want(
        gpu_model("vital", "critical"), half, gpu_node("1", gpus=5), gpu_node("2", gpus=5)
    )
    c.step()
    assert [r for r in c.snap.replicas if r.preempted_for or r.state == "draining"] == []
    reasons = [r for e in c.state("vital").explanation for r in e["reasons"]]
    assert "no node could run vital even if it were empty" in reasons


def test_a_critical_minimum_is_never_taken():
    c = fill_then_want(
        gpu_model("also-vital", "critical"), gpu_model("vital", "critical"), gpu_node("1")
    )
    settle(c, 3)
    assert live(c, "vital") == 1


def test_a_replica_that_just_started_is_left_alone():
    c = Cluster(snapshot([gpu_node("1")], [gpu_model("chat"), with_min(gpu_model("vital"), 0)]))
    settle(c, 2)
    c.change(models={"chat": gpu_model("chat"), "vital": gpu_model("vital", "critical")})
    c.step()
    assert [r for r in c.snap.replicas if r.state == "draining"] == []
    reasons = [r for e in c.state("vital").explanation for r in e["reasons"]]
    assert any("is protected until" in r and "(ready 1 min)" in r for r in reasons), reasons


def test_a_hold_lasts_until_the_room_is_used_or_it_expires():
    c = fill_then_want(gpu_model("vital", "critical"), gpu_model("chat"), gpu_node("1"))
    c.step()
    assert c.state("chat").held_for == "vital"
    assert c.state("vital").held_for == ""
    settle(c, 3)
    assert live(c, "vital") == 1
    # Released as soon as the model it gave way to has what it asked for: chat is short
    # because there is no room, not because it is held.
    reasons = [r for e in c.state("chat").explanation for r in e["reasons"]]
    assert not any("gave room to" in r for r in reasons)
    # And whatever happens, after the hold: a hold for a model never placed ends on time.
    c.set_state("chat", held_until=c.now + _s(60), held_for="vital")
    c.change(models={**c.snap.models, "vital": with_min(gpu_model("vital", "critical"), 2)})
    c.step()
    assert any("gave room to vital" in r for e in c.state("chat").explanation for r in e["reasons"])
    c.wait(120)
    c.step()
    assert not any("gave room" in r for e in c.state("chat").explanation for r in e["reasons"])


def _s(seconds):
    from datetime import timedelta

    return timedelta(seconds=seconds)


def test_only_the_replicas_that_make_the_room_are_stopped():
    # Node 1 has 6 GPUs: the idle on-demand model sits there, first in line, but vital
    # needs 8, which only node 2 has once chat is gone.
    idle = model("idle", gpu_profile("tp4", tp=4), min=0, max=1)
    chat = model("chat", gpu_profile("tp6", tp=6))
    c = Cluster(snapshot([gpu_node("1", gpus=6), gpu_node("2")], [idle]))
    c.set_state("idle", last_requested_at=NOW)
    settle(c, 2)
    c.change(models={"idle": idle, "chat": chat})
    settle(c, 2)
    where = {r.model: r.shards[0].node_id for r in c.snap.replicas}
    assert where["chat"] == "2" and "idle" in where
    c.change(replicas=tuple(replace(r, last_used_at=c.now - _s(3600)) for r in c.snap.replicas))
    c.wait(TIMINGS.min_lifetime + 60)
    c.change(models={"idle": idle, "chat": chat, "vital": gpu_model("vital", "critical")})
    c.step()
    assert preempted_for(c, "vital") == ["chat"]


def test_of_two_that_would_each_make_room_the_smaller_is_stopped():
    node = cpu_node("a", cpus=8, memory_gb=31)
    big = model("big", cpu_profile(memory_gb=12, cores=4))
    small = model("small", cpu_profile(memory_gb=2, cores=1))
    vital = model("vital", cpu_profile(memory_gb=15, cores=4), capacity_class="critical")
    c = fill_then_want(vital, big, node, others=[small])
    c.step()
    assert preempted_for(c, "vital") == ["small"]


def test_a_tenant_within_its_guarantee_takes_back_what_another_borrowed():
    # web is guaranteed one node and borrowed the second; ml is guaranteed one node and
    # wants it. Same class, web at its minimum: by class alone nothing could be taken.
    web = gpu_model("web-chat", min=2, owner="team:web")
    ml = gpu_model("ml-train", owner="team:ml")
    policy = quotas(Quota("team:web", guarantee=gpus(8)), Quota("team:ml", guarantee=gpus(8)))
    c = fill_then_want(ml, web, gpu_node("1"), gpu_node("2"), policy=policy)
    settle(c, 5)
    assert (live(c, "ml-train"), live(c, "web-chat")) == (1, 1)
    assert c.state("web-chat").held_for == "ml-train"


def test_a_replica_within_its_guarantee_is_not_taken_by_a_higher_class_elsewhere():
    web = gpu_model("web-chat", owner="team:web")
    vital = gpu_model("vital", "critical", owner="team:ml")
    policy = quotas(Quota("team:web", guarantee=gpus(8)))
    c = fill_then_want(vital, web, gpu_node("1"), policy=policy)
    settle(c, 3)
    assert (live(c, "web-chat"), live(c, "vital")) == (1, 0)
    reasons = [r for e in c.state("vital").explanation for r in e["reasons"]]
    assert any("is within team:web's guarantee" in r for r in reasons)
    # Without the guarantee, critical takes it: the guarantee was the reason.
    c2 = fill_then_want(vital, web, gpu_node("1"))
    settle(c2, 3)
    assert live(c2, "vital") == 1


def test_a_limit_stops_a_model_before_it_starts():
    web = gpu_model("web-chat", min=2, owner="team:web")
    policy = quotas(Quota("org:acme", limit=gpus(8)))
    c = Cluster(snapshot([gpu_node("1"), gpu_node("2")], [web]))
    c.change(policy=policy)
    settle(c, 4)
    assert live(c, "web-chat") == 1
    state = c.state("web-chat")
    assert state.unplaceable
    assert state.explanation == (
        {"profile": "tp8", "reasons": ["org:acme is at its capacity limit (16 GPUs of 8)"]},
    )


# Beyond the seed: one scenario per bullet.


def test_only_candidates_on_nodes_the_model_could_use_are_considered():
    # A100 node holds an old opportunistic replica; vital needs H100s: stopping it is no use,
    # so it is neither stopped nor counted against the three-victim budget.
    a100 = gpu_node("a", gpu_class="a100-80g")
    old = model("old", gpu_profile("a", gpu_class="a100-80g", tp=8), capacity_class="opportunistic")
    chat = gpu_model("chat", "opportunistic")
    c = fill_then_want(gpu_model("vital", "critical"), chat, gpu_node("h"), a100, others=[old])
    c.step()
    assert preempted_for(c, "vital") == ["chat"]


def test_victims_are_chosen_on_one_node_not_spread_over_several():
    # Each node has 4 of 8 GPUs taken by a small opportunistic replica: stopping one on each
    # node frees 8 GPUs in all but on no one node; stopping both on node 1 does.
    small = model("small", gpu_profile("tp4", tp=4), min=4, capacity_class="opportunistic")
    c = fill_then_want(gpu_model("vital", "critical"), small, gpu_node("1"), gpu_node("2"))
    c.step()
    victims = [r for r in c.snap.replicas if r.preempted_for == "vital"]
    assert len(victims) == 2
    assert len({r.shards[0].node_id for r in victims}) == 1


def test_a_model_whose_owner_would_pass_a_limit_gets_no_victims():
    chat = gpu_model("chat", "opportunistic")
    vital = gpu_model("vital", "critical", owner="team:ml")
    mine = gpu_model("ml-old", "critical", owner="team:ml")
    policy = quotas(Quota("team:ml", limit=gpus(8)))
    c = fill_then_want(vital, chat, gpu_node("1"), gpu_node("2"), policy=policy, others=[mine])
    c.step()
    assert [r for r in c.snap.replicas if r.preempted_for] == []
    reasons = [r for e in c.state("vital").explanation for r in e["reasons"]]
    assert "team:ml is at its capacity limit (16 GPUs of 8)" in reasons


def test_a_limit_counts_the_owners_own_victims_as_gone():
    # ml is limited to 8 GPUs and holds them with an opportunistic model; its critical model
    # may take that node, since its own victim's GPUs leave with it.
    low = gpu_model("ml-low", "opportunistic", owner="team:ml")
    vital = gpu_model("vital", "critical", owner="team:ml")
    policy = quotas(Quota("team:ml", limit=gpus(8)))
    c = fill_then_want(vital, low, gpu_node("1"), policy=policy)
    c.step()
    assert preempted_for(c, "vital") == ["ml-low"]


def test_a_team_whose_sibling_overuses_the_parent_takes_its_own_share_back():
    # acme is guaranteed two nodes, ml and web one each; web holds both. ml is not within
    # acme's guarantee until web's borrowed node is counted as gone: judged on the trial.
    web = gpu_model("web-chat", min=2, owner="team:web")
    ml = gpu_model("ml-train", owner="team:ml")
    policy = quotas(
        Quota("org:acme", guarantee=gpus(16)),
        Quota("team:web", guarantee=gpus(8)),
        Quota("team:ml", guarantee=gpus(8)),
    )
    c = fill_then_want(ml, web, gpu_node("1"), gpu_node("2"), policy=policy)
    settle(c, 5)
    assert (live(c, "ml-train"), live(c, "web-chat")) == (1, 1)


def test_what_no_guarantee_covers_is_on_loan_to_an_owner_within_its_own():
    # A shared standard model holds the node; ml is guaranteed a node and wants it for a
    # standard model at its minimum: the shared model's replica is on loan.
    shared = gpu_model("shared-chat")
    ml = gpu_model("ml-train", owner="team:ml")
    policy = quotas(Quota("team:ml", guarantee=gpus(8)))
    c = fill_then_want(ml, shared, gpu_node("1"), policy=policy)
    c.step()
    assert preempted_for(c, "ml-train") == ["shared-chat"]


def test_a_loan_is_never_a_critical_minimum():
    shared = gpu_model("shared-vital", "critical")
    ml = gpu_model("ml-train", owner="team:ml")
    policy = quotas(Quota("team:ml", guarantee=gpus(8)))
    c = fill_then_want(ml, shared, gpu_node("1"), policy=policy)
    settle(c, 3)
    assert live(c, "shared-vital") == 1


def test_of_a_borrowing_scope_its_lowest_class_newest_replicas_are_taken():
    # web (guarantee 8) holds a critical and a standard replica on 4-GPU slots of one node;
    # the standard one is what it borrows, and is taken back for ml.
    slot = gpu_profile("tp4", tp=4)
    web_vital = model("web-vital", slot, capacity_class="critical", owner="team:web")
    web_chat = model("web-chat", slot, owner="team:web")
    ml = model("ml-train", slot, owner="team:ml")
    policy = quotas(Quota("team:web", guarantee=gpus(4)), Quota("team:ml", guarantee=gpus(4)))
    c = fill_then_want(ml, web_chat, gpu_node("1"), policy=policy, others=[web_vital])
    c.step()
    assert preempted_for(c, "ml-train") == ["web-chat"]


def test_a_borrowing_preemptor_takes_only_from_owners_that_stay_at_their_guarantee():
    # ml has no guarantee: a critical model of ml borrows. web holds one node within its
    # guarantee of 8 plus a standard replica beyond it on node 2: only that one may go.
    web_a = gpu_model("web-a", owner="team:web")
    web_b = gpu_model("web-b", owner="team:web")
    vital = gpu_model("vital", "critical", owner="team:ml")
    policy = quotas(Quota("team:web", guarantee=gpus(8)))
    c = fill_then_want(vital, web_a, gpu_node("1"), gpu_node("2"), policy=policy, others=[web_b])
    c.step()
    assert len(preempted_for(c, "vital")) == 1
    assert c.state("vital").unplaceable is False


def test_among_borrowers_the_one_borrowing_most_gives_back_first():
    # Two shared-nothing teams with no guarantee borrow; ml (guarantee 4) wants a 4-GPU slot.
    # web borrows 8 GPUs, data 4: web's replica goes first though data's is older and smaller.
    slot = gpu_profile("tp4", tp=4)
    web = model("web-chat", slot, min=2, owner="team:web")
    data = model("data-etl", slot, owner="team:data")
    ml = model("ml-train", slot, owner="team:ml")
    policy = Policy.build(
        [Quota("team:ml", guarantee=gpus(4))],
        {"team:ml": ("org:acme",), "team:web": ("org:acme",), "team:data": ("org:acme",)},
    )
    c = fill_then_want(ml, data, gpu_node("1", gpus=12), policy=policy, others=[web])
    c.step()
    assert preempted_for(c, "ml-train") == ["web-chat"]


def test_inside_a_tier_a_lower_class_goes_first():
    slot = gpu_profile("tp4", tp=4)
    opp = model("opp", slot, min=1, max=2, capacity_class="opportunistic")
    std = model("std", slot, min=1, max=2)
    vital = model("vital", slot, capacity_class="critical")
    c = Cluster(snapshot([gpu_node("1")], [opp, std, with_min(vital, 0)]))
    settle(c, 2)
    c.set_state("opp", extra=0)
    c.wait(TIMINGS.min_lifetime + 60)
    c.change(models={"opp": opp, "std": std, "vital": vital})
    c.step()
    assert preempted_for(c, "vital") == ["opp"]


def test_room_in_flight_is_kept_for_the_model_it_was_freed_for():
    # vital takes chat's node; once chat's replica is gone, a standard model placed earlier
    # in the pass (by name) must not take the freed GPUs: they are vital's.
    c = fill_then_want(gpu_model("vital", "critical"), gpu_model("chat"), gpu_node("1"))
    c.step()
    assert preempted_for(c, "vital") == ["chat"]
    assert c.state("vital").reserved
    # Vital cannot start yet (say its engine is being installed: simulate with a hold on
    # placement by settling), and another model appears that would fit the freed node.
    c.wait(TIMINGS.preempt_grace + 1)
    c.step()  # the victim's grace is over: it stops
    c.all_stopped()
    greedy = gpu_model("aaa-greedy", "critical")
    c.change(models={**c.snap.models, "aaa-greedy": greedy})
    c.step()
    assert live(c, "vital") == 1
    assert live(c, "aaa-greedy") == 0


def test_a_model_waits_for_the_room_being_freed_rather_than_stopping_more():
    chat = replace(gpu_model("chat"), min_replicas=2, max_replicas=2)
    c = fill_then_want(gpu_model("vital", "critical"), chat, gpu_node("1"), gpu_node("2"))
    c.step()
    assert len(preempted_for(c, "vital")) == 1
    c.step()
    assert len(preempted_for(c, "vital")) == 1, "a second pass stopped more"
    reasons = [r for e in c.state("vital").explanation for r in e["reasons"]]
    assert any(r.startswith("waiting for room being freed by chat-") for r in reasons)


def test_within_a_class_a_model_within_its_guarantee_is_placed_before_a_borrower():
    # One node free; two standard models want it. "aaa" comes first by name but borrows;
    # "zzz"'s owner is within its guarantee: it is placed first.
    aaa = gpu_model("aaa", owner="team:web")
    zzz = gpu_model("zzz", owner="team:ml")
    c = Cluster(snapshot([gpu_node("1")], [aaa, zzz]))
    c.change(policy=quotas(Quota("team:ml", guarantee=gpus(8))))
    c.step()
    assert (live(c, "zzz"), live(c, "aaa")) == (1, 0)


def test_when_preemption_cannot_help_the_explanation_says_why():
    # A multi-node replica is in the way, and the rest would need four victims.
    slot = gpu_profile("tp2", tp=2)
    bits = model("bits", slot, min=4, capacity_class="opportunistic")
    c = fill_then_want(gpu_model("vital", "critical"), bits, gpu_node("1"))
    c.step()
    reasons = [r for e in c.state("vital").explanation for r in e["reasons"]]
    assert "would need 4 victims (at most 3)" in reasons
    assert [r for r in c.snap.replicas if r.preempted_for] == []


def test_a_multi_node_replica_in_the_way_is_named():
    train = model("train", gpu_profile("mn", tp=8, nodes=2), capacity_class="opportunistic")
    nodes = [gpu_node("1", fabric="ib"), gpu_node("2", fabric="ib")]
    c = fill_then_want(gpu_model("vital", "critical"), train, *nodes)
    c.step()
    reasons = [r for e in c.state("vital").explanation for r in e["reasons"]]
    assert any(r.startswith("blocked by multi-node replica train-") for r in reasons)


def test_the_dry_run_says_what_would_go_and_what_is_protected_and_changes_nothing():
    young = replica("young", "fresh", on="2", gpus=range(8), ready_at=NOW - _s(60))
    old = replica("old", "chat", on="1", gpus=range(8), ready_at=NOW - _s(3600))
    snap = snapshot(
        [gpu_node("1"), gpu_node("2")],
        [gpu_model("chat"), gpu_model("fresh"), gpu_model("vital", "critical")],
        [old, young],
        [ModelState("vital")],
    )
    from fleet.domain.holdings import holdings
    from fleet.domain.placement import Inventory

    ctx = Context(snap.models, snap.replicas, Policy(), {}, NOW, TIMINGS)
    inv = Inventory(snap.nodes, snap.replicas)
    result = preempt(snap.models["vital"], [TP8], 0, inv, ctx)
    assert [(v.replica, v.why) for v in result.victims] == [
        ("old", "part of a lower class's minimum")
    ]
    assert [p.why for p in result.protected] == [
        "candidate young is protected until 12:04 (ready 1 min)"
    ]
    assert holdings(snap.replicas, snap.models)  # the snapshot is untouched


def test_two_models_preempting_in_one_pass_never_choose_the_same_victim():
    chat = replace(gpu_model("chat"), min_replicas=2, max_replicas=2)
    c = fill_then_want(
        gpu_model("vital-a", "critical"),
        chat,
        gpu_node("1"),
        gpu_node("2"),
        others=[],
    )
    c.change(models={**c.snap.models, "vital-b": gpu_model("vital-b", "critical")})
    plan = c.step()
    victims = [d.replica_id for d in plan.drains]
    assert len(victims) == len(set(victims)) == 2
    assert sorted(d.preempted_for for d in plan.drains) == ["vital-a", "vital-b"]


def test_room_in_flight_counts_against_its_owners_limit():
    # team:x may hold 8 GPUs and holds 4; a and b (4 each) both want room on full nodes.
    # Only one may have victims stopped for it: the other would pass the limit.
    slot = gpu_profile("tp4", tp=4)
    mine = model("x-old", slot, owner="team:x", capacity_class="critical")
    low = model("low", slot, min=3, capacity_class="opportunistic")
    a = model("a", slot, owner="team:x", capacity_class="critical")
    b = model("b", slot, owner="team:x", capacity_class="critical")
    policy = Policy.build([Quota("team:x", limit=gpus(8))], {})
    c = fill_then_want(a, mine, gpu_node("1"), gpu_node("2"), policy=policy, others=[low])
    c.change(models={**c.snap.models, "b": b})
    plan = c.step()
    assert len(plan.drains) == 1, [d.reason for d in plan.drains]
    reasons = [r for e in c.state("b").explanation for r in e["reasons"]]
    assert "team:x is at its capacity limit (12 GPUs of 8)" in reasons


def test_a_borrower_takes_what_a_lower_class_grew_into_before_its_minimum():
    # team:a has no guarantee: it borrows, and takes nothing back as a loan. By class, the
    # opportunistic model's grown replica goes before its minimum.
    slot = gpu_profile("tp4", tp=4)
    low = model("low", slot, min=1, max=2, capacity_class="opportunistic")
    want = model("want", gpu_profile("tp8", tp=8), owner="team:a")
    policy = Policy.build([Quota("team:b", guarantee=gpus(8))], {})
    c = Cluster(snapshot([gpu_node("1"), gpu_node("2", gpus=4)], [low, with_min(want, 0)]))
    c.change(policy=policy)
    settle(c, 2)
    c.set_state("low", extra=1)
    settle(c, 2)
    assert live(c, "low") == 2
    c.wait(TIMINGS.min_lifetime + 60)
    c.change(models={"low": low, "want": want})
    plan = c.step()
    whys = [d.reason for d in plan.drains]
    assert len(whys) == 1 and "grown under load by a lower class" in whys[0], whys


def test_a_replica_scaled_down_in_a_pass_is_not_also_preempted():
    slot = gpu_profile("tp4", tp=4)
    a = model("a", slot, min=2, capacity_class="opportunistic")
    c = fill_then_want(model("vital", slot, capacity_class="critical"), a, gpu_node("1"))
    c.change(models={**c.snap.models, "a": replace(a, min_replicas=1, max_replicas=1)})
    plan = c.step()
    drained = [d.replica_id for d in plan.drains]
    assert len(drained) == len(set(drained)), "a replica drained twice in one pass"


def test_room_kept_on_a_node_that_went_away_is_let_go_and_looked_for_elsewhere():
    chat = replace(gpu_model("chat"), min_replicas=2, max_replicas=2)
    c = fill_then_want(gpu_model("vital", "critical"), chat, gpu_node("1"), gpu_node("2"))
    c.step()
    (victim,) = [r for r in c.snap.replicas if r.preempted_for == "vital"]
    c.wait(TIMINGS.preempt_grace + 1)
    c.step()
    c.all_stopped()
    c.step()  # forgets the victim; vital is placed on its GPUs straight away
    assert live(c, "vital") == 1
    # Now the same from a state where the kept node is cordoned before vital could use it.
    c2 = fill_then_want(gpu_model("vital", "critical"), chat, gpu_node("1"), gpu_node("2"))
    c2.step()
    (victim,) = [r for r in c2.snap.replicas if r.preempted_for == "vital"]
    kept = victim.shards[0].node_id
    c2.wait(TIMINGS.preempt_grace + 1)
    c2.step()
    c2.all_stopped()
    nodes = dict(c2.snap.nodes)
    nodes[kept] = replace(nodes[kept], cordoned=True)
    c2.change(nodes=nodes)
    c2.step()
    assert not c2.state("vital").reserved or c2.state("vital").reserved[0].node_id != kept
    other = ({"1", "2"} - {kept}).pop()
    assert [r.shards[0].node_id for r in c2.snap.replicas if r.preempted_for == "vital"] == [other]


# Four decisions the rules already asked for (issue 18), each with its cluster spelled out.

SLOT3, SLOT4 = gpu_profile("tp3", tp=3), gpu_profile("tp4", tp=4)


def _teams(**guarantees: int) -> Policy:
    return Policy.build([Quota(f"team:{t}", guarantee=gpus(n)) for t, n in guarantees.items()], {})


def _reasons(state: ModelState) -> list[str]:
    return [r for e in state.explanation for r in e["reasons"]]


def test_within_its_guarantee_is_judged_with_its_own_victims_gone():
    # t1 (guarantee 6 GPUs) holds an opportunistic 3 and a standard 2; t2 (guarantee 6) an
    # older standard 4 and a newer standard 3, its loan. t1 adds a standard 4-GPU model.
    # On node 1, stopping t1's own opportunistic 3 and t2's loan makes the room and leaves
    # t1 at 6 with it: within its guarantee on the trial, so the loan may be taken back.
    # (On current holdings t1 would be at 5 + 4 = 9: not within, and nothing stopped.)
    models = [
        model("t1-opp", SLOT3, capacity_class="opportunistic", owner="team:t1"),
        model("t1-std", gpu_profile("tp2", tp=2), owner="team:t1"),
        model("t2-old", SLOT4, owner="team:t2"),
        model("t2-loan", SLOT3, owner="team:t2"),
        model("t1-new", SLOT4, owner="team:t1"),
    ]
    replicas = [
        replica("t1-opp-1", "t1-opp", on="1", gpus=(0, 1, 2), profile="tp3"),
        replica("t2-loan-1", "t2-loan", on="1", gpus=(3, 4, 5), profile="tp3"),
        replica("t1-std-1", "t1-std", on="1", gpus=(6, 7), profile="tp2"),
        replica(
            "t2-old-1", "t2-old", on="2", gpus=(0, 1, 2, 3), profile="tp4", created=NOW - _s(7200)
        ),
    ]
    snap = replace(
        snapshot([gpu_node("1"), gpu_node("2", gpus=4)], models, replicas),
        policy=_teams(t1=6, t2=6),
    )

    plan = run(snap)

    assert sorted((d.replica_id, d.preempted_for) for d in plan.drains) == [
        ("t1-opp-1", "t1-new"),
        ("t2-loan-1", "t1-new"),
    ]
    (kept,) = plan.states["t1-new"].reserved
    assert (kept.node_id, sorted(kept.victims)) == ("1", ["t1-opp-1", "t2-loan-1"])
    # The dry run says the same, naming t2's loan as borrowed beyond its guarantee.
    dry = preemption_dry_run(snap.models["t1-new"], snap, NOW, TIMINGS)
    assert {v["replica"]: v["why"] for v in dry["victims"]} == {
        "t1-opp-1": "part of a lower class's minimum",
        "t2-loan-1": "borrowed beyond its owner's guarantee",
    }
    assert {p["replica"] for p in dry["protected"]} == {"t1-std-1", "t2-old-1"}


def test_a_loan_is_not_taken_back_when_even_its_own_victims_gone_leave_it_over():
    # The same, but t1's guarantee is 5: with its opportunistic 3 gone and the new 4 placed
    # it would hold 6, over 5. The loan stays; t2's is a loan only to an owner within its own.
    models = [
        model("t1-opp", SLOT3, capacity_class="opportunistic", owner="team:t1"),
        model("t1-std", gpu_profile("tp2", tp=2), owner="team:t1"),
        model("t2-loan", SLOT3, owner="team:t2"),
        model("t1-new", SLOT4, owner="team:t1"),
    ]
    replicas = [
        replica("t1-opp-1", "t1-opp", on="1", gpus=(0, 1, 2), profile="tp3"),
        replica("t2-loan-1", "t2-loan", on="1", gpus=(3, 4, 5), profile="tp3"),
        replica("t1-std-1", "t1-std", on="1", gpus=(6, 7), profile="tp2"),
    ]
    snap = replace(snapshot([gpu_node("1")], models, replicas), policy=_teams(t1=5, t2=0))

    plan = run(snap)

    assert plan.drains == []
    reasons = _reasons(plan.states["t1-new"])
    assert (
        "candidate t2-loan-1 is on loan, but t1-new would take team:t1 (6 GPUs of 5) past its guarantee"
        in reasons
    )


def test_two_preemptors_in_one_pass_share_one_victim_when_it_is_enough():
    # Two 4-GPU nodes, each holding one opportunistic 4-GPU replica. Two critical 2-GPU
    # models arrive in one pass: the first replica's room is enough for both. One is
    # stopped; the second model counts the room already being freed as gone; each is then
    # placed into the room kept for it, and the other opportunistic replica is left alone.
    opp = model("opp", SLOT4, min=2, capacity_class="opportunistic")
    tp2 = gpu_profile("tp2", tp=2)
    a, b = (
        model("vital-a", tp2, capacity_class="critical"),
        model("vital-b", tp2, capacity_class="critical"),
    )
    replicas = [
        replica("opp-1", "opp", on="1", gpus=(0, 1, 2, 3), profile="tp4"),
        replica("opp-2", "opp", on="2", gpus=(0, 1, 2, 3), profile="tp4"),
    ]
    c = Cluster(snapshot([gpu_node("1", gpus=4), gpu_node("2", gpus=4)], [opp, a, b], replicas))

    plan = c.step()

    assert [(d.replica_id, d.preempted_for) for d in plan.drains] == [("opp-1", "vital-a")]
    kept = {
        m: [(r.node_id, r.gpu_indices, r.victims) for r in c.state(m).reserved]
        for m in ("vital-a", "vital-b")
    }
    assert kept == {"vital-a": [("1", (0, 1), ("opp-1",))], "vital-b": [("1", (2, 3), ("opp-1",))]}
    assert _reasons(c.state("vital-b")) == ["waiting for room being freed by opp-1"]
    # The dry run says so too, and, had vital-b not yet counted on that room, that it would.
    dry = preemption_dry_run(b, c.snap, c.now, TIMINGS)
    assert dry["blocked"] == ["waiting for room being freed by opp-1"]
    fresh = replace(c.snap, states={**c.snap.states, "vital-b": ModelState("vital-b", desired=1)})
    dry = preemption_dry_run(b, fresh, c.now, TIMINGS)
    assert (dry["victims"], dry["blocked"]) == ([], ["would count on room being freed by opp-1"])
    assert dry["summary"].endswith(
        "would wait for room already being freed by opp-1; nothing more is stopped"
    )
    c.wait(TIMINGS.preempt_grace + 1)
    plan = c.step()  # the grace is over: opp-1 is asked to stop, and nothing more
    assert [s.replica_id for s in plan.stops] == ["opp-1"] and plan.drains == []
    assert _reasons(c.state("vital-b")) == ["waiting for room being freed by opp-1"]
    c.all_stopped()
    c.step()
    placed = {
        r.model: (r.shards[0].node_id, r.shards[0].gpu_indices)
        for r in c.snap.replicas
        if r.model.startswith("vital")
    }
    assert placed == {"vital-a": ("1", (0, 1)), "vital-b": ("1", (2, 3))}
    for _ in range(4):
        c.wait(TIMINGS.preempt_grace + 1)
        for r in c.snap.replicas:
            if r.state == "pending":
                c.report(r.id, "ready")
        plan = c.step()
        assert not (plan.starts or plan.drains or plan.stops), "churn after the room was used"
    assert c.replica("opp-2").state == "ready"


def test_a_second_preemptor_stops_only_what_the_room_being_freed_lacks():
    # Node 1 (4 GPUs): opp-1 (2 GPUs) and opp-2 (2 GPUs). vital-a (1 GPU) takes opp-1's room
    # and counts on GPU 0; vital-b (3 GPUs) counts on opp-1's other GPU, already being
    # freed, and stops opp-2 alone for the rest (node 2 is too small for it).
    tp2 = gpu_profile("tp2", tp=2)
    opp = model("opp", tp2, min=3, capacity_class="opportunistic")
    a = model("vital-a", gpu_profile("tp1", tp=1), capacity_class="critical")
    b = model("vital-b", SLOT3, capacity_class="critical")
    replicas = [
        replica("opp-1", "opp", on="1", gpus=(0, 1), profile="tp2", created=NOW - _s(7200)),
        replica("opp-2", "opp", on="1", gpus=(2, 3), profile="tp2"),
        replica("opp-3", "opp", on="2", gpus=(0, 1), profile="tp2"),
    ]
    snap = snapshot([gpu_node("1", gpus=4), gpu_node("2", gpus=2)], [opp, a, b], replicas)

    plan = run(snap)

    assert sorted((d.replica_id, d.preempted_for) for d in plan.drains) == [
        ("opp-1", "vital-a"),
        ("opp-2", "vital-b"),
    ]
    (kept,) = plan.states["vital-b"].reserved
    assert (kept.node_id, kept.gpu_indices, sorted(kept.victims)) == (
        "1",
        (1, 2, 3),
        ["opp-1", "opp-2"],
    )


def test_the_dry_run_names_a_candidate_the_borrowing_rule_spares():
    # web (guarantee 6) holds web-old (4 GPUs, node 1) and web-new (3, node 2): web-new is
    # its loan. vital (critical, ml: no guarantee) borrows; stopping web-new would leave web
    # at 4, below its guarantee, so it is spared. Both candidates are named, and the
    # explanation does not say stopping what it may stop would not make room: it may stop
    # nothing at all.
    models = [
        model("web-old", SLOT4, owner="team:web"),
        model("web-new", SLOT3, owner="team:web"),
        model("vital", SLOT4, capacity_class="critical", owner="team:ml"),
    ]
    replicas = [
        replica(
            "web-old-1", "web-old", on="1", gpus=(0, 1, 2, 3), profile="tp4", created=NOW - _s(7200)
        ),
        replica("web-new-1", "web-new", on="2", gpus=(0, 1, 2), profile="tp3"),
    ]
    snap = replace(
        snapshot([gpu_node("1", gpus=4), gpu_node("2", gpus=4)], models, replicas),
        policy=_teams(web=6),
    )

    dry = preemption_dry_run(snap.models["vital"], snap, NOW, TIMINGS)

    assert dry["victims"] == []
    assert {p["replica"]: p["why"] for p in dry["protected"]} == {
        "web-old-1": "candidate web-old-1 is within team:web's guarantee",
        "web-new-1": "candidate web-new-1 would take team:web below its guarantee, and vital would borrow",
    }
    assert dry["blocked"] == ["no replica in its way may be stopped for it"]
    plan = run(snap)
    assert plan.drains == []
    assert "stopping what it may stop would not make room for it" not in _reasons(
        plan.states["vital"]
    )


def test_the_dry_run_names_the_candidates_it_does_not_need():
    # Two nodes each hold a standard chat replica; vital needs one node: one replica is the
    # victim, and the other is named as not needed.
    chat = model("chat", TP8, min=2)
    vital = model("vital", TP8, capacity_class="critical")
    replicas = [
        replica("chat-1", "chat", on="1", gpus=range(8), profile="tp8"),
        replica("chat-2", "chat", on="2", gpus=range(8), profile="tp8", created=NOW - _s(7200)),
    ]
    snap = snapshot([gpu_node("1"), gpu_node("2")], [chat, vital], replicas)

    dry = preemption_dry_run(vital, snap, NOW, TIMINGS)

    assert [v["replica"] for v in dry["victims"]] == ["chat-1"]
    assert dry["protected"] == [
        {
            "replica": "chat-2",
            "model": "chat",
            "why": "candidate chat-2 is not needed: stopping chat-1 makes the room",
        }
    ]


def test_a_hold_ends_when_the_model_it_gave_room_to_is_removed():
    # chat gave its node to vital; vital is removed before it is placed. chat's hold ends
    # at the next pass: its state no longer names vital, and no view does either.
    chat, vital = model("chat", TP8), model("vital", TP8, capacity_class="critical")
    c = Cluster(
        snapshot(
            [gpu_node("1")],
            [chat, vital],
            [replica("chat-1", "chat", on="1", gpus=range(8), profile="tp8")],
        )
    )
    c.step()
    assert c.state("chat").held_for == "vital"
    assert held_for(c.state("chat"), c.now, 0, c.state("vital")) == "vital"

    c.change(models={"chat": chat})
    c.step()

    assert (c.state("chat").held_for, c.state("chat").held_until) == ("", None)
    assert c.state("chat").preempted == 1
    assert (
        held_for(
            replace(c.state("chat"), held_for="vital", held_until=c.now + _s(60)), c.now, 0, None
        )
        == ""
    )
    c.wait(TIMINGS.preempt_grace + 1)
    c.step()
    c.all_stopped()
    c.step()
    c.step()
    assert [r.model for r in c.snap.replicas if r.state == "pending"] == ["chat"], (
        "it takes its room back"
    )


def test_a_hold_ends_when_the_model_it_gave_room_to_is_parked():
    chat, vital = model("chat", TP8), model("vital", TP8, capacity_class="critical")
    c = Cluster(
        snapshot(
            [gpu_node("1")],
            [chat, vital],
            [replica("chat-1", "chat", on="1", gpus=range(8), profile="tp8")],
        )
    )
    c.step()
    assert c.state("chat").held_for == "vital"
    c.set_state("vital", parked_since=c.now, parked_reason="it failed 5 times")

    c.step()

    assert c.state("chat").held_for == ""
    assert (
        held_for(
            replace(c.state("chat"), held_for="vital", held_until=c.now + _s(60)),
            c.now,
            0,
            c.state("vital"),
        )
        == ""
    )


def test_a_hold_ends_when_the_model_it_gave_room_to_lets_the_room_go():
    # vital took chat's node 1; by the time chat's replica is gone node 1 is cordoned, and
    # node 2 holds a critical model's minimum. vital cannot use the room and lets it go:
    # chat's hold for it ends with it.
    chat, vital = model("chat", TP8), model("vital", TP8, capacity_class="critical")
    pinned = model("pinned", TP8, capacity_class="critical")
    replicas = [
        replica("chat-1", "chat", on="1", gpus=range(8), profile="tp8"),
        replica("pinned-1", "pinned", on="2", gpus=range(8), profile="tp8"),
    ]
    c = Cluster(snapshot([gpu_node("1"), gpu_node("2")], [chat, pinned, vital], replicas))
    c.step()
    assert c.state("chat").held_for == "vital"
    c.wait(TIMINGS.preempt_grace + 1)
    c.step()
    c.all_stopped()
    c.change(nodes={**c.snap.nodes, "1": replace(c.snap.nodes["1"], cordoned=True)})

    c.step()

    assert c.state("vital").reserved == ()
    assert (c.state("chat").held_for, c.state("chat").held_until) == ("", None)
    assert not any("gave room to" in r for r in _reasons(c.state("chat")))


def test_the_dry_run_names_every_candidate_when_a_limit_stops_it():
    # ml may hold 8 GPUs and holds them elsewhere; chat could be stopped for vital by class,
    # but vital would take ml past its limit: chat is named, with the limit as the reason.
    chat = model("chat", TP8, capacity_class="opportunistic")
    vital = model("vital", TP8, capacity_class="critical", owner="team:ml")
    mine = model("ml-old", TP8, capacity_class="critical", owner="team:ml")
    replicas = [
        replica("chat-1", "chat", on="1", gpus=range(8), profile="tp8"),
        replica("ml-old-1", "ml-old", on="2", gpus=range(8), profile="tp8"),
    ]
    snap = replace(
        snapshot([gpu_node("1"), gpu_node("2")], [chat, vital, mine], replicas),
        policy=quotas(Quota("team:ml", limit=gpus(8))),
    )

    dry = preemption_dry_run(vital, snap, NOW, TIMINGS)

    assert dry["victims"] == []
    assert dry["blocked"] == ["team:ml is at its capacity limit (16 GPUs of 8)"]
    assert {p["replica"]: p["why"] for p in dry["protected"]} == {
        "chat-1": "candidate chat-1 may be stopped, but team:ml is at its capacity limit "
        "(16 GPUs of 8)",
        "ml-old-1": "candidate ml-old-1 is part of critical model ml-old's minimum",
    }
