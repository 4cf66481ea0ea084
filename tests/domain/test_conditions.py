"""A domain's condition from its readings: every transition with its hold times, the
hysteresis, throttling first, and missing data that never refuses anything."""

from __future__ import annotations

import pytest
from hypothesis import given, strategies as st

from fleet.domain.conditions import (
    HOT,
    OK,
    UNKNOWN,
    WARM,
    Facility,
    Hold,
    Readings,
    State,
    Thresholds,
    domains_of,
    gpu_readings,
    said,
    signals,
    step,
)

T = Thresholds()  # warm 27 °C, hot 32 °C, band 1 °C, enter 120 s, leave 300 s
MIN = 60.0


def inlet(c: float) -> Readings:
    return Readings(inlet_c=c)


def run(readings: list[tuple[float, Readings | None]], start: State | None = None) -> list[str]:
    """The condition after each (time, readings), from `start` (unknown)."""
    state, out = start or State(), []
    for at, r in readings:
        state = step(state, r, at, T)
        out.append(state.condition)
    return out


def steady(at: float, until: float, r: Readings | None, every: float = 10.0):
    t = at
    while t <= until:
        yield (t, r)
        t += every


def ok_at(t: float) -> State:
    return step(State(), inlet(22), t, T)


@pytest.mark.parametrize(
    ("readings", "after"),
    [
        # unknown -> ok at once: unknown was placed as ok already.
        ([(0, inlet(22))], OK),
        # unknown -> warm only after 2 min above the warm threshold.
        ([(0, inlet(28)), (119, inlet(28))], UNKNOWN),
        ([(0, inlet(28)), (120, inlet(28))], WARM),
        # ok -> warm: 2 min above, not 1:59.
        ([(0, inlet(22)), (10, inlet(28)), (129, inlet(28))], OK),
        ([(0, inlet(22)), (10, inlet(28)), (130, inlet(28))], WARM),
        # ok -> hot straight: 2 min above the hot threshold.
        ([(0, inlet(22)), (10, inlet(33)), (130, inlet(33))], HOT),
        # A single reading starts nothing: above for a minute, then below.
        ([(0, inlet(22)), (10, inlet(35)), (70, inlet(22)), (200, inlet(22))], OK),
        # Warm for a minute then hot: warm 2 min after it first went above warm, hot 2 min
        # after it first went above hot.
        ([(0, inlet(22)), (10, inlet(28)), (70, inlet(33)), (130, inlet(33))], WARM),
        ([(0, inlet(22)), (10, inlet(28)), (70, inlet(33)), (190, inlet(33))], HOT),
        # Anything -> unknown when nothing fresh is said.
        ([(0, inlet(22)), (10, None)], UNKNOWN),
        ([(0, inlet(22)), (10, Readings())], UNKNOWN),
    ],
)  # fmt: skip
def test_entering_a_condition(readings, after):
    assert run(readings)[-1] == after


def warm_since(t: float) -> State:
    s = ok_at(t - 200)
    for at, r in steady(t - 130, t, inlet(28)):
        s = step(s, r, at, T)
    assert s.condition == WARM
    return s


def hot_since(t: float) -> State:
    s = ok_at(t - 200)
    for at, r in steady(t - 130, t, inlet(33)):
        s = step(s, r, at, T)
    assert s.condition == HOT
    return s


@pytest.mark.parametrize(
    ("start", "readings", "after"),
    [
        # warm -> ok: 5 min below, not 4:59.
        ("warm", [(10, inlet(22)), (309, inlet(22))], WARM),
        ("warm", [(10, inlet(22)), (310, inlet(22))], OK),
        # hot -> warm: 5 min below hot while still above warm.
        ("hot", [(10, inlet(28)), (310, inlet(28))], WARM),
        # hot -> ok: 5 min below warm too.
        ("hot", [(10, inlet(22)), (310, inlet(22))], OK),
        # hot, then warm readings for 2 min and ok for 3: below hot 5 min, below warm only 3.
        ("hot", [(10, inlet(28)), (130, inlet(22)), (310, inlet(22))], WARM),
        # A reading back above on the way down starts the wait again.
        ("warm", [(10, inlet(22)), (200, inlet(28)), (210, inlet(22)), (400, inlet(22))], WARM),
        ("warm", [(10, inlet(22)), (200, inlet(28)), (210, inlet(22)), (510, inlet(22))], OK),
        # warm -> hot: 2 min above hot.
        ("warm", [(10, inlet(33)), (130, inlet(33))], HOT),
        # hot -> unknown at once when its data goes stale: placed as ok, said unknown.
        ("hot", [(10, None)], UNKNOWN),
    ],
)  # fmt: skip
def test_leaving_a_condition(start, readings, after):
    origin = {"warm": warm_since, "hot": hot_since}[start](0)

    assert run(readings, origin)[-1] == after


def test_hysteresis_a_temperature_at_the_threshold_it_is_at_must_fall_a_band_under_it():
    s = warm_since(0)
    hovering = run([(10, inlet(26.5)), (400, inlet(26.5))], s)
    under = run([(10, inlet(25.9)), (400, inlet(25.9))], s)

    assert hovering[-1] == WARM  # 26.5 °C is within 1 °C of 27: still at it
    assert under[-1] == OK


@pytest.mark.parametrize(
    ("readings", "level", "why"),
    [
        (Readings(gpus=8, throttled=1), 1, "1 of 8 GPUs thermally throttled"),
        (Readings(gpus=8, throttled=2), 2, "2 of 8 GPUs thermally throttled"),
        # Throttling first among the signals that agree.
        (Readings(inlet_c=33, gpus=4, throttled=4), 2, "4 of 4 GPUs thermally throttled, inlet 33 °C"),
        (Readings(inlet_c=28, gpus=8, throttled=2), 2, "2 of 8 GPUs thermally throttled"),
        (Readings(cooling_alarm=True), 2, "a cooling unit in alarm"),
        (Readings(cooling_alarm=False, inlet_c=20), 0, "inlet 20 °C"),
        (Readings(gpus=2, hottest_gpu_c=86), 1, "a GPU at 86 °C"),
        (Readings(gpus=2, hottest_gpu_c=70), 0, "2 GPUs reporting, none throttled"),
        (Readings(inlet_c=31.5), 1, "inlet 31.5 °C"),
    ],
)  # fmt: skip
def test_the_signals_strongest_first(readings, level, why):
    assert signals(readings, T, 0) == (level, why)


def test_a_hot_rack_is_said_with_its_signal_and_how_long():
    s = ok_at(0)
    s = step(s, inlet(31), 10, T)
    s = step(s, Readings(inlet_c=33), 20, T)
    s = step(s, Readings(inlet_c=33), 140, T)

    assert (
        said(("rack", "r12-07"), s, 140 + 6 * MIN) == "rack r12-07 is hot (inlet 33 °C for 6 min)"
    )
    assert said(("rack", "r1"), State(), 0) == (
        "rack r1's condition is unknown (no fresh reading), treated as ok"
    )


def test_a_node_is_in_its_rack_pdus_row_room_and_zone():
    labels = {
        "llmgw.io/rack": "r1",
        "llmgw.io/pdu": "p-a,p-b",
        "llmgw.io/row": "12",
        "llmgw.io/room": "hall-b",
        "llmgw.io/zone": "sto1",
    }
    assert domains_of(labels) == (
        ("rack", "r1"),
        ("row", "12"),
        ("room", "hall-b"),
        ("pdu", "p-a"),
        ("pdu", "p-b"),
        ("zone", "sto1"),
    )
    assert domains_of({}) == ()


def test_the_nodes_sensors_per_domain():
    gpus = gpu_readings(
        [
            {"index": 0, "temp_c": 80, "throttle": ["sw_thermal"]},
            {"index": 1, "temp_c": 70, "throttle": ["sw_power_cap"]},  # not heat
            {"index": 2},  # said nothing of heat: not counted
        ]
    )
    assert gpus == Readings(gpus=2, throttled=1, hottest_gpu_c=80)


def test_a_node_stands_by_its_worst_domain_and_any_hold():
    hot = hot_since(0)
    fac = Facility(
        {("rack", "r1"): hot, ("pdu", "p1"): warm_since(0), ("rack", "r2"): State()},
        holds=(Hold("pdu", "p9", "breaker work", "fac-team"),),
        now=0,
    )

    r1 = fac.standing({"llmgw.io/rack": "r1", "llmgw.io/pdu": "p1"})
    held = fac.standing({"llmgw.io/rack": "r2", "llmgw.io/pdu": "p9"})

    assert r1 is not None and r1.level == 2 and r1.said.startswith("rack r1 is hot (inlet 33")
    assert held is not None and held.level == 0
    assert held.held == "pdu p9 is held by fac-team: breaker work"
    assert fac.standing({"llmgw.io/rack": "r2"}) is None  # unknown: as ok
    assert fac.standing({}) is None


def test_thresholds_that_cannot_work_are_refused_in_a_sentence():
    assert Thresholds().refusal() is None
    assert "below the hot one" in (Thresholds(warm_inlet_c=35).refusal() or "")
    assert Thresholds(hot_throttled_share=0).refusal()


readings_st = st.one_of(
    st.none(),
    st.builds(
        Readings,
        inlet_c=st.none() | st.floats(-10, 80),
        cooling_alarm=st.none() | st.booleans(),
        gpus=st.integers(0, 16),
        throttled=st.integers(0, 16),
        hottest_gpu_c=st.none() | st.floats(0, 120),
    ),
)


@given(
    st.lists(st.tuples(st.floats(0, 600), readings_st), max_size=30),
    st.integers(1, 5),
)
def test_whatever_the_readings_missing_data_never_refuses_anything(history, gaps):
    """Whatever came before, once a domain's readings are absent it is unknown, and a node in
    it stands as ok: nothing is refused or put behind for data that is missing."""
    state, at = State(), 0.0
    for dt, r in history:
        at += dt
        state = step(state, r, at, T)
    for _ in range(gaps):
        at += 30
        state = step(state, None, at, T)

    fac = Facility({("rack", "r1"): state}, enforce=True, now=at)

    assert state.condition == UNKNOWN
    assert fac.standing({"llmgw.io/rack": "r1"}) is None


@given(st.lists(st.tuples(st.floats(0, 600), readings_st), max_size=30))
def test_no_condition_is_entered_sooner_than_its_hold_time(history):
    """Whatever the readings, a domain goes warm or hot only after they said so for 2 min."""
    state, at = State(), 0.0
    for dt, r in history:
        at += dt
        before = state
        state = step(state, r, at, T)
        if state.level > before.level:
            i = state.level - 1
            assert state.above[i] is not None and at - state.above[i] >= T.enter_s


def test_a_stale_sample_is_absent_but_its_age_is_kept():
    from fleet.domain.conditions import Sample, fresh

    r1, r2 = ("rack", "r1"), ("rack", "r2")
    samples = [
        Sample(r1, Readings(inlet_c=30), at=100, stale_after=120),
        Sample(r1, Readings(gpus=4, throttled=1), at=50, stale_after=60),  # stale at 120
        Sample(r2, Readings(inlet_c=22), at=0, stale_after=60),  # stale
    ]

    readings, newest = fresh(samples, now=120)

    assert readings == {r1: Readings(inlet_c=30)}
    assert newest == {r1: 100, r2: 0}


def test_a_node_is_on_its_pdus_phases_after_its_pdus():
    labels = {
        "llmgw.io/rack": "r1",
        "llmgw.io/pdu": "p-a,p-b",
        "llmgw.io/pdu-phase": "L2,L1",
        "llmgw.io/zone": "sto1",
    }
    assert domains_of(labels) == (
        ("rack", "r1"),
        ("pdu", "p-a"),
        ("pdu", "p-b"),
        ("phase", "p-a/L2"),
        ("phase", "p-b/L1"),
        ("zone", "sto1"),
    )
    # Phases that cannot be read put the node on none (power.phases_of).
    assert ("phase", "p-a/L2") not in domains_of(labels | {"llmgw.io/pdu-phase": "L2"})


PHASED = {"llmgw.io/rack": "r1", "llmgw.io/pdu": "p1", "llmgw.io/pdu-phase": "L2"}


@pytest.mark.parametrize(
    ("states", "holds", "labels", "level", "says", "held"),
    [
        # A held phase takes nothing on its nodes, and only on them.
        ({}, (Hold("phase", "p1/L2", "breaker work", "fac-team"),), PHASED, 0, "",
         "pdu p1 phase L2 is held by fac-team: breaker work"),
        ({}, (Hold("phase", "p1/L1", "breaker work", "fac-team"),), PHASED, None, "", ""),
        # A phase has no condition of its own: its nodes stand by their PDU's.
        ({("pdu", "p1"): "hot"}, (), PHASED, 2, "pdu p1 is hot (inlet 33", ""),
        ({("pdu", "p1"): "hot"}, (), PHASED | {"llmgw.io/pdu-phase": "L3"}, 2, "pdu p1 is hot", ""),
    ],
)  # fmt: skip
def test_a_node_on_a_phase_stands_by_the_phases_hold_and_its_pdus_condition(
    states, holds, labels, level, says, held
):
    fac = Facility({d: hot_since(0) for d in states}, holds=holds, now=0)

    standing = fac.standing(labels)

    if level is None:
        assert standing is None
    else:
        assert standing is not None and standing.level == level
        assert standing.said.startswith(says) and standing.held == held


def test_a_phase_is_said_to_take_its_pdus_condition():
    assert said(("phase", "r12-a/L2"), State(), 0) == (
        "pdu r12-a phase L2 has no condition of its own: it takes pdu r12-a's"
    )
