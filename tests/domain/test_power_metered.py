"""The facility's meter folded into budgets (docs/facility.md, "Measured by the facility"):
a Prometheus `power_watts` reading is a domain's measured draw, winning over the agents'
GPUs; placement holds the larger of what is reserved and what the meter reads; a stale or
zero reading is no reading, and missing data never refuses anything."""

from __future__ import annotations

import pytest
from hypothesis import given, settings, strategies as st

from fleet.domain.placement import Inventory, Placement
from fleet.domain.power import (
    RACK_LABEL,
    Budget,
    GpuPower,
    Ledger,
    Metered,
    Power,
    measured,
    metered_fresh,
)

from .builders import gpu_node, gpu_profile

ONE = gpu_profile("one", tp=1)
R1 = ("rack", "r1")


def limits(*nodes, watts: float = 700.0, gpus: int = 8) -> dict:
    return {n: {i: GpuPower(watts) for i in range(gpus)} for n in nodes}


@pytest.mark.parametrize(
    ("readings", "now", "fresh"),
    [
        ([], 100.0, {}),
        ([Metered(R1, 5000.0, 90.0, 60.0)], 100.0, {R1: 5000.0}),
        ([Metered(R1, 5000.0, 30.0, 60.0)], 100.0, {}),  # 70 s old, stale after 60
        ([Metered(R1, 5000.0, 40.0, 60.0)], 100.0, {R1: 5000.0}),  # exactly at its limit
        ([Metered(R1, 0.0, 90.0, 60.0)], 100.0, {}),  # zero is unknown
        ([Metered(R1, -3.0, 90.0, 60.0)], 100.0, {}),
        ([Metered(R1, 5000.0, 80.0, 60.0), Metered(R1, 4000.0, 95.0, 60.0)], 100.0, {R1: 4000.0}),
        ([Metered(R1, 5000.0, 95.0, 60.0), Metered(("pdu", "p"), 900.0, 95.0, 60.0)], 100.0,
         {R1: 5000.0, ("pdu", "p"): 900.0}),
    ],
)  # fmt: skip
def test_a_domains_meter_reads_its_newest_fresh_reading(readings, now, fresh):
    assert metered_fresh(readings, now) == fresh


@pytest.mark.parametrize(
    ("agents", "meter", "drawn"),
    [(None, None, None), (1200.0, None, 1200.0), (None, 5000.0, 5000.0),
     (1200.0, 5000.0, 5000.0), (6000.0, 5000.0, 5000.0), (1200.0, 0.0, 1200.0)],
)  # fmt: skip
def test_the_facilitys_meter_wins_over_the_agents_gpus(agents, meter, drawn):
    assert measured(agents, meter) == drawn


def book(metered: dict, cap: float = 4000.0) -> Ledger:
    found = Ledger.of(Power((Budget("rack", "r1", cap),), limits("n1")), {"n1": {RACK_LABEL: "r1"}})
    assert found is not None
    found.take("n1", (0,))  # 700 W counted
    found.meter(metered)
    return found


def test_a_meter_reading_above_what_is_counted_is_held_and_said():
    b = book({R1: 3500.0})
    assert b.level(R1) == 3500.0
    assert b.refusal("n1", (1,)) == (
        "node n1 is in rack r1: 3,500 of 4,000 W held (as its meter reads), "
        "this replica needs ~700 W"
    )
    assert b.left("n1") == 500.0


def test_a_meter_reading_below_what_is_counted_changes_nothing():
    b = book({R1: 300.0})
    assert b.level(R1) == 700.0 and b.refusal("n1", (1,)) is None


def test_a_domain_metered_over_its_limit_takes_nothing_new():
    b = book({R1: 4100.0})
    assert b.over(R1)
    assert "4,100 of 4,000 W held (as its meter reads), over its budget" in str(
        b.refusal("n1", (1,))
    )


def test_what_is_placed_or_freed_moves_the_domain_from_its_meters_reading():
    b = book({R1: 3000.0})
    b.take("n1", (1,))
    assert b.level(R1) == 3700.0
    trial = b.copy()
    trial.take("n1", (0, 1), -1)  # victims freed: their estimate with them
    assert trial.level(R1) == 2300.0 and b.level(R1) == 3700.0


def test_placement_counts_the_meter_and_a_stale_meter_refuses_nothing():
    nodes = {"n1": gpu_node("n1", labels={RACK_LABEL: "r1"})}
    budget = (Budget("rack", "r1", 1000),)
    metered = metered_fresh([Metered(R1, 900.0, 0.0, 60.0)], now=30.0)
    refused = Inventory(nodes, (), power=Power(budget, limits("n1"), metered=metered)).place([ONE])
    assert not isinstance(refused, Placement)
    assert "900 of 1,000 W held (as its meter reads)" in str(refused.reasons)
    stale = metered_fresh([Metered(R1, 900.0, 0.0, 60.0)], now=90.0)
    placed = Inventory(nodes, (), power=Power(budget, limits("n1"), metered=stale)).place([ONE])
    assert isinstance(placed, Placement)


@settings(max_examples=200, deadline=None)
@given(
    counted=st.lists(st.sampled_from([0, 1, 2, 3]), unique=True),
    meter=st.one_of(st.none(), st.floats(0, 10000)),
    ask=st.sampled_from([4, 5, 6, 7]),
)
def test_the_meter_only_ever_adds_to_what_a_domain_holds(counted, meter, ask):
    # Whatever the meter reads (or not), a domain holds at least what is counted, and a
    # replica refused without a meter is refused with one.
    plain = book({})
    plain.take("n1", tuple(counted))
    metered = book({R1: meter} if meter is not None else {})
    metered.take("n1", tuple(counted))
    assert metered.level(R1) >= plain.level(R1)
    if plain.refusal("n1", (ask,)) is not None:
        assert metered.refusal("n1", (ask,)) is not None
