"""What ``llmgw ctl bench`` says its replicas drew (llmgw/cli/bench_power.py): samples of
``GET /models/{name}/power``, their mean over a level, and unknown where any is."""

from __future__ import annotations

import io
from typing import Any

import pytest
from hypothesis import given, strategies as st

from catalog.schemas import CapacityIn
from llmgw.cli.bench_judge import (
    EngineLook,
    LevelSample,
    ReplicaBasis,
    RequestResult,
    Slo,
    judge,
    per_replica,
    summarize,
    verdict,
)
from llmgw.cli.bench_load import Progress
from llmgw.cli.bench_power import Drawn, PowerSample, mean_draw, power_sample


def gpu_shard(node: str, *watts: float | None, first: int = 0) -> dict[str, Any]:
    gpus = [{"index": first + i, "power_w": w} for i, w in enumerate(watts)]
    return {"node": node, "gpus": gpus, "cpu_power_w": None}


def cpu_shard(node: str, watts: float | None) -> dict[str, Any]:
    return {"node": node, "gpus": [], "cpu_power_w": watts}


def answer(*replicas: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "model": "llama",
        "replicas": [
            {"id": f"r{i}", "profile": "p", "shards": shards} for i, shards in enumerate(replicas)
        ],
    }


@pytest.mark.parametrize(
    ("view", "sample"),
    [
        # Each GPU the ready replicas hold, summed.
        (answer([gpu_shard("g1", 310, 290)], [gpu_shard("g1", 400, first=2)]), PowerSample(1000)),
        # A replica over two nodes: both shards.
        (answer([gpu_shard("g1", 310), gpu_shard("g2", 300)]), PowerSample(610)),
        # One GPU silent: the whole draw is unknown, and whose is said.
        (
            answer([gpu_shard("g1", 310, None)], [gpu_shard("g2", None)]),
            PowerSample(None, ("node g1's GPUs report no draw", "node g2's GPUs report no draw")),
        ),
        (answer([gpu_shard("g1", 0)]), PowerSample(None, ("node g1's GPUs report no draw",))),
        # On CPUs, the node's CPU packages (RAPL), once however many replicas share it.
        (answer([cpu_shard("c1", 120)], [cpu_shard("c1", 120)]), PowerSample(120)),
        (answer([cpu_shard("c1", 120)], [cpu_shard("c2", 95.5)]), PowerSample(215.5)),
        (
            answer([cpu_shard("c1", None)]),
            PowerSample(None, ("node c1 reports no CPU draw (RAPL)",)),
        ),
        # No replica ready, or no answer: no sample at all.
        (answer(), None),
        ({"detail": "Not Found"}, None),
        ("not a mapping", None),
    ],
)
def test_a_sample_is_the_ready_replicas_draw_or_unknown_with_whose(view, sample):
    assert power_sample(view) == sample


@pytest.mark.parametrize(
    ("samples", "drawn"),
    [
        ([PowerSample(600), PowerSample(700), PowerSample(800)], Drawn(700)),
        ([PowerSample(600), PowerSample(None, ("node g1's GPUs report no draw",))],
         Drawn(None, ("node g1's GPUs report no draw",))),
        ([PowerSample(None, ("a",)), PowerSample(None, ("a", "b"))], Drawn(None, ("a", "b"))),
        ([], Drawn()),  # none taken: unknown, and nobody to name
    ],
)  # fmt: skip
def test_a_levels_draw_is_the_mean_of_its_samples_and_unknown_if_any_is(samples, drawn):
    assert mean_draw(samples) == drawn


known = st.builds(PowerSample, st.floats(1, 100_000))
unknown = st.builds(PowerSample, st.none(), st.tuples(st.sampled_from(["a", "b", "c"])))


@given(st.lists(st.one_of(known, unknown), max_size=20))
def test_the_mean_is_absent_exactly_when_a_sample_is_and_else_within_them(samples):
    drawn = mean_draw(samples)

    if not samples or any(s.watts is None for s in samples):
        assert drawn.watts is None
        assert set(drawn.silent) == {w for s in samples for w in s.silent}
    else:
        figures = [s.watts for s in samples if s.watts is not None]
        assert min(figures) - 1e-6 <= drawn.watts <= max(figures) + 1e-6
        assert drawn.silent == ()


def level(*powers: PowerSample | None, tokens: int = 62) -> LevelSample:
    result = RequestResult(ok=True, ttft_ms=100, tpot_ms=20, completion_tokens=tokens)
    looks = tuple(EngineLook(power=p) for p in powers)
    return LevelSample(concurrency=8, wall_s=1.0, results=(result,), looks=looks)


def test_a_measured_capacity_says_its_draw_and_saves_it_per_replica():
    j = judge([level(PowerSample(600), None, PowerSample(640))], Slo(ttft_p95_ms=500))

    assert j.capacity is not None and j.capacity.watts == 620
    assert verdict(j, model="llama", last_tried=16, interrupted=False)[1] == (
        "its replicas drew 620 W on average there, 0.1 tokens per watt"
    )
    body = per_replica(j.capacity, ReplicaBasis(2, "a100"))
    assert (body["tok_per_sec"], body["watts"]) == (31.0, 310.0)  # both halved: same tok/W
    CapacityIn(**body)


def test_an_unmeasured_draw_is_said_and_not_saved():
    silent = PowerSample(None, ("node g2's GPUs report no draw",))
    j = judge([level(PowerSample(600), silent)], Slo(ttft_p95_ms=500))

    assert j.capacity is not None and j.capacity.watts is None
    assert verdict(j, model="llama", last_tried=16, interrupted=False)[1] == (
        "power not measured: node g2's GPUs report no draw"
    )
    assert "watts" not in per_replica(j.capacity, ReplicaBasis(1, "a100"))


def test_a_level_with_no_power_sample_says_nothing_of_power():
    summary = summarize(level(None), Slo(ttft_p95_ms=500))

    assert (summary.watts, summary.power_silent) == (None, ())
    j = judge([level()], Slo(ttft_p95_ms=500))
    assert verdict(j, model="llama", last_tried=16, interrupted=False) == [
        "capacity: 8 requests at once, 62 tok/s (ttft p95 100 ms ≤ 500)"
    ]


def test_the_progress_line_of_a_level_says_its_draw_where_measured():
    stream = io.StringIO()
    progress = Progress(stream, seconds=10)
    progress.level_done(summarize(level(PowerSample(600), PowerSample(640)), Slo()))
    progress.level_done(summarize(level(None), Slo()))

    drawn, unmeasured = stream.getvalue().splitlines()
    assert drawn.endswith(", 62 tok/s, 620 W")
    assert unmeasured.endswith(", 62 tok/s")
