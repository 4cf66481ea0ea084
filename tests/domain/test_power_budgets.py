"""Budgets as the design has them (docs/facility.md, "Power budgets"): a safety margin, dual
feeds at the smaller feed's derated rating, a declared draw winning over the estimate, CPU
replicas by their cores, each node's own share and a rack's other equipment, a domain over
its limit taking nothing new, and load levelled by the headroom left."""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from fleet.domain.placement import Inventory, Placement
from fleet.domain.power import (
    PDU_LABEL,
    RACK_LABEL,
    Budget,
    Figures,
    GpuPower,
    Ledger,
    Power,
    budget_refusal,
    domains_of,
    feed_cap,
)

from .builders import cpu_node, cpu_profile, gpu_node, gpu_profile

ONE = gpu_profile("one", tp=1)


def ledger(*budgets: Budget, nodes=None, gpus=None, figures=Figures()) -> Ledger:
    labels = nodes or {"n1": {RACK_LABEL: "r1"}}
    found = Ledger.of(Power(budgets, gpus or {}, figures=figures), labels)
    assert found is not None
    return found


def limits(*nodes, watts: float = 700.0, gpus: int = 8, draw: float | None = None) -> dict:
    return {n: {i: GpuPower(watts, draw) for i in range(gpus)} for n in nodes}


@pytest.mark.parametrize(
    ("budget", "limit"),
    [
        (Budget("rack", "r1", 16000), 16000),
        (Budget("rack", "r1", 16000, margin=0.1), 14400),
        (Budget("rack", "r1", 0, feeds=(7400, 9000)), 5920),
        (Budget("rack", "r1", 0, feeds=(9000, 7400), derating=1.0), 7400),
        (Budget("rack", "r1", 0, feeds=(7400, 7400), margin=0.1), 5328),
        (Budget("rack", "r1", 0, feeds=(10000,)), 8000),
    ],
)
def test_the_limit_is_the_cap_less_its_margin_and_a_dual_feed_counts_its_smaller_feed(
    budget, limit
):
    assert budget.limit_w == pytest.approx(limit)


def test_how_the_limit_was_found_is_said():
    assert Budget("rack", "r1", 16000).said == ""
    assert Budget("rack", "r1", 16000, margin=0.1).said == "16,000 W less a 10 % margin"
    assert (
        Budget("pdu", "p", 5920, feeds=(7400, 9000), margin=0.05).said
        == "the smaller feed's 7,400 W at 80 %, less a 5 % margin"
    )
    assert feed_cap((7400, 9000)) == pytest.approx(5920)


@pytest.mark.parametrize(
    ("indices", "cores", "declared", "figures", "need"),
    [
        ((0, 1), None, None, Figures(), 1400.0),  # the GPUs' limits
        ((0, 1), None, 900.0, Figures(), 900.0),  # the declared figure wins
        ((), 8, None, Figures(per_core_w=12.5), 100.0),  # a CPU replica: cores × per core
        ((), 8, None, Figures(), None),  # no per-core figure: unknown
        ((), None, None, Figures(per_core_w=12.5), None),  # no cores: unknown
        ((), 8, 300.0, Figures(per_core_w=12.5), 300.0),  # declared wins for CPUs too
    ],
)
def test_a_replicas_need(indices, cores, declared, figures, need):
    book = ledger(Budget("rack", "r1", 16000), gpus=limits("n1"), figures=figures)
    assert book.need("n1", indices, cores, declared) == need


def test_a_held_replica_counts_its_declared_figure_unless_its_gpus_draw_more():
    gpus = {"n1": {0: GpuPower(700, 650), 1: GpuPower(700, 200)}}
    book = ledger(Budget("rack", "r1", 16000), gpus=gpus)
    assert book.held_w("n1", (0, 1), declared_w=600.0) == 850.0  # measured 850 > 600
    assert book.held_w("n1", (0, 1), declared_w=1000.0) == 1000.0
    assert book.held_w("n1", (0, 1)) == 1400.0  # the limits


def test_each_domain_starts_with_its_nodes_share_and_its_other_equipment():
    nodes = {"n1": {RACK_LABEL: "r1"}, "n2": {RACK_LABEL: "r1"}, "n3": {RACK_LABEL: "r2"}}
    book = ledger(
        Budget("rack", "r1", 16000, other_w=1500),
        Budget("rack", "r2", 16000),
        nodes=nodes,
        figures=Figures(node_w=400),
    )
    assert book.held == {("rack", "r1"): 2300.0, ("rack", "r2"): 400.0}


def test_the_refusal_names_the_domain_the_figures_and_the_margin():
    book = ledger(Budget("rack", "r1", 3500, margin=0.1), gpus=limits("n1"))
    book.take("n1", (0, 1, 2))
    assert book.refusal("n1", (3, 4)) == (
        "node n1 is in rack r1: 2,100 of 3,150 W held (3,500 W less a 10 % margin), "
        "this replica needs ~1,400 W"
    )
    assert book.refusal("n1", (3,)) is None  # 2,800 of 3,150


def test_a_domain_over_its_limit_takes_nothing_new_even_of_unknown_draw():
    # Its GPUs draw more than their limits now (measured), past the budget.
    gpus = {"n1": {i: GpuPower(700 if i < 2 else None, 900 if i < 2 else None) for i in range(4)}}
    book = ledger(Budget("rack", "r1", 1700), gpus=gpus)
    book.take("n1", (0, 1))
    assert book.over(("rack", "r1"))
    said = book.refusal("n1", (2,))  # GPU 2 reports no limit: its need is unknown
    assert (
        said
        == "node n1 is in rack r1: 1,800 of 1,700 W held, over its budget: it takes no new replicas"
    )
    assert book.refusal("n1", (), cores=4) is not None  # nor a CPU replica


def test_a_cpu_replica_counts_against_its_rack_by_its_cores():
    nodes = {"c1": cpu_node("c1", cpus=64, labels={RACK_LABEL: "r1"})}
    inv = Inventory(
        nodes,
        (),
        power=Power((Budget("rack", "r1", 1000),), figures=Figures(per_core_w=50.0)),
    )
    small = cpu_profile("cpu", cores=8)  # 400 W
    assert isinstance(first := inv.place([small], model="m"), Placement)
    inv.reserve("m", first)
    assert isinstance(second := inv.place([small], model="m"), Placement)
    inv.reserve("m", second)
    third = inv.place([small], model="m")
    assert not isinstance(third, Placement)
    assert "800 of 1,000 W held, this replica needs ~400 W" in str(third.reasons)


def test_a_declared_power_watts_wins_over_the_gpus_limits():
    nodes = {"n1": gpu_node("n1", labels={RACK_LABEL: "r1"})}
    power = Power((Budget("rack", "r1", 2000),), limits("n1"))
    declared = replace(ONE, power_watts=1100.0)
    inv = Inventory(nodes, (), power=power)
    placed = inv.place([declared], model="m")
    assert isinstance(placed, Placement)
    inv.reserve("m", placed)
    # 1,100 W held: one more 700 W GPU replica fits (1,800), a declared 1,100 W one does not.
    refused = inv.place([declared], model="m")
    assert "1,100 of 2,000 W held, this replica needs ~1,100 W" in str(refused.reasons)
    assert isinstance(inv.place([ONE], model="m"), Placement)


def test_among_racks_that_fit_the_one_with_most_power_left_takes_the_replica():
    nodes = {
        "a1": gpu_node("a1", labels={RACK_LABEL: "r1"}),
        "b1": gpu_node("b1", labels={RACK_LABEL: "r2"}),
    }
    power = Power(
        (Budget("rack", "r1", 10000, other_w=3000), Budget("rack", "r2", 10000, other_w=1000)),
        limits("a1", "b1"),
    )
    placed = Inventory(nodes, (), power=power).place([ONE])
    assert isinstance(placed, Placement) and placed.shards[0].node_id == "b1"


def test_levelling_never_beats_packing_a_node():
    # b1 is empty in the emptier rack; a1 is part-used: the pack keeps b1 whole.
    nodes = {
        "a1": gpu_node("a1", labels={RACK_LABEL: "r1"}),
        "b1": gpu_node("b1", labels={RACK_LABEL: "r2"}),
    }
    power = Power((Budget("rack", "r1", 10000), Budget("rack", "r2", 10000)), limits("a1", "b1"))
    inv = Inventory(nodes, (), power=power)
    first = inv.place([ONE])
    assert isinstance(first, Placement)
    inv.reserve("", first)
    second = inv.place([ONE])
    assert isinstance(second, Placement)
    assert second.shards[0].node_id == first.shards[0].node_id


def test_a_dual_fed_node_counts_against_both_pdus():
    nodes = {"n1": gpu_node("n1", labels={PDU_LABEL: "pa,pb"})}
    power = Power(
        (Budget("pdu", "pa", 0, feeds=(2000, 5000)), Budget("pdu", "pb", 10000)), limits("n1")
    )
    inv = Inventory(nodes, (), power=power)
    two = gpu_profile("two", tp=2)  # 1,400 W of pa's 1,600
    assert isinstance(placed := inv.place([two]), Placement)
    inv.reserve("", placed)
    refused = inv.place([ONE])
    assert "pdu pa: 1,400 of 1,600 W held (the smaller feed's 2,000 W at 80 %)" in str(
        refused.reasons
    )


@st.composite
def budgets_and_asks(draw):
    margin = draw(st.sampled_from([0.0, 0.05, 0.1, 0.25]))
    feeds = draw(st.sampled_from([(), (3000.0, 4000.0), (5000.0,)]))
    cap = draw(st.integers(1000, 8000))
    other = draw(st.sampled_from([0.0, 200.0]))
    node_w = draw(st.sampled_from([None, 150.0]))
    per_core = draw(st.sampled_from([None, 10.0]))
    budget = Budget("rack", "r1", cap, margin=margin, feeds=feeds, other_w=other)
    asks = draw(
        st.lists(
            st.one_of(
                st.builds(lambda n: gpu_profile(f"g{n}", tp=n), st.sampled_from([1, 2, 4])),
                st.builds(lambda c: cpu_profile(f"c{c}", cores=c), st.sampled_from([2, 8, 16])),
                st.builds(
                    lambda w: replace(ONE, name=f"d{w}", power_watts=float(w)),
                    st.sampled_from([300, 900]),
                ),
            ),
            min_size=1,
            max_size=12,
        )
    )
    return budget, Figures(per_core_w=per_core, node_w=node_w), asks


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=budgets_and_asks())
def test_what_is_reserved_never_passes_the_cap_less_its_margin(case):
    budget, figures, asks = case
    nodes = {
        "g1": gpu_node("g1", labels={RACK_LABEL: "r1"}),
        "g2": gpu_node("g2", labels={RACK_LABEL: "r1"}),
        "c1": cpu_node("c1", cpus=64, labels={RACK_LABEL: "r1"}),
    }
    inv = Inventory(nodes, (), power=Power((budget,), limits("g1", "g2"), figures=figures))
    # Figured here, not by the ledger: the cap, its margin, the base and each replica's draw.
    cap = min(budget.feeds) * 0.8 if budget.feeds else budget.watts
    limit = cap * (1 - budget.margin)
    held = budget.other_w + 3 * (figures.node_w or 0.0)
    for profile in asks:
        placed = inv.place([profile], model=profile.name)
        if not isinstance(placed, Placement):
            continue
        inv.reserve(profile.name, placed)
        if profile.power_watts:
            held += profile.power_watts
        elif profile.gpu_class:
            held += 700.0 * profile.tp
        else:
            held += (profile.cpu_cores or 0) * (figures.per_core_w or 0.0)
        # A domain over its limit from the start takes nothing; else nothing passes it.
        assert held <= limit + 1e-6, f"{held} W held of {limit} W"


def test_a_cpu_replica_of_unknown_draw_is_placed_and_its_reason_says_why():
    nodes = {"c1": cpu_node("c1", cpus=64, labels={RACK_LABEL: "r1"})}
    inv = Inventory(nodes, (), power=Power((Budget("rack", "r1", 10),)))
    placed = inv.place([cpu_profile("cpu", cores=8)], model="m")
    assert isinstance(placed, Placement)
    assert placed.said == (
        "its draw is unknown (LLMGW_POWER_CORE_WATTS, a core's draw, is not set), "
        "so it is not counted against rack r1",
    )


@pytest.mark.parametrize(
    ("figures", "says"),
    [
        ((16000, 0.0, None, 0.8, 0.0), None),
        ((None, 0.1, [7400, 7400], 0.8, 1200.0), None),
        ((None, 0.0, None, 0.8, 0.0), "needs its watts"),
        ((16000, 0.0, [7400], 0.8, 0.0), "not both"),
        ((0, 0.0, None, 0.8, 0.0), "watts must be a number above 0"),
        ((float("nan"), 0.0, None, 0.8, 0.0), "watts must be a number above 0"),
        ((None, 0.0, "7400", 0.8, 0.0), "feeds are a list"),
        ((None, 0.0, [7400, 0], 0.8, 0.0), "a feed's rating"),
        ((None, 0.0, [7400, True], 0.8, 0.0), "a feed's rating"),
        ((16000, 0.6, None, 0.8, 0.0), "margin must be a share from 0 to 0.5"),
        ((16000, -0.1, None, 0.8, 0.0), "margin"),
        ((16000, 0.0, None, 0, 0.0), "derating"),
        ((16000, 0.0, None, 1.5, 0.0), "derating"),
        ((16000, 0.0, None, 0.8, -1), "other_watts"),
    ],
)
def test_figures_that_make_no_budget_are_refused_in_a_sentence(figures, says):
    said = budget_refusal(*figures)
    assert said is None if says is None else says in said


@pytest.mark.parametrize(
    ("labels", "domains"),
    [
        ({}, ()),
        ({RACK_LABEL: "r1"}, (("rack", "r1"),)),
        (
            {RACK_LABEL: "r1", PDU_LABEL: "a,b", "llmgw.io/row": "12", "llmgw.io/room": "hall-b",
             "llmgw.io/site": "sto1", "llmgw.io/zone": "z"},
            (("rack", "r1"), ("pdu", "a"), ("pdu", "b"), ("row", "12"), ("room", "hall-b"),
             ("site", "sto1")),
        ),
        ({"llmgw.io/row": " 12 ", "llmgw.io/site": ""}, (("row", "12"),)),
    ],
)  # fmt: skip
def test_a_node_is_under_the_budgets_of_its_rack_pdus_row_room_and_site(labels, domains):
    assert domains_of(labels) == domains


def test_a_row_budget_binds_the_racks_in_it_together():
    labels = {n: {RACK_LABEL: f"r{n}", "llmgw.io/row": "b"} for n in ("1", "2")}
    book = ledger(Budget("row", "b", 2100), nodes=labels, gpus=limits("1", "2"))
    book.take("1", (0, 1))
    assert book.refusal("2", (0,)) is None
    assert book.refusal("2", (0, 1)) == (
        "node 2 is in row b: 1,400 of 2,100 W held, this replica needs ~1,400 W"
    )
