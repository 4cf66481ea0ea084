"""The reconciler and mirror weights: a model waits for weights still being fetched, and a
replica's startup timeout does not count the time its agent spent fetching them."""

from __future__ import annotations

from dataclasses import replace

from .builders import (
    ago,
    cpu_node,
    cpu_profile,
    gpu_node,
    gpu_profile,
    model,
    replica,
    run,
    snapshot,
)


def test_a_model_whose_weights_are_still_downloading_is_not_placed_and_says_why():
    m = model("chat", cpu_profile())
    why = "waiting for weights 3 (tiny.gguf): downloading, 40% of 0.25 GB"
    snap = replace(snapshot([cpu_node("c1")], [m]), weights_waiting={"chat": why})

    plan = run(snap)

    assert plan.starts == []
    assert plan.states["chat"].explanation == ({"profile": "", "reasons": [why]},)
    assert not plan.states["chat"].unplaceable


def test_a_model_whose_weights_are_ready_is_placed():
    m = model("chat", cpu_profile())
    snap = replace(snapshot([cpu_node("c1")], [m]), weights_waiting={"other": "waiting"})

    assert len(run(snap).starts) == 1


def _fetching(r):
    return replace(r, shards=tuple(replace(s, state="fetching") for s in r.shards))


def test_a_replica_fetching_its_weights_is_not_timed_out():
    m = model("chat", gpu_profile(startup_timeout_s=120))
    r = _fetching(replica("a", "chat", state="pending", created=ago(3600)))

    plan = run(snapshot([gpu_node("n1")], [m], [r]))

    assert plan.stops == []
    assert plan.states["chat"].failures == 0


def test_the_startup_timeout_counts_from_the_start_once_the_fetch_is_over():
    m = model("chat", gpu_profile(startup_timeout_s=120), min=2)
    within = replica("a", "chat", state="starting", created=ago(3600), state_since=ago(60))
    past = replica("b", "chat", state="starting", created=ago(3600), state_since=ago(121))

    plan = run(snapshot([gpu_node("n1", gpus=2)], [m], [within, past]))

    assert [s.replica_id for s in plan.stops] == ["b"]
