"""Facility-aware placement through decide(): replicas spread over racks and zones, power
budgets per rack and PDU, and missing data changing nothing (docs/facility.md)."""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from catalog.domain import ModelSpec
from fleet.domain.capacity import headroom, preemption_dry_run
from fleet.domain.placement import Inventory, Placement
from fleet.domain.power import (
    PDU_LABEL,
    RACK_LABEL,
    ZONE_LABEL,
    Budget,
    Figures,
    GpuPower,
    Power,
    draws,
)
from fleet.domain.types import HOLDING, Snapshot
from tenancy.quota import Policy

from .builders import (
    NOW,
    TIMINGS,
    Cluster,
    gpu_node,
    gpu_profile,
    model,
    replica,
    run,
    snapshot,
)

TP4 = gpu_profile("tp4", tp=4)


def racked(node_id: str, rack: str | None = None, zone: str | None = None, **kw):
    labels = dict(kw.pop("labels", {}))
    if rack:
        labels[RACK_LABEL] = rack
    if zone:
        labels[ZONE_LABEL] = zone
    return gpu_node(node_id, labels=labels, **kw)


def limits(*nodes, watts: float = 700.0, gpus: int = 8, draw: float | None = None) -> dict:
    """Every GPU of these nodes reporting `watts` as its enforced limit (and `draw`)."""
    return {n: {i: GpuPower(watts, draw) for i in range(gpus)} for n in nodes}


def with_power(snap: Snapshot, *budgets: Budget, gpus=None) -> Snapshot:
    return replace(snap, power=Power(tuple(budgets), gpus or {}))


def placed_on(plan) -> list[str]:
    return [p.node_id for s in plan.starts for _, p in s.shards]


def reasons(plan, name: str) -> list[str]:
    return [r for e in plan.states[name].explanation for r in e["reasons"]]


# Spreading.

TWO_RACKS = [
    racked("a1", "r1"),
    racked("a2", "r1"),
    racked("b1", "r2"),
    racked("b2", "r2"),
]


def test_replicas_spread_over_two_racks_before_filling_one():
    plan = run(snapshot(TWO_RACKS, [model("chat", min=2)]))
    assert placed_on(plan) == ["a1", "b1"]
    second = plan.starts[1]
    assert "spread over racks: r2 holds 0, r1 holds 1" in second.reason
    assert any("spread over racks: r2 holds 0, r1 holds 1" in e for e in plan.events)


def test_without_labels_replicas_go_where_they_went_before():
    bare = [gpu_node(n) for n in ("a1", "a2", "b1", "b2")]
    other = [gpu_node(n, labels={"team": "ml"}) for n in ("a1", "a2", "b1", "b2")]
    for fleet in (bare, other):
        plan = run(snapshot(fleet, [model("chat", min=2)]))
        assert placed_on(plan) == ["a1", "a2"]
        assert all("spread" not in s.reason for s in plan.starts)


def test_a_third_replica_goes_to_the_rack_holding_fewest_even_past_a_fuller_node():
    # r1 holds one replica on a1; a2 is free in r1, b1 in r2: b1, though a2 packs better.
    fleet = [racked("a1", "r1"), racked("a2", "r1", gpus=2), racked("b1", "r2")]
    have = [replica("chat-0", "chat", on="a1")]
    plan = run(snapshot(fleet, [model("chat", min=2)], have))
    assert placed_on(plan) == ["b1"]


def test_zones_break_ties_between_racks_holding_as_many():
    fleet = [
        racked("a1", "r1", "z1"),
        racked("a2", "r2", "z1"),
        racked("b1", "r3", "z2"),
    ]
    plan = run(snapshot(fleet, [model("chat", min=2)]))
    # r2 and r3 both hold 0; r3's zone z2 holds none where z1 holds one.
    assert placed_on(plan) == ["a1", "b1"]


def test_spreading_is_a_preference_never_a_refusal():
    # Only r1 has room for a second replica: it goes there rather than nowhere.
    fleet = [racked("a1", "r1"), racked("a2", "r1"), racked("b1", "r2", gpus=0)]
    plan = run(snapshot(fleet, [model("chat", min=2)]))
    assert placed_on(plan) == ["a1", "a2"]
    assert not plan.states["chat"].unplaceable


# Power budgets.

RACK = Budget("rack", "r1", 2000)


def test_a_budget_refuses_a_node_with_a_sentence_with_the_figures():
    snap = with_power(
        snapshot([racked("n1", "r1")], [model("chat", min=3)]), RACK, gpus=limits("n1")
    )
    plan = run(snap)
    assert len(plan.starts) == 2
    assert plan.states["chat"].unplaceable
    assert "node n1 is in rack r1: 1,400 of 2,000 W held, this replica needs ~700 W" in reasons(
        plan, "chat"
    )
    assert any(
        "cannot be placed: n1 is in rack r1: 1,400 of 2,000 W held" in e for e in plan.events
    )


def test_a_pdu_budget_counts_against_every_feed_of_a_dual_fed_rack():
    node = racked("n1", labels={PDU_LABEL: "p-a,p-b"})
    snap = with_power(
        snapshot([node], [model("chat", min=2)]),
        Budget("pdu", "p-a", 10_000),
        Budget("pdu", "p-b", 1000),
        gpus=limits("n1"),
    )
    plan = run(snap)
    assert len(plan.starts) == 1
    assert "node n1 is in pdu p-b: 700 of 1,000 W held, this replica needs ~700 W" in reasons(
        plan, "chat"
    )


def test_measured_draw_above_the_limit_counts_as_held():
    # The replica there draws 900 W on a 700 W card (the limit was raised since): the rack
    # holds 900 W, and a replica needing 700 more passes a 1,500 W budget.
    snap = with_power(
        snapshot(
            [racked("n1", "r1")], [model("chat", min=2)], [replica("chat-0", "chat", on="n1")]
        ),
        Budget("rack", "r1", 1500),
        gpus={"n1": {0: GpuPower(700, 900), **{i: GpuPower(700) for i in range(1, 8)}}},
    )
    plan = run(snap)
    assert not plan.starts
    assert "node n1 is in rack r1: 900 of 1,500 W held, this replica needs ~700 W" in reasons(
        plan, "chat"
    )


def test_unknown_power_limits_never_block_and_say_the_draw_is_unknown():
    snap = with_power(snapshot([racked("n1", "r1")], [model("chat", min=3)]), RACK)
    plan = run(snap)
    assert len(plan.starts) == 3
    assert not plan.states["chat"].unplaceable
    assert "its draw is unknown (node n1 does not report its GPUs' power limits)" in (
        plan.starts[0].reason
    )


def test_a_budget_for_a_rack_no_node_is_in_changes_nothing():
    fleet = [racked("n1", "r1")]
    plain = run(snapshot(fleet, [model("chat", min=3)]))
    budgeted = run(
        with_power(
            snapshot(fleet, [model("chat", min=3)]),
            Budget("rack", "elsewhere", 1),
            gpus=limits("n1"),
        )
    )
    assert [s.reason for s in budgeted.starts] == [s.reason for s in plain.starts]
    assert placed_on(budgeted) == placed_on(plain)


def test_a_multi_node_replica_is_judged_with_all_its_shards_in_the_rack():
    # Each shard alone fits the rack's 6,000 W; the two together (2 × 4 × 1,000) do not.
    fleet = [racked(n, "r1", fabric="ib") for n in ("n1", "n2")]
    two = gpu_profile("two", tp=8, nodes=2)
    inv = Inventory(
        {n.id: n for n in fleet},
        (),
        power=Power((Budget("rack", "r1", 6000),), limits("n1", "n2", watts=1000)),
    )
    refused = inv.place([two], model="big")
    assert not isinstance(refused, Placement)
    assert (
        "node n2 is in rack r1: 4,000 of 6,000 W held, this replica needs ~4,000 W"
        in (refused.reasons[0][1])
    )


def test_a_standard_model_passing_a_budget_preempts_an_opportunistic_replica_in_that_rack():
    # One node of eight 1,000 W cards under a 4,000 W rack budget: the opportunistic model
    # holds four cards; four more are free but their watts are not.
    opp = model("batch", TP4, capacity_class="opportunistic")
    chat = model("chat", TP4)
    c = Cluster(
        with_power(
            snapshot([racked("n1", "r1")], [opp, replace(chat, min_replicas=0, max_replicas=0)]),
            Budget("rack", "r1", 4000),
            gpus=limits("n1", watts=1000),
        )
    )
    c.step()
    (batch,) = c.ids()
    c.report(batch, "ready")
    c.wait(TIMINGS.min_lifetime + 60)
    c.change(models={"batch": opp, "chat": chat})
    plan = c.step()
    assert [d.replica_id for d in plan.drains] == [batch]
    assert "preempted for chat" in plan.drains[0].reason
    assert c.replica(batch).preempted_for == "chat"
    # Once it is gone, chat is placed into the watts it freed.
    c.all_stopped()
    c.wait(TIMINGS.preempt_grace + 1)
    c.report(batch, "stopped")
    for _ in range(3):
        plan = c.step()
        if plan.starts:
            break
    assert [s.model for s in plan.starts] == ["chat"]


def test_a_victim_on_another_node_of_the_rack_frees_the_watts_a_model_needs():
    # n1 runs only the opportunistic model and holds the rack's whole 8,000 W; n2 beside it,
    # the only node chat may run on, has eight free cards but no watts. Nothing on n2 can
    # go: the victim is on n1, which frees the watts, not the cards chat gets.
    batch_tp4 = gpu_profile("tp4", tp=4, node_selector={"kind": "main"})
    chat_tp4 = gpu_profile("tp4", tp=4, node_selector={"kind": "spare"})
    opp = model("batch", batch_tp4, capacity_class="opportunistic", min=2)
    chat = model("chat", chat_tp4)
    snap = with_power(
        snapshot(
            [
                racked("n1", "r1", labels={"kind": "main"}),
                racked("n2", "r1", labels={"kind": "spare"}),
            ],
            [opp, replace(chat, min_replicas=0, max_replicas=0)],
        ),
        Budget("rack", "r1", 8000),
        gpus=limits("n1", "n2", watts=1000),
    )
    c = Cluster(snap)
    plan = c.step()
    assert placed_on(plan) == ["n1", "n1"]
    batch = c.ids()
    for r in batch:
        c.report(r, "ready")
    c.wait(TIMINGS.min_lifetime + 60)
    c.change(models={"batch": opp, "chat": chat})
    # The dry run names it first.
    out = preemption_dry_run(chat, c.snap, c.now, TIMINGS)
    assert [v["replica"] for v in out["victims"]] in ([b] for b in batch), out
    plan = c.step()
    assert len(plan.drains) == 1 and plan.drains[0].replica_id in batch
    assert "preempted for chat" in plan.drains[0].reason
    # Once it is gone, chat is placed on n2 in the watts it freed.
    c.all_stopped()
    c.wait(TIMINGS.preempt_grace + 1)
    c.report(plan.drains[0].replica_id, "stopped")
    for _ in range(3):
        plan = c.step()
        if plan.starts:
            break
    assert [(s.model, placed_on(plan)) for s in plan.starts] == [("chat", ["n2"])]


def test_the_dry_run_names_the_victim_for_a_budget():
    opp = model("batch", TP4, capacity_class="opportunistic")
    chat = model("chat", TP4)
    snap = with_power(
        snapshot(
            [racked("n1", "r1")],
            [opp, chat],
            [replica("batch-1", "batch", on="n1", gpus=(0, 1, 2, 3), profile="tp4")],
        ),
        Budget("rack", "r1", 4000),
        gpus=limits("n1", watts=1000),
    )
    out = preemption_dry_run(chat, snap, NOW, TIMINGS)
    assert [v["replica"] for v in out["victims"]] == ["batch-1"]


# Properties.


@st.composite
def racked_fleets(draw):
    nodes, gpus = [], {}
    for i in range(draw(st.integers(1, 6))):
        rack = draw(st.sampled_from(["r1", "r2", None]))
        count = draw(st.integers(1, 8))
        node = racked(f"n{i}", rack, gpus=count, fabric=draw(st.sampled_from([None, "ib"])))
        nodes.append(node)
        gpus[node.id] = {
            g: GpuPower(draw(st.sampled_from([300.0, 450.0, 700.0]))) for g in range(count)
        }
    budgets = tuple(
        Budget("rack", r, draw(st.integers(0, 12_000))) for r in ("r1", "r2") if draw(st.booleans())
    )
    return nodes, Power(budgets, gpus)


@st.composite
def gpu_catalogs(draw, multi_node: bool = True) -> list[ModelSpec]:
    out = []
    for i in range(draw(st.integers(1, 4))):
        nodes = draw(st.sampled_from([1, 1, 1, 2] if multi_node else [1]))
        profile = gpu_profile(f"p{i}", tp=draw(st.sampled_from([1, 2, 4])) * nodes, nodes=nodes)
        out.append(
            model(
                f"m{i}",
                profile,
                min=draw(st.integers(1, 4)),
                capacity_class=draw(st.sampled_from(["", "critical", "opportunistic"])),
            )
        )
    return out


def rack_draw(snap: Snapshot) -> dict[str, float]:
    held = [
        (s.node_id, s.gpu_indices) for r in snap.replicas if r.state in HOLDING for s in r.shards
    ]
    labels = {n.id: n.labels for n in snap.nodes.values()}
    return {name: d.estimated_w for (kind, name), d in draws(labels, held, snap.power.gpus).items()}


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(fleet=racked_fleets(), catalog=gpu_catalogs())
def test_with_known_limits_placement_never_takes_a_rack_past_its_budget(fleet, catalog):
    nodes, power = fleet
    c = Cluster(replace(snapshot(nodes, catalog), power=power))
    for _ in range(4):
        c.step()
        for r in c.snap.replicas:
            if r.state == "pending":
                c.report(r.id, "ready")
        c.wait(TIMINGS.min_lifetime + 60)
        held = rack_draw(c.snap)
        for b in power.budgets:
            assert held.get(b.name, 0.0) <= b.watts, f"rack {b.name}: {held} of {b.watts}"


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(fleet=racked_fleets(), catalog=gpu_catalogs(multi_node=False))
def test_with_no_budget_binding_placement_is_what_it_is_without_budgets(fleet, catalog):
    """Replicas of one node each: levelling breaks ties between equally packed nodes by the
    watts left in their racks, which can leave a later replica over two nodes without its
    pair where plain placement kept one (found by this property: a 4-GPU replica on the
    one free fabric node of a rack). That is the levelling's price, not a budget binding."""
    nodes, power = fleet
    plain = Cluster(snapshot(nodes, catalog))
    # Every GPU's limit reported, and budgets no placement can reach: the same replicas
    # start, as large; only which rack may differ, since load levels across racks.
    roomy = tuple(Budget("rack", r, 10**9) for r in ("r1", "r2"))
    budgeted = Cluster(replace(snapshot(nodes, catalog), power=replace(power, budgets=roomy)))
    readings_only = Cluster(replace(snapshot(nodes, catalog), power=replace(power, budgets=())))
    for _ in range(3):
        want = plain.step()
        got = readings_only.step()
        assert [(s.replica_id, s.shards, s.reason) for s in got.starts] == [
            (s.replica_id, s.shards, s.reason) for s in want.starts
        ]
        assert got.drains == want.drains and got.stops == want.stops
        levelled = budgeted.step()
        assert [
            (s.replica_id, [len(p.gpu_indices) for _, p in s.shards]) for s in levelled.starts
        ] == [(s.replica_id, [len(p.gpu_indices) for _, p in s.shards]) for s in want.starts]
        for cluster in (plain, budgeted, readings_only):
            for r in cluster.snap.replicas:
                if r.state == "pending":
                    cluster.report(r.id, "ready")


def test_draws_add_up_per_rack_with_the_measured_part_beside():
    labels = {"n1": {RACK_LABEL: "r1"}, "n2": {RACK_LABEL: "r1"}, "n3": {}}
    gpus = {"n1": {0: GpuPower(700, 350), 1: GpuPower(700)}, "n2": {0: GpuPower(None, 200)}}
    out = draws(labels, [("n1", (0, 1)), ("n2", (0, 1)), ("n3", (0,))], gpus)
    r1 = out[("rack", "r1")]
    assert (r1.estimated_w, r1.measured_w, r1.unknown_gpus) == (1600, 550, 1)
    assert set(out) == {("rack", "r1")}


# A node's own draw in what a rack is measured to draw: n1 runs a replica on its two GPUs
# drawing 300 W each; n2 idles in the same rack. The per-node share is 250 W when set.
@pytest.mark.parametrize(
    ("own", "node_w", "measured"),
    [
        ({}, None, 600),  # the GPUs alone, as before
        ({}, 250, 1100),  # neither node reports its own: the share for each
        ({"n1": 180}, 250, 1030),  # n1's RAPL in place of its share; n2 keeps the share
        ({"n1": 180, "n2": 90}, 250, 870),  # both measured: no share at all
        ({"n1": 180, "n2": 90}, None, 870),
        ({"n2": 90}, None, 690),
    ],
)
def test_a_nodes_own_measured_draw_replaces_its_share_in_what_a_rack_measures(
    own, node_w, measured
):
    labels = {"n1": {RACK_LABEL: "r1"}, "n2": {RACK_LABEL: "r1"}}
    gpus = {"n1": {0: GpuPower(700, 300), 1: GpuPower(700, 300)}}
    r1 = draws(labels, [("n1", (0, 1))], gpus, Figures(node_w=node_w), own)[("rack", "r1")]
    assert r1.measured_w == measured
    assert r1.estimated_w == 1400  # what placement reserves for the replica is unchanged


@pytest.mark.parametrize(
    ("own", "measured"),
    [
        ({}, None),  # no GPU held, no node reporting: estimates alone are no measurement
        ({"n2": 90}, 340),  # an idle rack measured by its nodes: n2's 90 W, n1's share
    ],
)
def test_a_rack_where_nothing_reports_has_no_measured_draw(own, measured):
    labels = {"n1": {RACK_LABEL: "r1"}, "n2": {RACK_LABEL: "r1"}}
    r1 = draws(labels, [], {}, Figures(node_w=250), own)[("rack", "r1")]
    assert r1.measured_w == measured


# A node's whole draw from its BMC in what a rack is measured to draw: n1 runs a replica on
# its two GPUs drawing 300 W each, its RAPL reads 180 W; n2 idles beside it, reading 90 W of
# RAPL where `own` has it. The per-node share is 250 W. The BMC sees the whole node, so its
# figure stands in place of that node's GPUs, its CPUs and its share: never beside them.
@pytest.mark.parametrize(
    ("own", "whole", "measured"),
    [
        ({"n1": 180}, {}, 1030),  # no BMC: GPUs 600 + RAPL 180 + n2's share 250
        ({"n1": 180}, {"n1": 1400}, 1650),  # n1's BMC alone for n1: 1400 + n2's share 250
        ({}, {"n1": 1400}, 1650),  # with or without its RAPL: the BMC is the whole node
        ({"n1": 180, "n2": 90}, {"n2": 400}, 1180),  # n2's BMC over its RAPL: 600 + 180 + 400
        ({"n1": 180, "n2": 90}, {"n1": 1400, "n2": 400}, 1800),  # both whole: their sum
        ({}, {"n3": 5000}, 1100),  # a node in no rack adds nothing to r1
    ],
)
def test_a_nodes_whole_draw_from_its_bmc_replaces_its_gpus_cpus_and_share(own, whole, measured):
    labels = {"n1": {RACK_LABEL: "r1"}, "n2": {RACK_LABEL: "r1"}, "n3": {}}
    gpus = {"n1": {0: GpuPower(700, 300), 1: GpuPower(700, 300)}}
    figures = Figures(node_w=250)
    r1 = draws(labels, [("n1", (0, 1))], gpus, figures, own, whole)[("rack", "r1")]
    assert r1.measured_w == measured
    assert r1.estimated_w == 1400  # what placement reserves is unchanged by any reading


@pytest.mark.parametrize(
    ("away", "measured"),
    [
        ((), 2830),  # n1's GPUs 600, its RAPL 180, n2's BMC 1,800 and n3's share 250 W
        (("n2",), 1030),  # n2 powered off: its last 1,800 W is no reading now
        (("n1",), 2050),  # n1 unreachable: neither its GPUs' draw nor its RAPL
        (("n3",), 2580),  # n3 away: not even its share
        (("n1", "n2", "n3"), None),  # nothing heard from lately: nothing measured
    ],
)
def test_a_node_away_adds_nothing_to_what_its_rack_measures(away, measured):
    labels = {n: {RACK_LABEL: "r1"} for n in ("n1", "n2", "n3")}
    gpus = {"n1": {0: GpuPower(700, 300), 1: GpuPower(700, 300)}}
    figures = Figures(node_w=250)
    r1 = draws(labels, [("n1", (0, 1))], gpus, figures, {"n1": 180}, {"n2": 1800}, away)
    assert r1[("rack", "r1")].measured_w == measured
    assert r1[("rack", "r1")].estimated_w == 1400  # what placement reserves stays


@given(
    st.sets(st.sampled_from(["n1", "n2", "n3"])),
    st.dictionaries(st.sampled_from(["n1", "n2", "n3"]), st.floats(1, 2000)),
    st.dictionaries(st.sampled_from(["n1", "n2", "n3"]), st.floats(1, 20000)),
)
def test_a_rack_measures_what_it_would_without_its_nodes_away(away, own, whole):
    """Leaving a node out as away is measuring the rack as if that node had no reading,
    no draw and no share: only the estimate keeps it."""
    labels = {n: {RACK_LABEL: "r1"} for n in ("n1", "n2", "n3")}
    gpus = {n: {0: GpuPower(700, 300)} for n in ("n1", "n2", "n3")}
    held = [(n, (0,)) for n in ("n1", "n2", "n3")]
    figures = Figures(node_w=250)
    got = draws(labels, held, gpus, figures, own, whole, away)[("rack", "r1")]
    here = [n for n in labels if n not in away]
    alone = draws(
        {n: labels[n] for n in here},
        [h for h in held if h[0] in here],
        gpus,
        figures,
        own,
        whole,
    ).get(("rack", "r1"))
    if alone is None or alone.measured_w is None:
        assert got.measured_w is None
    else:
        assert got.measured_w == pytest.approx(alone.measured_w)
    everyone = draws(labels, held, gpus, figures, own, whole)[("rack", "r1")]
    assert got.estimated_w == everyone.estimated_w


def test_an_idle_rack_measured_by_one_bmc_has_a_measured_draw():
    labels = {"n1": {RACK_LABEL: "r1"}, "n2": {RACK_LABEL: "r1"}}
    r1 = draws(labels, [], {}, Figures(node_w=250), whole={"n2": 310})[("rack", "r1")]
    assert r1.measured_w == 560  # n2's BMC 310 W and n1's share 250 W
    assert draws(labels, [], {}, Figures(node_w=250))[("rack", "r1")].measured_w is None


@given(
    st.dictionaries(st.sampled_from(["n1", "n2", "n3"]), st.floats(1, 2000)),
    st.dictionaries(st.sampled_from(["n1", "n2", "n3"]), st.floats(1, 20000)),
    st.one_of(st.none(), st.floats(1, 1000)),
)
def test_a_node_read_by_its_bmc_counts_its_bmc_figure_and_nothing_else_of_its_own(
    own, whole, node_w
):
    labels = {n: {RACK_LABEL: "r1", PDU_LABEL: "p1"} for n in ("n1", "n2", "n3")}
    gpus = {"n1": {0: GpuPower(700, 300)}, "n2": {0: GpuPower(700, 450)}}
    held = [("n1", (0,)), ("n2", (0,)), ("n3", (), 8)]
    figures = Figures(per_core_w=10, node_w=node_w)
    plain = draws(labels, held, gpus, figures, own)
    read = draws(labels, held, gpus, figures, own, whole)
    drawn_by = {
        n: (gpus.get(n, {}).get(0, GpuPower()).draw_w or 0.0) + own.get(n, node_w or 0.0)
        for n in ("n1", "n2", "n3")
    }
    for d in (("rack", "r1"), ("pdu", "p1")):
        assert read[d].estimated_w == plain[d].estimated_w
        assert read[d].unknown_gpus == plain[d].unknown_gpus
        assert read[d].measured_w == pytest.approx(
            plain[d].measured_w + sum(w - drawn_by[n] for n, w in whole.items())
        )


@given(
    st.dictionaries(st.sampled_from(["n1", "n2", "n3"]), st.floats(1, 2000)),
    st.one_of(st.none(), st.floats(1, 1000)),
)
def test_a_nodes_reading_changes_only_the_measured_draw_never_the_reserved(own, node_w):
    labels = {n: {RACK_LABEL: "r1", PDU_LABEL: "p1"} for n in ("n1", "n2", "n3")}
    gpus = {"n1": {0: GpuPower(700, 300)}}
    held = [("n1", (0,)), ("n3", (), 8)]
    figures = Figures(per_core_w=10, node_w=node_w)
    plain = draws(labels, held, gpus, figures)
    read = draws(labels, held, gpus, figures, own)
    for d in (("rack", "r1"), ("pdu", "p1")):
        assert read[d].estimated_w == plain[d].estimated_w
        assert read[d].measured_w is not None and plain[d].measured_w is not None
        share = node_w or 0.0
        assert read[d].measured_w == pytest.approx(
            plain[d].measured_w + sum(w - share for w in own.values())
        )


def test_a_large_fleet_spreads_over_racks_too():
    # From 64 nodes placement finds GPUs through an index; with racks it judges every node.
    fleet = [racked(f"a{i:02}", "r1") for i in range(40)] + [
        racked(f"b{i:02}", "r2") for i in range(40)
    ]
    plan = run(snapshot(fleet, [model("chat", min=2)]))
    assert placed_on(plan) == ["a00", "b00"]


def test_headroom_stops_at_a_budget_and_says_why():
    inv = Inventory(
        {"n1": racked("n1", "r1")},
        (),
        power=Power((Budget("rack", "r1", 2000),), limits("n1")),
    )
    chat = model("chat", max=8)
    room = headroom(chat, inv, 0, 8, Policy(), {}, {})
    assert room.more == 2
    assert room.blocked == [
        "node n1 is in rack r1: 1,400 of 2,000 W held, this replica needs ~700 W"
    ]
