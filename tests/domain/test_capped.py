"""A capped GPU's measured capacity (docs/facility.md, "What a capped replica counts"): a
replica on GPUs held below their default counts its measurement times (limit/default)^k,
a measurement taken capped is not scaled again, and unknown is never a reading."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, strategies as st

from fleet.domain.capped import (
    Capped,
    Caps,
    capped,
    counted,
    factor,
    gpu_share,
    pct,
    replicas_for,
    said,
)


@pytest.mark.parametrize(
    ("limit", "default", "share"),
    [
        (560.0, 700.0, 0.8),
        (700.0, 700.0, 1.0),  # at its default
        (699.5, 700.0, 1.0),  # within a watt: a card's own rounding
        (800.0, 700.0, 1.0),  # raised above the default: no more than measured
        (None, 700.0, None),  # limit not reported: unknown
        (560.0, None, None),  # default not reported: unknown
        (0.0, 700.0, None),  # zero is no reading
        (560.0, 0.0, None),
    ],
)
def test_a_gpus_share_is_its_limit_over_its_default_or_unknown(limit, default, share):
    assert gpu_share(limit, default) == (pytest.approx(share) if share is not None else None)


@pytest.mark.parametrize(
    ("share", "measured", "k", "expected"),
    [
        (0.8, None, 0.6, 0.8**0.6),  # 87.5 %: the brief's and the sim engine's figure
        (0.6, None, 0.6, 0.6**0.6),
        (1.0, None, 0.6, 1.0),  # at its default: all of it
        (None, None, 0.6, 1.0),  # unknown: the measured figure stands
        (0.8, 0.8, 0.6, 1.0),  # measured at the same cap: not scaled again
        (0.6, 0.8, 0.6, 0.75**0.6),  # held lower than it was measured: by that much only
        (1.0, 0.8, 0.6, 1.0),  # uncapped, measured capped: never above the measurement
        (0.5, None, 0.0, 1.0),  # exponent 0: power does not change capacity
        (0.5, None, 1.0, 0.5),
    ],
)
def test_a_replica_counts_its_share_to_the_exponent(share, measured, k, expected):
    assert factor(share, measured, k) == pytest.approx(expected)


def test_a_replica_counts_its_most_capped_gpu_and_names_its_node():
    caps = Caps({"a": {0: 0.9, 1: 0.7}, "b": {0: 0.8}})
    found = capped(caps, [("a", (0, 1)), ("b", (0,))], None)
    assert found == Capped("a", 0.7, pytest.approx(0.7**0.6))
    assert capped(caps, [("a", (2, 3))], None) is None  # its own GPUs are not capped
    assert capped(caps, [("c", (0,))], None) is None  # a node nothing is known of
    assert capped(caps, [("b", (0,))], 0.8) is None  # measured at that cap already


def test_the_ready_replicas_count_their_factors_and_one_fewer_loses_the_strongest():
    c = Capped("a", 0.8, 0.875)
    got = counted(2, [c])
    assert got.replicas == pytest.approx(1.875)
    assert got.fewer == pytest.approx(0.875)  # the uncapped one stopped
    both = counted(2, [c, Capped("b", 0.6, 0.736)])
    assert both.replicas == pytest.approx(1.611)
    assert both.fewer == pytest.approx(0.736)
    assert counted(0, [c]) == counted(0, [])
    assert counted(3, []).replicas == 3 and counted(3, []).fewer == 2


@pytest.mark.parametrize(
    ("units", "current", "needed"),
    [
        (2.5, [], 3),
        (0.2, [], 1),  # at least one
        (2.0, [1.0, 1.0], 2),
        (2.0, [1.0, 0.875], 3),  # a capped one leaves a replica's worth short
        (1.8, [1.0, 0.875], 2),
        (0.9, [0.875, 1.0], 1),  # the strongest running one first
        (1.0, [1.0, 1.0, 1.0], 1),  # more running than needed: needed stays the figure
        (3.0, [0.5], 4),
    ],
)
def test_replicas_needed_count_the_running_ones_at_their_factors(units, current, needed):
    assert replicas_for(units, current) == needed


def test_the_sentence_names_the_node_the_share_and_the_figures():
    c = Capped("gpu-a", 0.8, 0.8**0.6)
    assert said(c, 1200, None) == (
        "node gpu-a's GPUs are capped to 80 % of their default power: its replica counts "
        "87.5 % of its measured 1,200 tokens/s"
    )
    assert said(Capped("gpu-a", 0.6, 0.75**0.6), 1200, 0.8).endswith(
        "of its measured 1,200 tokens/s at 80 % of their default"
    )
    assert pct(0.75) == "75 %"


shares = st.floats(0.01, 1.0)
exponents = st.floats(0.0, 2.0)


@given(shares, shares, st.one_of(st.none(), shares), exponents)
def test_a_capped_replica_never_counts_more_than_measured_and_less_the_lower_its_limit(
    low, high, measured, k
):
    low, high = min(low, high), max(low, high)
    f_low, f_high = factor(low, measured, k), factor(high, measured, k)
    assert 0.0 < f_low <= f_high <= 1.0


@given(st.floats(1.0, 1000.0), st.floats(1.0, 1000.0), st.floats(1.0, 1000.0), exponents)
def test_a_lower_limit_never_counts_more(limit_a, limit_b, default, k):
    a, b = gpu_share(limit_a, default), gpu_share(limit_b, default)
    assert a is not None and b is not None
    if limit_a <= limit_b:
        assert factor(a, None, k) <= factor(b, None, k) <= 1.0


@given(st.floats(0.0, 20.0), st.lists(st.floats(0.01, 1.0), max_size=8))
def test_capped_replicas_never_need_fewer_than_uncapped_ones(units, current):
    assert replicas_for(units, current) >= replicas_for(units, [1.0] * len(current)) >= 1


@given(st.integers(0, 40), st.integers(0, 10))
def test_with_none_capped_the_need_is_the_throughput_over_a_replicas_rounded_up(whole, running):
    units = whole / 4
    assert replicas_for(units, [1.0] * running) == max(math.ceil(units), 1)


# Through the autoscaler (measured.py), on a pass over a simulated cluster.


def _llama(measured=(4, 200.0), **more):
    from fleet.domain.types import Measured

    from .test_measured import two_nodes_llama

    return two_nodes_llama({("llama", "tp4"): Measured(*measured, **more)})


def _nodes_of(c, state="ready") -> list[str]:
    return [s.node_id for r in c.snap.replicas if r.state == state for s in r.shards]


def _capped(c, node: str, share: float) -> None:
    c.change(caps=Caps({node: dict.fromkeys(range(8), share)}))


def test_a_capped_replica_at_its_measured_concurrency_is_busy_and_scales_up():
    from fleet.domain.types import Load

    from .test_measured import TIMINGS, hold, live

    c = _llama()
    hold(c, Load(running=4, waiting=0), TIMINGS.scale_up_after + 1)
    assert live(c) == 1, "four in flight is what one replica was measured to serve"
    [node] = _nodes_of(c)
    _capped(c, node, 0.8)
    hold(c, Load(running=4, waiting=0), TIMINGS.scale_up_after + 1)
    assert live(c) == 2


def test_a_measurement_at_the_same_cap_is_not_scaled_again():
    from fleet.domain.types import Load

    from .test_measured import TIMINGS, hold, live

    c = _llama(power_share=0.8)
    [node] = _nodes_of(c)
    _capped(c, node, 0.8)
    hold(c, Load(running=4, waiting=0), TIMINGS.scale_up_after + 1)
    assert live(c) == 1


def test_a_capped_replica_is_not_counted_whole_when_one_fewer_is_weighed():
    from fleet.domain.types import Load

    from .test_measured import TIMINGS, live

    c = _llama()
    c.set_state("llama", extra=1)
    c.step()
    for r in c.snap.replicas:
        if r.state == "pending":
            c.report(r.id, "ready")
    assert live(c) == 2
    _capped(c, _nodes_of(c)[0], 0.5)  # counts 0.5 ** 0.6 = 66 %

    def quiet_for(load: Load) -> None:
        for _ in range(3):
            c.change(loads={"llama": load})
            c.step()
            c.wait(TIMINGS.scale_down_after + 1)
            c.step()
            c.all_stopped()

    # Two running: uncapped, one replica's 70 % of 4 (2.8) holds them; here the one left
    # may be the capped one, whose 70 % of 2.6 does not.
    quiet_for(Load(running=2, waiting=0))
    assert live(c) == 2
    quiet_for(Load(running=1, waiting=0))
    assert live(c) == 1
