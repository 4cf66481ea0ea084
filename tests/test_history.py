"""The history the console's charts read when no Prometheus is named (llmgw/core/history.py):
four rings of 60 slots, a coarser slot the mean of what the finer ones measured, nothing
measured kept as nothing."""

from __future__ import annotations

import math

from hypothesis import given, settings, strategies as st

from fleet.console.samples import node_schema
from llmgw.core.history import POINTS, History, Schema

BYTES = Schema(("cpu", "temp", "power"), (2.0, 1.0, 0.2))
FLOATS = Schema(("rps",))
# A day's boundary, so every ring's first slot starts at T0.
T0 = 1_000_000 * 86400.0


def recorded(history: History, readings: list[dict]) -> float:
    """Record one reading per step from T0; the time of the last."""
    t = T0
    for i, reading in enumerate(readings):
        t = T0 + i * history.step
        history.record(t, reading)
    return t


def test_a_reading_comes_back_in_its_slot_and_a_slot_nothing_measured_is_none():
    history = History(15)
    last = recorded(
        history,
        [
            {"node:a": (BYTES, [40.0, 71.0, 612.0]), "fleet": (FLOATS, [3.5])},
            {"node:a": (BYTES, [41.5, None, 610.0]), "fleet": (FLOATS, [None])},
        ],
    )
    node = history.window("node:a", 0, last)
    assert len(node.times) == POINTS and node.step == 15
    assert node.times[-1] == last and node.times[-2] == T0
    assert node.series["cpu"][-2:] == (40.0, 41.5)
    assert node.series["temp"][-2:] == (71.0, None)
    assert node.series["power"][-2:] == (610.0, 610.0)  # five watts a step
    assert node.series["cpu"][:-2] == (None,) * (POINTS - 2)
    assert history.window("fleet", 0, last).series["rps"][-2:] == (3.5, None)


def test_a_coarser_slot_is_the_mean_of_what_was_measured_in_it():
    history = History(15)
    # Four steps to the minute: 10, none, 30, 50 → 30, and the next minute's first 70.
    last = recorded(
        history,
        [{"node:a": (BYTES, [v, None, None])} for v in (10.0, None, 30.0, 50.0, 70.0)],
    )
    minute = history.window("node:a", 1, last).series["cpu"]
    assert minute[-2:] == (30.0, 70.0)  # the closed minute, and the open one ending now
    hours = history.window("node:a", 2, last).series["cpu"]
    assert hours[-1] == 50.0  # the open six minutes: what the finer rings hold so far
    assert history.window("node:a", 3, last).series["temp"] == (None,) * POINTS


def test_a_group_missing_from_a_step_is_a_gap_and_one_silent_for_a_day_is_forgotten():
    history = History(15)
    history.record(T0, {"node:a": (BYTES, [10.0, 50.0, 100.0]), "node:b": (BYTES, [20.0] * 3)})
    history.record(T0 + 15, {"node:b": (BYTES, [20.0] * 3)})
    assert history.window("node:a", 0, T0 + 15).series["cpu"][-2:] == (10.0, None)
    day = history.spans()[-1]
    history.record(T0 + day + 30, {"node:b": (BYTES, [20.0] * 3)})
    assert history.names() == ["node:b"]
    assert history.window("node:a", 0, T0 + day + 30).series == {}


def test_a_reading_from_a_lap_ago_is_not_shown_again():
    history = History(15)
    history.record(T0, {"fleet": (FLOATS, [1.0])})
    # The next reading a whole ring later lands in the same position.
    later = T0 + 15 * POINTS
    history.record(later, {"fleet": (FLOATS, [2.0])})
    rps = history.window("fleet", 0, later).series["rps"]
    assert rps[-1] == 2.0 and rps[:-1] == (None,) * (POINTS - 1)
    # Half a ring on with nothing recorded: the one reading, and nothing else.
    assert history.window("fleet", 0, later + 15 * 30).series["rps"].count(None) == POINTS - 1


def test_readings_past_a_byte_are_held_at_its_top_and_negative_ones_at_zero():
    history = History(15)
    history.record(T0, {"node:a": (BYTES, [250.0, -5.0, 2000.0])})
    series = history.window("node:a", 0, T0).series
    assert (series["cpu"][-1], series["temp"][-1], series["power"][-1]) == (127.0, 0.0, 1270.0)


def test_a_day_of_5000_nodes_of_eight_gpus_is_held_in_under_45_mb():
    """Four rings of 60 one-byte slots for each of 34 series (CPU, memory, four per GPU):
    8,160 bytes a node, and the rows a block keeps spare as it grows (the issue's bound is
    50 MB; benchmarks/history.py measures the process's memory too)."""
    history = History(15)
    schema = node_schema(tuple(range(8)))
    assert len(schema.names) == 34
    history.record(T0, {f"node:{i}": (schema, [50.0] * 34) for i in range(5000)})
    assert history.nbytes() < 45 * 1024 * 1024
    assert history.window("node:4999", 0, T0).series["gpu7.power"][-1] == 50.0


readings = st.lists(
    st.one_of(st.none(), st.floats(min_value=0, max_value=100, allow_nan=False)),
    min_size=1,
    max_size=300,
)


@settings(max_examples=60, deadline=None)
@given(readings, st.integers(min_value=0, max_value=3))
def test_every_window_is_sixty_slots_each_none_or_within_what_was_measured(values, level):
    history = History(15)
    last = recorded(history, [{"g": (FLOATS, [v])} for v in values])
    got = history.window("g", level, last).series["rps"]
    assert len(got) == POINTS
    measured = [v for v in values if v is not None]
    shown = [v for v in got if v is not None]
    if not measured:
        assert not shown
        return
    assert shown, "something measured must show in every window that covers it"
    low, high = min(measured), max(measured)
    assert all(low - 1e-3 <= v <= high + 1e-3 for v in shown)
    assert not any(math.isnan(v) for v in shown)


@settings(max_examples=40, deadline=None)
@given(readings)
def test_a_percentage_kept_as_a_byte_is_within_half_a_point(values):
    history = History(15)
    schema = Schema(("p",), (2.0,))
    last = recorded(history, [{"g": (schema, [v])} for v in values])
    got = history.window("g", 0, last).series["p"]
    for want, have in zip(values[-POINTS:], got[-len(values[-POINTS:]) :], strict=True):
        assert (want is None) == (have is None)
        if want is not None:
            assert abs(want - have) <= 0.25 + 1e-9


def test_a_failing_sampler_leaves_its_groups_unmeasured_keeps_the_others_and_is_said_once(
    caplog, monkeypatch
):
    from llmgw.core import history as history_module

    def broken(now):
        raise RuntimeError("the database is away")

    monkeypatch.setattr(
        history_module,
        "_samplers",
        {"fleet": broken, "gateway": lambda now: {"gateway": (FLOATS, [4.0])}},
    )
    history = History(15)
    for i in range(3):
        history_module.sample(T0 + 15 * i, history)
    assert history.window("gateway", 0, T0 + 30).series["rps"][-3:] == (4.0, 4.0, 4.0)
    said = [r.getMessage() for r in caplog.records if "fleet's history" in r.getMessage()]
    assert said == [
        "reading the fleet's history failed: the database is away; retrying, and saying so "
        "again only once it works"
    ]
