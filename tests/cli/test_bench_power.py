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
from llmgw.cli.bench_power import (
    SAME_SHARE,
    Drawn,
    HeldTo,
    PowerSample,
    ShareSample,
    held_text,
    held_to,
    mean_draw,
    power_sample,
    share_sample,
)


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


# The share of their default power limit the replicas' GPUs were held to (power_share)


def held(node: str, *limits: tuple[float | None, float | None], first: int = 0) -> dict[str, Any]:
    """A shard whose GPUs are held to (limit, default) watts each; None: not said."""
    gpus = [
        {"index": first + i, "power_w": 300.0, "power_limit_w": lim, "power_default_w": dflt}
        for i, (lim, dflt) in enumerate(limits)
    ]
    return {"node": node, "gpus": gpus, "cpu_power_w": None}


CAP = (560.0, 700.0)  # 80 %
FULL = (700.0, 700.0)


@pytest.mark.parametrize(
    ("view", "sample"),
    [
        # Each replica's share is its most held GPU's, as a capped replica counts (capped.py).
        (answer([held("g1", CAP, CAP)], [held("g2", CAP)]),
         ShareSample((("r0", "g1", 0.8), ("r1", "g2", 0.8)))),
        (answer([held("g1", FULL), held("g2", CAP)]), ShareSample((("r0", "g2", 0.8),))),
        (answer([held("g1", FULL, (350.0, 700.0))]), ShareSample((("r0", "g1", 0.5),))),
        # Within a watt of the default is the default; raised past it counts as the default.
        (answer([held("g1", (699.5, 700.0))]), ShareSample((("r0", "g1", 1.0),))),
        (answer([held("g1", (800.0, 700.0))]), ShareSample((("r0", "g1", 1.0),))),
        # A GPU not saying its limit or its default: unknown, and whose is said.
        (answer([held("g1", CAP, (None, 700.0))], [held("g2", (560.0, None))]),
         ShareSample(silent=("node g1's GPUs report no power limit",
                             "node g2's GPUs report no default power limit"))),
        (answer([held("g1", (0, 700.0))]), ShareSample(silent=("node g1's GPUs report no power limit",))),
        # Replicas on CPUs have no share, and say nothing; no replica ready, or no answer: no sample.
        (answer([cpu_shard("c1", 120)], [held("g1", CAP)]), ShareSample((("r1", "g1", 0.8),))),
        (answer([cpu_shard("c1", 120)]), ShareSample()),
        (answer(), None),
        ({"detail": "Not Found"}, None),
    ],
)  # fmt: skip
def test_a_sample_says_each_replicas_share_of_its_default_power_limit_or_why_not(view, sample):
    assert share_sample(view) == sample


def at(*replicas: tuple[str, str, float]) -> ShareSample:
    return ShareSample(tuple(replicas))


CHANGED = (
    "node g1's GPUs' power limit changed while the level ran (from 80 % to 100 % of their "
    "default), so the figure would mix two capacities"
)
MIXED = (
    "its replicas were held to different shares of their default power limit (80 % on node "
    "g1, 100 % on node g2), so the figure would mix two capacities"
)


@pytest.mark.parametrize(
    ("samples", "share"),
    [
        ([at(("r0", "g1", 0.8), ("r1", "g2", 0.8))] * 3, HeldTo(0.8)),
        ([at(("r0", "g1", 1.0))] * 2, HeldTo(1.0)),
        ([at(("r0", "g1", 0.8)), at(("r0", "g1", 0.8015))], HeldTo(0.8)),  # a card's rounding
        # A limit that changed while the level ran: its figure is of two capacities.
        ([at(("r0", "g1", 0.8)), at(("r0", "g1", 1.0))], HeldTo(None, (CHANGED,))),
        ([at(("r0", "g1", 0.8)), at(("r0", "g1", 0.8)), at(("r0", "g1", 1.0))],
         HeldTo(None, (CHANGED,))),
        # Drifting a little each time but further than one cap in all: changed all the same.
        ([at(("r0", "g1", 0.8)), at(("r0", "g1", 0.797)), at(("r0", "g1", 0.803))],
         HeldTo(None, (CHANGED.replace("80 % to 100 %", "80 % to 79.7 %"),))),
        ([at(("r0", "g1", 0.8), ("r1", "g2", 1.0))], HeldTo(None, (MIXED,))),
        # Unknown in one sample: unknown, each reason said once.
        ([at(("r0", "g1", 0.8)), ShareSample(silent=("a",)), ShareSample(silent=("a", "b"))],
         HeldTo(None, ("a", "b"))),
        # No GPU sampled (replicas on CPUs), or no sample: nothing to record, nothing to say.
        ([ShareSample(), ShareSample()], HeldTo()),
        ([], HeldTo()),
    ],
)  # fmt: skip
def test_a_levels_share_is_one_held_throughout_else_unknown_with_why(samples, share):
    assert held_to(samples) == share


shares = st.floats(0.05, 1.0)
replica_shares = st.lists(
    st.tuples(st.sampled_from(["r0", "r1", "r2"]), st.sampled_from(["g1", "g2"]), shares),
    max_size=3,
    unique_by=lambda r: r[0],
)
share_samples = st.one_of(
    st.builds(lambda rs: ShareSample(tuple(rs)), replica_shares),
    st.builds(ShareSample, st.just(()), st.tuples(st.sampled_from(["a", "b"]))),
)


@given(st.lists(share_samples, max_size=6))
def test_a_known_share_is_one_every_sample_held_and_unknown_stays_unknown(samples):
    found = held_to(samples)
    sampled = [s for sample in samples for _, _, s in sample.replicas]

    if any(sample.silent for sample in samples):
        assert found.share is None
        assert set(found.silent) == {why for sample in samples for why in sample.silent}
    elif found.share is not None:
        assert 0 < found.share <= 1 and found.share in sampled
        assert all(abs(s - found.share) <= SAME_SHARE for s in sampled)
    elif sampled:
        assert found.silent  # unknown where GPUs were sampled: always with why
        assert max(sampled) - min(sampled) > SAME_SHARE


@pytest.mark.parametrize(
    ("share", "text"),
    [
        (0.8, "its GPUs were held to 80 % of their default power limit there"),
        (0.8747, "its GPUs were held to 87.5 % of their default power limit there"),
        (1.0, None),  # at their default: nothing to say
        (None, None),
    ],
)
def test_the_bench_says_when_its_gpus_were_held_below_their_default(share, text):
    assert held_text(share) == text


def capped_level(*shares: ShareSample | None) -> LevelSample:
    result = RequestResult(ok=True, ttft_ms=100, tpot_ms=20, completion_tokens=62)
    looks = tuple(EngineLook(power=PowerSample(600), held=s) for s in shares)
    return LevelSample(concurrency=8, wall_s=1.0, results=(result,), looks=looks)


def test_a_capacity_measured_while_capped_says_so_and_saves_its_share():
    j = judge([capped_level(at(("r0", "g1", 0.8)), None)], Slo(ttft_p95_ms=500))

    assert j.capacity is not None and j.capacity.power_share == 0.8
    assert verdict(j, model="llama", last_tried=16, interrupted=False)[1:3] == [
        "its replicas drew 600 W on average there, 0.103 tokens per watt",
        "its GPUs were held to 80 % of their default power limit there",
    ]
    body = per_replica(j.capacity, ReplicaBasis(2, "a100"))
    assert body["power_share"] == 0.8  # a share, not divided among the replicas
    CapacityIn(**body)


@pytest.mark.parametrize(
    "share",
    [
        at(("r0", "g1", 1.0)),  # at the default: stored as nothing, which says the default
        ShareSample(silent=("node g1's GPUs report no default power limit",)),  # unknown
        ShareSample(),  # on CPUs
    ],
)
def test_a_share_at_the_default_or_unknown_is_not_saved(share):
    j = judge([capped_level(share)], Slo(ttft_p95_ms=500))

    assert j.capacity is not None
    assert "power_share" not in per_replica(j.capacity, ReplicaBasis(1, "a100"))
    assert not any(
        "held to" in line for line in verdict(j, model="llama", last_tried=16, interrupted=False)
    )
    assert j.capacity.power_share_silent == share.silent
