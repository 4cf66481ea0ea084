"""A node's drain, as the reconciler runs it: it ends when the node is uncordoned
(issue 37, 1), and a drain that cannot move a replica for lack of room says so."""

from dataclasses import replace

from fleet.domain.drains import drain_stuck

from .builders import (
    NOW,
    Cluster,
    at,
    cpu_node,
    gpu_node,
    gpu_profile,
    model,
    replica,
    snapshot,
)


def full_cluster(gpu_b_draining: bool) -> Cluster:
    """The demo's full cluster: gpu-a held by critical minimums (nothing to preempt), chat
    (critical, tp 4) and a tp 2 replica on gpu-b with two GPUs left, two models waiting for
    room (an on-demand one asked for, a standard one)."""
    tp4, tp2 = gpu_profile(tp=4), gpu_profile(tp=2)
    b = gpu_node("gpu-b", draining=gpu_b_draining, cordoned=gpu_b_draining)
    c = Cluster(
        snapshot(
            [gpu_node("gpu-a"), b, cpu_node("cpu-1")],
            [
                model("chat", tp4, capacity_class="critical"),
                model("vital", tp4, min=2, capacity_class="critical"),
                model("side", tp2),
                model("burst", tp2, min=0, max=1),
                model("extra", tp2),
            ],
            [
                replica("vital-1", "vital", on="gpu-a", gpus=range(4)),
                replica("vital-2", "vital", on="gpu-a", gpus=range(4, 8)),
                replica("chat-1", "chat", on="gpu-b", gpus=range(4)),
                replica("side-1", "side", on="gpu-b", gpus=(4, 5)),
            ],
        )
    )
    c.set_state("burst", last_requested_at=NOW)
    return c


def uncordon(c: Cluster) -> None:
    c.change(nodes={**c.snap.nodes, "gpu-b": gpu_node("gpu-b")})


def test_an_uncordon_ends_a_stuck_drain_and_its_timeout_though_others_took_the_room():
    # The steps: drain gpu-b with nowhere to go, restart chat while it is stuck,
    # uncordon gpu-b; its two free GPUs go to other models. Five minutes after the drain,
    # chat's replica was stopped "its node drained 5m0s with no room for a replacement".
    c = full_cluster(gpu_b_draining=True)
    plan = c.step()
    assert sorted(r.replica_id for r in plan.retires) == ["chat-1", "side-1"]
    assert c.state("chat").unplaceable
    c.set_state("chat", restart_requested_at=c.now)
    c.wait(60)
    assert c.step().stops == []  # stuck: both serve

    c.wait(60)
    uncordon(c)
    plan = c.step()
    assert "replica chat-1 of chat stays: gpu-b no longer drains" in plan.events
    assert "replica side-1 of side stays: gpu-b no longer drains" in plan.events
    # The two freed GPUs went to a model waiting for room (the standard one first).
    assert [s.model for s in plan.starts] == ["extra"]
    assert c.replica("side-1").drain_deadline is None
    for _ in range(40):  # well past the drain's five minutes
        c.wait(10)
        plan = c.step()
        assert not any("its node drained" in s.reason for s in plan.stops), plan.stops
        for r in c.ids("starting") + c.ids("pending"):
            c.report(r, "ready")
        c.all_stopped()
    assert "side-1" in c.ids("ready")
    assert c.ids("ready") and any(r.startswith("chat") for r in c.ids("ready"))


def test_with_nothing_else_wanting_the_room_an_uncordon_keeps_the_replicas_where_they_are():
    c = full_cluster(gpu_b_draining=True)
    c.change(models={k: v for k, v in c.snap.models.items() if k not in ("burst", "extra")})
    c.step()
    c.wait(30)
    uncordon(c)
    plan = c.step()
    assert not plan.stops and not plan.starts
    assert not c.replica("chat-1").retiring and c.replica("chat-1").drain_deadline is None
    c.wait(400)
    assert c.step().stops == []


def test_a_restarts_retirement_goes_on_when_an_uncordon_ends_a_drain():
    c = full_cluster(gpu_b_draining=False)
    c.snap = replace(
        c.snap,
        replicas=tuple(
            replace(r, retiring=True, reason="restarting") if r.id == "chat-1" else r
            for r in c.snap.replicas
        ),
    )
    plan = c.step()
    assert not any("stays" in e for e in plan.events)
    assert c.replica("chat-1").retiring and c.replica("chat-1").reason == "restarting"


def test_a_drain_with_no_room_is_stuck_and_says_why_and_when_it_gives_up():
    why = {"chat": "gpu-a has 0 free h100-80g GPUs of 8, needs 4"}
    retiring = [("chat-1", "chat", at(300))]
    assert drain_stuck(retiring, why) == (
        "stuck: no room for chat's replacement (gpu-a has 0 free h100-80g GPUs of 8, "
        "needs 4); chat-1 stops at 12:05:00 UTC"
    )


def test_a_drain_whose_replacements_are_placed_is_not_stuck():
    assert drain_stuck([("chat-1", "chat", at(300))], {}) == ""
    assert drain_stuck([], {"chat": "no room"}) == ""


def test_several_stuck_models_are_each_said():
    retiring = [("a-1", "a", at(300)), ("b-1", "b", at(240)), ("b-2", "b", at(240))]
    said = drain_stuck(retiring, {"a": "n1 is cordoned", "b": "n2 is draining"})
    assert said == (
        "stuck: no room for a's replacement (n1 is cordoned); no room for b's replacements "
        "(n2 is draining); the first of them stops at 12:04:00 UTC"
    )
