"""A pass that skips quiet models decides what a full pass decides (fleet/domain/quiet.py).

A fleet is driven pass after pass through seeded changes (a node going silent and
heard again, replicas failing, starting and stopping, a model added, removed or
resized, a quota set, load coming and going, a restart or a request asked for, a
node drained, time passing backoffs, holds and timeouts); at every pass the decision
with the kept quiet models is compared with a fresh full pass over the same snapshot.
"""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

import fleet.domain.reconcile as reconcile
from fleet.domain.quiet import QuietModels
from fleet.domain.reconcile import decide
from fleet.domain.types import Load
from tenancy.quota import Policy, Quota, Resources

from .builders import (
    NOW,
    TIMINGS,
    Cluster,
    apply,
    at,
    gpu_node,
    gpu_profile,
    model,
    replica,
    snapshot,
)

NODES = [gpu_node(f"n{i}", gpus=8) for i in range(1, 5)]
MODELS = [
    model("steady", min=2),
    model("pair", gpu_profile("tp2", tp=2), min=1, owner="team:ml"),
    model("grow", min=1, max=3),
    model("od", min=0, max=1, idle_timeout_s=120),
    model("big", gpu_profile("tp8", tp=8), min=2, capacity_class="opportunistic"),
    model("vip", gpu_profile("tp4", tp=4), min=1, capacity_class="critical"),
]
EXTRA = [
    model("late", gpu_profile("tp2", tp=2), min=2),
    model("wide", gpu_profile("tp8", tp=8), min=1, capacity_class="critical"),
]


def seen(plan) -> tuple:
    """Everything a plan says, events with their kinds and figures."""
    return (
        plan.starts,
        plan.drains,
        plan.stops,
        plan.forgets,
        plan.retires,
        plan.node_changes,
        plan.health,
        plan.states,
        [(str(e), e.kind, e.fields) for e in plan.events],
    )


def ids_for(n: int):
    counter = iter(range(1000))
    return lambda name: f"{name}-{n}-{next(counter)}"


def change(c: Cluster, kind: str, pick: int) -> None:
    """One seeded change between passes."""
    replicas = c.snap.replicas
    names = sorted(c.snap.models)
    if kind == "wait":
        c.wait([5, 5, 15, 31, 61, 300][pick % 6])
    elif kind == "silence":
        c.silent ^= {NODES[pick % len(NODES)].id}
        c.wait(5)
    elif kind == "fail" and replicas:
        r = replicas[pick % len(replicas)]
        c.report(r.id, "failed", "engine exited")
    elif kind == "ready":
        waiting = [r for r in replicas if r.state in ("pending", "starting")]
        if waiting:
            c.report(waiting[pick % len(waiting)].id, "ready")
    elif kind == "all_ready":
        for r in replicas:
            if r.state in ("pending", "starting"):
                c.report(r.id, "ready")
    elif kind == "stopped":
        c.all_stopped()
    elif kind == "add":
        extra = EXTRA[pick % len(EXTRA)]
        c.change(models={**c.snap.models, extra.name: extra})
    elif kind == "remove" and names:
        models = dict(c.snap.models)
        models.pop(names[pick % len(names)])
        c.change(models=models)
    elif kind == "resize" and names:
        m = c.snap.models[names[pick % len(names)]]
        if not m.on_demand:
            c.change(
                models={**c.snap.models, m.name: replace(m, min_replicas=pick % 3, max_replicas=3)}
            )
    elif kind == "quota":
        limit = [None, 0, 2, 8][pick % 4]
        c.change(policy=Policy.build([Quota("team:ml", limit=Resources(gpus=limit))], {}))
    elif kind == "load":
        load = [None, Load(0, 0), Load(4, 9)][pick % 3]
        c.change(loads={} if load is None else {"grow": load})
    elif kind == "ask":
        c.set_state(["od", "steady"][pick % 2], last_requested_at=c.now)
        if pick % 3 == 0:
            c.set_state("steady", restart_requested_at=c.now)
    elif kind == "drain":
        node = NODES[pick % len(NODES)].id
        nodes = dict(c.snap.nodes)
        nodes[node] = replace(nodes[node], draining=not nodes[node].draining)
        c.change(nodes=nodes)
    elif kind == "settle":
        c.change(settling=not c.snap.settling)


KINDS = [
    "wait",
    "silence",
    "fail",
    "ready",
    "all_ready",
    "all_ready",
    "stopped",
    "add",
    "remove",
    "resize",
    "quota",
    "load",
    "ask",
    "drain",
    "settle",
    "nothing",
]


def drive(changes: list[tuple[str, int]]) -> int:
    """Pass after pass, each compared with a full pass; returns how many steps were skipped."""
    c = Cluster(snapshot(NODES, MODELS))
    quiet = QuietModels()
    skipped = 0
    for n, (kind, pick) in enumerate([("nothing", 0), *changes]):
        change(c, kind, pick)
        full = decide(c.snap, c.now, TIMINGS, ids_for(n))
        skipping = decide(c.snap, c.now, TIMINGS, ids_for(n), quiet=quiet)
        assert seen(skipping) == seen(full), (n, kind, pick)
        skipped += quiet.skipped
        c.snap = apply(c.snap, full, c.now)
        c.wait(5)
    return skipped


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.tuples(st.sampled_from(KINDS), st.integers(0, 11)), min_size=1, max_size=30))
def test_skipping_quiet_models_decides_as_a_full_pass(changes):
    drive(changes)


@pytest.mark.parametrize(
    "changes",
    [
        # A replica fails: its model backs off, then places again once the backoff is over.
        [("all_ready", 0), ("fail", 0), ("stopped", 0), ("wait", 3), ("wait", 4), ("wait", 4)],
        # A node goes silent: unreachable, then lost, its replicas replaced elsewhere.
        [("silence", 0), ("wait", 3), ("wait", 4), ("wait", 4)],
        # A model added where there is no room for it, then room made by removing another.
        [("add", 1), ("nothing", 0), ("remove", 4), ("stopped", 0), ("wait", 3)],
        # A quota limit set, then lifted.
        [("quota", 1), ("resize", 1), ("nothing", 0), ("quota", 0), ("nothing", 0)],
        # An on-demand model asked for, then idle past its timeout.
        [("ask", 0), ("ready", 0), ("wait", 4), ("wait", 4)],
        # Scaled down: the replica past what is wanted drains, and stops at its deadline.
        [("all_ready", 0), ("resize", 4), ("nothing", 0), ("wait", 5), ("nothing", 0)],
        # A critical model preempts for room: its victims drain and stop, the model they
        # belong to is held, and looked at again when the hold ends.
        [
            ("all_ready", 0),
            ("wait", 5),
            ("add", 1),
            ("nothing", 0),
            ("wait", 3),
            ("stopped", 0),
            ("all_ready", 0),
            ("wait", 5),
            ("wait", 5),
        ],
        # ... and the model it gave room to removed while it is held: the hold ends.
        [("all_ready", 0), ("wait", 5), ("add", 1), ("nothing", 0), ("remove", 6)],
    ],
)
def test_the_changes_that_matter_decide_as_a_full_pass(changes):
    assert drive(changes) > 0  # and some models were skipped on the way


def test_a_pass_with_nothing_changed_looks_at_no_unchanged_model(monkeypatch):
    c = Cluster(snapshot(NODES, [model("steady", min=2), model("pair", gpu_profile(tp=2))]))
    for _ in range(4):  # placed, ready, and a pass that finds nothing to do
        c.step()
        for r in c.snap.replicas:
            if r.state == "pending":
                c.report(r.id, "ready")
        c.wait(5)
    quiet = QuietModels()
    decide(c.snap, c.now, TIMINGS, quiet=quiet)
    steps = []
    real = reconcile._reconcile_model
    monkeypatch.setattr(
        reconcile, "_reconcile_model", lambda m, *a: steps.append(m.name) or real(m, *a)
    )
    c.wait(5)
    plan = decide(c.snap, c.now, TIMINGS, quiet=quiet)
    assert plan.empty and not plan.events
    assert steps == []
    assert (quiet.skipped, quiet.ran) == (2, 0)


def test_a_model_whose_backoff_ends_is_looked_at_again():
    c = Cluster(snapshot(NODES, [model("steady", min=1)]))
    c.set_state("steady", failures=1, backoff_until=NOW + timedelta(seconds=12))
    quiet = QuietModels()
    ran = []
    for _ in range(4):  # at 0 s, 5 s (its new state kept), 10 s (skipped) and 15 s
        plan = decide(c.snap, c.now, TIMINGS, quiet=quiet)
        ran.append(quiet.ran)
        c.snap = apply(c.snap, plan, c.now)
        c.wait(5)
    assert ran == [1, 1, 0, 1]
    assert [s.model for s in plan.starts] == ["steady"]


def test_a_retiring_replica_stops_at_its_deadline_though_nothing_else_moved():
    old = replica("steady-old", "steady", on="n1", retiring=True, drain_deadline=at(20))
    new = replica("steady-new", "steady", on="n2", state="pending", created=NOW)
    # Its node drains: a drain's retirement lasts while its node drains.
    nodes = [gpu_node("n1", gpus=8, draining=True, cordoned=True), *NODES[1:]]
    c = Cluster(snapshot(nodes, [model("steady", min=1)], [old, new]))
    quiet = QuietModels()
    for n in range(6):
        full = decide(c.snap, c.now, TIMINGS, ids_for(n))
        assert seen(decide(c.snap, c.now, TIMINGS, ids_for(n), quiet=quiet)) == seen(full)
        c.snap = apply(c.snap, full, c.now)
        c.wait(5)
    assert c.replica("steady-old").state == "stopping"


def _unplaceable_world(ready_ago: float) -> Cluster:
    """Two full nodes of a model that may not be preempted for (same class, at its
    minimum), and `wide`, which wants a whole node too: it stays unplaceable."""
    nodes = [gpu_node(f"n{i}", gpus=8) for i in (1, 2)]
    holders = [
        replica(f"steady-{i}", "steady", on=f"n{i}", gpus=range(8), profile="tp8",
                ready_at=NOW - timedelta(seconds=ready_ago))
        for i in (1, 2)
    ]  # fmt: skip
    models = [
        model("steady", gpu_profile("tp8", tp=8), min=2),
        model("wide", gpu_profile("tp8", tp=8), min=1),
    ]
    return Cluster(snapshot(nodes, models, holders))


def _passes(c: Cluster, quiet: QuietModels, count: int, *, every: float = 5) -> list[list[str]]:
    """`count` passes, each compared with a full pass: per pass, the models whose step ran."""
    ran = []
    real = reconcile._reconcile_model
    for n in range(count):
        steps: list[str] = []
        reconcile._reconcile_model = lambda m, *a, steps=steps: steps.append(m.name) or real(m, *a)
        try:
            full = decide(c.snap, c.now, TIMINGS, ids_for(n))
            steps.clear()
            skipping = decide(c.snap, c.now, TIMINGS, ids_for(n), quiet=quiet)
        finally:
            reconcile._reconcile_model = real
        assert seen(skipping) == seen(full), n
        ran.append(steps)
        c.snap = apply(c.snap, full, c.now)
        c.wait(every)
    return ran


def test_a_model_that_stays_unplaceable_is_not_searched_again_until_its_world_moves():
    c = _unplaceable_world(ready_ago=3600)
    quiet = QuietModels()
    # Found unplaceable (its state changes, as steady's does), found so again (kept with
    # its world), then skipped.
    assert _passes(c, quiet, 4) == [["steady", "wide"], ["steady", "wide"], [], []]
    assert c.state("wide").unplaceable
    # Room is made: one of steady's replicas stops. Its world moved: it is placed.
    c.change(replicas=tuple(r for r in c.snap.replicas if r.id != "steady-2"))
    c.change(models={**c.snap.models, "steady": replace(c.snap.models["steady"], min_replicas=1)})
    ran = _passes(c, quiet, 1)
    assert ran == [["steady", "wide"]]
    assert not c.state("wide").unplaceable


def test_an_unplaceable_model_is_looked_at_again_as_the_protection_it_names_moves():
    # steady's replicas became ready 50 s ago: protected, and the reason says for how long.
    c = _unplaceable_world(ready_ago=50)
    c.change(
        models={**c.snap.models, "wide": replace(c.snap.models["wide"], capacity_class="critical")}
    )
    quiet = QuietModels()
    ran = _passes(c, quiet, 8)  # 50 s to 85 s after they became ready
    reasons = [r for e in c.state("wide").explanation for r in e["reasons"]]
    assert any("is protected until" in r and "(ready 1 min)" in r for r in reasons), reasons
    # Found unplaceable, then so again (kept); looked at again when the minute turned (at
    # 60 s, the reasons say "ready 1 min"), kept at 65 s, and skipped from then on.
    assert [bool(steps) for steps in ran] == [True, True, True, True, False, False, False, False]
