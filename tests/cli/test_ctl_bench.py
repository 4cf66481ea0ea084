"""``llmgw ctl bench``: the judging of a load ramp (pure), and the ramp itself through a
real sim engine standing in for the gateway, with the admin API faked."""

from __future__ import annotations

import asyncio
import io
import json
import os
import signal
import threading
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from hypothesis import given, strategies as st

from catalog.models import Measurement
from catalog.schemas import CapacityIn
from fleet.models import Replica
from llmgw.cli import ctl, ctl_bench
from llmgw.cli.base import CtlError
from llmgw.cli.bench_judge import (
    EngineLook,
    LevelSample,
    LevelSummary,
    ReplicaBasis,
    RequestResult,
    Slo,
    engine_look,
    engines_seen,
    judge,
    ladder,
    per_replica,
    percentile,
    replica_basis,
    summarize,
    verdict,
)
from llmgw.cli.bench_load import Plan, Progress, one_request
from llmgw.core import clock
from llmgw.simengine import SimConfig, start_server
from tests.cli.helpers import FakeServer, run, table
from tests.fleet.builders import cpu_model, model_added

KEY = "gw-key"


def ok(ttft: float = 100.0, tpot: float = 20.0, tokens: int = 10) -> RequestResult:
    return RequestResult(ok=True, ttft_ms=ttft, tpot_ms=tpot, completion_tokens=tokens)


FAILED = RequestResult(ok=False, error="503: no replica ready")


def sample(concurrency: int, *results: RequestResult, wall_s: float = 1.0) -> LevelSample:
    return LevelSample(concurrency=concurrency, wall_s=wall_s, results=tuple(results))


# Percentiles: nearest rank, the same everywhere


@pytest.mark.parametrize(
    "values, expected",
    [
        ([], None),
        ([7.0], 7.0),
        (list(range(1, 21)), 19),  # rank ceil(0.95 * 20) = 19
        (list(range(1, 11)), 10),  # rank ceil(9.5) = 10: the slowest of ten
        (list(range(100, 0, -1)), 95),  # order given does not matter
    ],
)
def test_the_95th_percentile_is_the_nearest_rank(values, expected):
    assert percentile(values) == expected


@given(st.lists(st.floats(0, 1e6, allow_nan=False), min_size=1), st.integers(1, 100))
def test_a_percentile_is_a_value_with_at_least_p_percent_at_or_below_it(values, p):
    got = percentile(values, p)

    assert got in values
    n = len(values)
    assert sum(v <= got for v in values) * 100 >= p * n
    assert sum(v < got for v in values) * 100 < p * n


# One level


def test_a_level_is_summarized_from_its_successful_requests():
    level = summarize(
        sample(2, ok(ttft=100, tpot=20, tokens=10), ok(ttft=300, tpot=40, tokens=30), FAILED),
        Slo(ttft_p95_ms=500, tpot_p95_ms=50),
    )

    assert (level.concurrency, level.requests, level.errors) == (2, 3, 1)
    assert (level.ttft_p95_ms, level.tpot_p95_ms) == (300, 40)
    assert level.tok_per_sec == 40  # the failed request's tokens are not counted
    assert level.meets_slo is False
    assert level.misses == ("1 of 3 requests failed",)
    assert level.first_error == "503: no replica ready"


@pytest.mark.parametrize(
    "slo, meets, misses",
    [
        (Slo(ttft_p95_ms=500, tpot_p95_ms=50), True, ()),
        (Slo(ttft_p95_ms=300), True, ()),  # at the limit is within it
        (Slo(ttft_p95_ms=299), False, ("ttft p95 300 ms > 299",)),
        (Slo(tpot_p95_ms=39.5), False, ("tpot p95 40 ms > 39.5",)),
        (Slo(), None, ()),
    ],
)
def test_a_level_meets_the_slo_when_each_set_figure_is_within_it(slo, meets, misses):
    level = summarize(sample(1, ok(ttft=100, tpot=20), ok(ttft=300, tpot=40)), slo)

    assert (level.meets_slo, level.misses) == (meets, misses)


def test_a_figure_that_could_not_be_measured_does_not_meet_a_limit_on_it():
    one_token = RequestResult(ok=True, ttft_ms=90, tpot_ms=None, completion_tokens=1)

    level = summarize(sample(1, one_token), Slo(ttft_p95_ms=500, tpot_p95_ms=50))

    assert level.meets_slo is False
    assert level.misses == ("no tpot measured",)


def test_a_level_with_no_finished_request_does_not_meet_the_slo():
    level = summarize(sample(4), Slo(ttft_p95_ms=500))

    assert level.meets_slo is False
    assert level.misses == ("no request finished",)


@pytest.mark.parametrize(
    "view, expected",
    [
        ({"slo": {"ttft_p95_ms": 500, "tpot_p95_ms": 50.5}}, Slo(500, 50.5)),
        ({"slo": {"ttft_p95_ms": 500, "tpot_p95_ms": None}}, Slo(500, None)),
        ({"slo": {"ttft_p95_ms": 0, "tpot_p95_ms": 0}}, Slo()),
        ({"slo": None}, Slo()),
        ({}, Slo()),  # a server that does not send it
    ],
)
def test_the_slo_is_read_from_the_model_and_zero_or_absent_is_not_set(view, expected):
    assert Slo.from_view(view) == expected


# The ramp's judgement


def test_the_capacity_is_the_last_level_before_the_first_miss():
    slo = Slo(ttft_p95_ms=500)
    j = judge(
        [sample(1, ok(ttft=100)), sample(2, ok(ttft=200)), sample(4, ok(ttft=900))],
        slo,
    )

    assert [level.meets_slo for level in j.levels] == [True, True, False]
    assert j.capacity is not None and j.capacity.concurrency == 2
    assert j.missed is not None and j.missed.concurrency == 4


def test_a_level_meeting_the_slo_above_one_that_missed_is_not_capacity():
    j = judge([sample(1, ok()), sample(2, FAILED), sample(4, ok())], Slo(ttft_p95_ms=500))

    assert j.capacity is not None and j.capacity.concurrency == 1


def test_with_no_slo_there_is_no_capacity_and_nothing_is_judged():
    j = judge([sample(1, ok()), sample(2, ok())], Slo())

    assert j.capacity is None
    assert [level.meets_slo for level in j.levels] == [None, None]


results = st.one_of(
    st.builds(
        RequestResult,
        ok=st.just(True),
        ttft_ms=st.one_of(st.none(), st.floats(0, 2000)),
        tpot_ms=st.one_of(st.none(), st.floats(0, 200)),
        completion_tokens=st.integers(0, 100),
    ),
    st.just(FAILED),
)
samples = st.lists(st.tuples(st.lists(results, max_size=8), st.floats(0.01, 20)), max_size=7).map(
    lambda levels: [
        LevelSample(concurrency=2**i, wall_s=wall, results=tuple(rs))
        for i, (rs, wall) in enumerate(levels)
    ]
)
slos = st.builds(
    Slo,
    ttft_p95_ms=st.one_of(st.none(), st.floats(1, 2000)),
    tpot_p95_ms=st.one_of(st.none(), st.floats(1, 200)),
)


@given(samples, slos)
def test_the_capacity_met_the_slo_and_so_did_every_level_below_it(levels, slo):
    j = judge(levels, slo)

    if j.capacity is None:
        assert not slo.is_set or not j.levels or j.levels[0].meets_slo is False
        return
    assert slo.is_set
    position = j.levels.index(j.capacity)
    assert all(level.meets_slo for level in j.levels[: position + 1])
    assert j.capacity.errors == 0 and j.capacity.requests > 0
    if slo.ttft_p95_ms is not None:
        assert j.capacity.ttft_p95_ms is not None and j.capacity.ttft_p95_ms <= slo.ttft_p95_ms
    if slo.tpot_p95_ms is not None:
        assert j.capacity.tpot_p95_ms is not None and j.capacity.tpot_p95_ms <= slo.tpot_p95_ms
    # It is the last of that run: the level after it, if one ran, missed.
    if position + 1 < len(j.levels):
        assert j.levels[position + 1].meets_slo is False
        assert j.missed is j.levels[position + 1]


@given(samples, slos)
def test_every_level_counts_each_request_once(levels, slo):
    for level, s in zip(judge(levels, slo).levels, levels, strict=True):
        assert level.requests == len(s.results)
        assert level.errors == sum(not r.ok for r in s.results)
        assert level.tok_per_sec >= 0


def test_the_verdict_names_the_capacity_and_its_figures_against_the_slo():
    slo = Slo(ttft_p95_ms=500, tpot_p95_ms=50)
    j = judge(
        [
            sample(8, ok(ttft=180, tpot=31, tokens=412)),
            sample(16, ok(ttft=620, tpot=40, tokens=500)),
        ],
        slo,
    )

    assert verdict(j, model="llama", last_tried=16, interrupted=False) == [
        "capacity: 8 requests at once, 412 tok/s (ttft p95 180 ms ≤ 500, tpot p95 31 ms ≤ 50)",
        "at 16 requests at once: ttft p95 620 ms > 500",
    ]


def test_the_verdict_says_why_there_is_no_capacity():
    j = judge([sample(1, ok(), FAILED)], Slo(tpot_p95_ms=50))
    assert verdict(j, model="llama", last_tried=64, interrupted=False) == [
        "no capacity: at 1 request at once, 1 of 2 requests failed (503: no replica ready)"
    ]

    j = judge([sample(1, ok())], Slo())
    assert verdict(j, model="llama", last_tried=64, interrupted=False) == [
        "no capacity judged: llama has no SLO (slo.ttft_p95_ms or slo.tpot_p95_ms) "
        "to measure against"
    ]


def test_a_capacity_at_the_last_level_tried_may_be_more():
    j = judge([sample(1, ok()), sample(2, ok())], Slo(ttft_p95_ms=500))

    assert verdict(j, model="llama", last_tried=2, interrupted=False)[1] == (
        "no level tried missed: it may serve more (raise --max-concurrency)"
    )


@pytest.mark.parametrize(
    "most, expected",
    [(1, (1,)), (2, (1, 2)), (64, (1, 2, 4, 8, 16, 32, 64)), (48, (1, 2, 4, 8, 16, 32, 48))],
)
def test_the_levels_double_up_to_the_most(most, expected):
    assert ladder(most) == expected


# Per replica


def replica(profile: str, state: str = "ready", model: str = "llama") -> dict[str, Any]:
    return {"id": f"r-{profile}-{state}", "model": model, "profile": profile, "state": state}


def test_only_ready_replicas_are_counted_and_their_profile_is_taken():
    replicas = [
        replica("a100"),
        replica("a100"),
        replica("a100", "starting"),
        replica("cpu", "failed"),
    ]

    assert replica_basis(replicas, model="llama", profile=None) == ReplicaBasis(2, "a100")


# A command line that could name a profile is wrong (2); no replica ready is the cluster (1).
@pytest.mark.parametrize(
    "replicas, profile, code, message",
    [
        (
            [replica("a100"), replica("h100")],
            None,
            2,
            "llama's ready replicas run profiles a100, h100; "
            "name the one to store the measurement for with --profile",
        ),
        (
            [replica("a100")],
            "h100",
            2,
            "no ready replica of llama runs profile h100 (they run a100)",
        ),
        (
            [replica("a100", "starting")],
            None,
            1,
            "llama has no ready replica, so a measurement could not be stored per replica; "
            "start one (llmgw ctl scale llama --min 1) and run again",
        ),
    ],
)
def test_a_measurement_is_refused_a_basis_it_cannot_be_divided_by(replicas, profile, code, message):
    with pytest.raises(CtlError) as refused:
        replica_basis(replicas, model="llama", profile=profile)

    assert (refused.value.code, refused.value.message) == (code, message)


def test_several_profiles_are_accepted_with_one_named():
    replicas = [replica("a100"), replica("h100"), replica("h100")]

    assert replica_basis(replicas, model="llama", profile="h100") == ReplicaBasis(3, "h100")


@pytest.mark.parametrize(
    "concurrency, ready, per",
    [(8, 1, 8), (8, 2, 4), (8, 3, 2), (2, 4, 1)],
)
def test_the_figures_saved_are_divided_among_the_ready_replicas(concurrency, ready, per):
    capacity = LevelSummary(concurrency, 40, 0, 180.04, 31.0, 412.0, True)

    body = per_replica(capacity, ReplicaBasis(ready, "a100"))

    assert body == {
        "profile": "a100",
        "max_concurrency": per,
        "tok_per_sec": round(412 / ready, 1),
        "ttft_p95_ms": 180.0,
        "tpot_p95_ms": 31.0,
    }
    CapacityIn(**body)  # what the server takes


# One request, against a scripted stream


def plan(url: str = "http://gw.test/v1/chat/completions", **changes: Any) -> Plan:
    fields = {
        "model": "llama",
        "url": url,
        "key": KEY,
        "levels": (1,),
        "seconds": 0.5,
        "max_tokens": 8,
        "request_timeout_s": 5.0,
    }
    return Plan(**(fields | changes))


def sse(*events: Any) -> bytes:
    lines = [e if isinstance(e, str) else json.dumps(e) for e in events]
    return "".join(f"data: {line}\n\n" for line in lines).encode()


def token(text: str) -> dict[str, Any]:
    return {"choices": [{"index": 0, "delta": {"content": text}, "finish_reason": None}]}


FINISH = {"choices": [{"index": 0, "delta": {}, "finish_reason": "length"}]}


async def answered(status: int, content: bytes) -> RequestResult:
    seen: list[httpx.Request] = []

    def handle(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return httpx.Response(status, content=content)

    async with httpx.AsyncClient(transport=httpx.MockTransport(handle)) as client:
        result = await one_request(client, plan())
    body = json.loads(seen[0].content)
    assert body["stream"] is True and body["stream_options"] == {"include_usage": True}
    assert seen[0].headers["Authorization"] == f"Bearer {KEY}"
    return result


async def test_the_tokens_are_counted_from_the_usage_chunk():
    usage = {"choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 6}}

    result = await answered(200, sse(token("a"), token(" b c"), FINISH, usage, "[DONE]"))

    assert result.ok and result.completion_tokens == 6
    assert result.ttft_ms is not None and result.tpot_ms is not None


async def test_without_usage_the_content_chunks_are_counted():
    result = await answered(200, sse(token("a"), token(" b"), token(" c"), FINISH, "[DONE]"))

    assert result.ok and result.completion_tokens == 3


@pytest.mark.parametrize(
    "status, content, error",
    [
        (503, b'{"error": {"message": "llama is loading"}}', "503: llama is loading"),
        (429, b'{"detail": "over the limit"}', "429: over the limit"),
        (200, sse(token("a"), {"error": {"message": "engine died"}}), "stream error: engine died"),
        (200, sse(token("a"), token("b")), "the stream ended before the answer did"),
        (200, sse(token("a"), "{not json"), "the stream sent an event that is not JSON"),
    ],
)
async def test_a_request_fails_on_a_refusal_or_a_broken_stream(status, content, error):
    result = await answered(status, content)

    assert (result.ok, result.error) == (False, error)


async def test_a_request_that_cannot_connect_fails_with_the_reason():
    async with httpx.AsyncClient() as client:
        result = await one_request(client, plan("http://127.0.0.1:9/v1/chat/completions"))

    assert not result.ok and result.error


# Progress


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_a_terminal_gets_a_bar_redrawn_in_place_and_a_line_per_level():
    stream = Terminal()
    progress = Progress(stream, seconds=10)
    level = summarize(sample(8, ok(ttft=180, tpot=31)), Slo(ttft_p95_ms=500))

    progress.draw(8, 5.0, [ok(), FAILED])
    progress.level_done(level)

    text = stream.getvalue()
    assert "\r   8 at once [##########----------] 5.0/10 s, 2 done, 1 failed" in text
    assert text.endswith(
        "\r\x1b[K8 requests at once: 1 requests, 0 errors, ttft p95 180 ms, "
        "tpot p95 31 ms, 10 tok/s, meets the SLO\n"
    )


def test_elsewhere_only_a_line_per_level_is_written():
    stream = io.StringIO()
    progress = Progress(stream, seconds=10)

    progress.draw(8, 5.0, [ok()])
    progress.level_done(summarize(sample(8, FAILED), Slo(ttft_p95_ms=500)))

    assert stream.getvalue() == (
        "8 requests at once: 1 requests, 1 errors, ttft p95 -, tpot p95 -, 0 tok/s, "
        "misses the SLO: 1 of 1 requests failed (503: no replica ready)\n"
    )


# The command, with the admin API faked


def admin(
    slo: dict[str, Any] | None = None,
    replicas: list[dict[str, Any]] | None = None,
) -> FakeServer:
    return FakeServer(
        {
            ("GET", "/api/v1/models/llama"): (200, {"name": "llama", "slo": slo or {}}),
            ("GET", "/api/v1/replicas"): (200, replicas or []),
            ("PUT", "/api/v1/models/llama/capacity"): (200, {"model": "llama"}),
        }
    )


NOWHERE = "http://127.0.0.1:9/v1"  # the discard port: nothing listens


def test_no_gateway_key_is_refused_before_anything_is_sent(capsys, monkeypatch):
    monkeypatch.delenv("LLMGW_API_KEY", raising=False)
    server = admin()

    code, out, err = run(capsys, server, "bench", "llama")

    assert (code, out) == (2, "")
    assert err == (
        "error: no gateway API key: set LLMGW_API_KEY or pass --key "
        "(one made with `llmgw ctl key create`)\n"
    )
    assert server.requests == []


@pytest.mark.parametrize(
    "argv, complaint",
    [
        (["--seconds", "0"], "'0' must be above zero"),
        (["--levels", "1,x"], "'x' is not a whole number"),
        (["--max-concurrency", "0"], "'0' is not between 1 and 1024"),
        (["--max-tokens", "0"], "'0' must be at least 1"),
    ],
)
def test_bad_arguments_are_refused_before_anything_is_sent(capsys, argv, complaint):
    server = admin()

    code, _, err = run(capsys, server, "bench", "llama", "--key", KEY, *argv)

    assert code == 2
    assert complaint in err
    assert "Traceback" not in err
    assert server.requests == []


def test_an_unknown_model_is_the_servers_sentence(capsys):
    server = FakeServer({("GET", "/api/v1/models/nope"): (404, {"detail": "No model named nope."})})

    code, out, err = run(capsys, server, "bench", "nope", "--key", KEY, "--gateway", NOWHERE)

    assert (code, out, err) == (1, "", "error: No model named nope.\n")


def test_save_with_replicas_on_several_profiles_needs_one_named_before_any_load(capsys):
    server = admin({"ttft_p95_ms": 500}, [replica("a100"), replica("h100")])

    code, _, err = run(
        capsys, server, "bench", "llama", "--save", "--key", KEY, "--gateway", NOWHERE
    )

    assert code == 2
    assert err == (
        "error: llama's ready replicas run profiles a100, h100; "
        "name the one to store the measurement for with --profile\n"
    )


def test_save_needs_an_slo_to_judge_by_and_says_so_before_any_load(capsys):
    server = admin({"ttft_p95_ms": 0}, [replica("cpu")])

    code, _, err = run(
        capsys, server, "bench", "llama", "--save", "--key", KEY, "--gateway", NOWHERE
    )

    assert code == 2
    assert err == (
        "error: --save stores the capacity within an SLO, and llama has none "
        "(slo.ttft_p95_ms or slo.tpot_p95_ms); run without --save to measure it anyway\n"
    )


def test_a_gateway_that_cannot_be_reached_is_said_so(capsys):
    code, out, err = run(
        capsys, admin({"ttft_p95_ms": 500}), "bench", "llama", "--key", KEY, "--gateway", NOWHERE
    )

    assert (code, out) == (1, "")
    assert err.splitlines()[-1].startswith(
        "error: the first request through http://127.0.0.1:9/v1/chat/completions failed: "
    )


# The ramp, through a real sim engine in the gateway's place


@pytest.fixture
def engine() -> Iterator[Any]:
    """Starts sim engines on a loop of their own, as the bench runs its own with asyncio.run."""
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    runners = []

    def start(**config: Any) -> str:
        config = {"model": "llama", "api_key": KEY} | config
        started = asyncio.run_coroutine_threadsafe(start_server(SimConfig(**config)), loop)
        runner, port = started.result(timeout=10)
        runners.append(runner)
        return f"http://127.0.0.1:{port}/v1"

    yield start
    for runner in runners:
        asyncio.run_coroutine_threadsafe(runner.cleanup(), loop).result(timeout=10)
    loop.call_soon_threadsafe(loop.stop)
    thread.join(timeout=10)
    loop.close()


FAST = {"ttft_ms": 5.0, "tokens_per_sec": 1000.0, "slots": 8}


def bench(capsys, server: FakeServer, gateway: str, *argv: str) -> tuple[int, str, str]:
    return run(
        capsys,
        server,
        "bench",
        "llama",
        "--gateway",
        gateway,
        "--seconds",
        "0.4",
        "--max-tokens",
        "8",
        *argv,
    )


def test_levels_within_the_slo_give_the_last_as_the_capacity(capsys, engine, monkeypatch):
    monkeypatch.setenv("LLMGW_API_KEY", KEY)
    gateway = engine(**FAST)

    code, out, err = bench(
        capsys, admin({"ttft_p95_ms": 1000, "tpot_p95_ms": 100}), gateway, "--levels", "1,2"
    )

    assert code == 0, err
    tables, sentences = out.split("\n\n")
    rows = table(tables)
    assert rows[0] == [
        "CONCURRENCY",
        "REQUESTS",
        "ERRORS",
        "TTFT_P95",
        "TPOT_P95",
        "TOK/S",
        "WATTS",
        "TOK/W",
        "QUEUED",
        "KV",
        "MEETS_SLO",
    ]
    assert [(r[0], r[2], r[-1]) for r in rows[1:]] == [("1", "0", "yes"), ("2", "0", "yes")]
    assert all(int(r[1]) > 0 for r in rows[1:])
    assert sentences.startswith("capacity: 2 requests at once, ")
    assert "no level tried missed: it may serve more" in sentences
    # Not a terminal: a line per level on stderr, after the one that says what runs.
    lines = err.splitlines()
    assert lines[0] == f"bench llama through {gateway}/chat/completions: 1, 2 at once, 0.4 s each"
    assert lines[1].startswith("1 request at once: ")
    assert lines[2].startswith("2 requests at once: ")


def test_the_ramp_stops_after_the_first_level_that_misses(capsys, engine):
    # One slot: at two at once each request waits for the other (~110 ms) first.
    gateway = engine(ttft_ms=40.0, tokens_per_sec=100.0, slots=1)

    code, out, _ = bench(
        capsys, admin({"ttft_p95_ms": 100}), gateway, "--key", KEY, "--levels", "1,2,4"
    )

    assert code == 0
    rows = table(out.split("\n\n")[0])
    assert [(r[0], r[-1]) for r in rows[1:]] == [("1", "yes"), ("2", "no")]
    sentences = out.split("\n\n")[1].splitlines()
    assert sentences[0].startswith("capacity: 1 request at once, ")
    assert sentences[1].startswith("at 2 requests at once: ttft p95 ")
    assert sentences[1].endswith(" > 100")


def test_save_stores_the_capacity_per_ready_replica(capsys, engine):
    gateway = engine(**FAST)
    server = admin(
        {"ttft_p95_ms": 1000, "tpot_p95_ms": 100},
        [replica("cpu"), replica("cpu"), replica("cpu", "starting")],
    )

    code, out, err = bench(capsys, server, gateway, "--key", KEY, "--levels", "1,2,4", "--save")

    assert code == 0, err
    put = server.last
    assert (put.method, put.url.path) == ("PUT", "/api/v1/models/llama/capacity")
    body = server.body()
    CapacityIn(**body)
    assert body["profile"] == "cpu" and body["max_concurrency"] == 2  # 4 over 2 replicas
    last = out.strip().splitlines()[-1]
    assert last.startswith("saved for llama on profile cpu, per replica: 2 requests at once, ")
    assert last.endswith("(2 ready replicas shared the load; the figures are divided by 2)")


def test_save_is_refused_when_no_level_met_the_slo(capsys, engine):
    gateway = engine(ttft_ms=60.0, tokens_per_sec=1000.0)
    server = admin({"ttft_p95_ms": 10}, [replica("cpu")])

    code, out, err = bench(capsys, server, gateway, "--key", KEY, "--levels", "1,2", "--save")

    assert code == 1
    assert len(table(out.split("\n\n")[0])) == 2  # the ramp stopped after the first level
    assert out.split("\n\n")[1].startswith("no capacity: at 1 request at once, ttft p95 ")
    assert err.splitlines()[-1] == (
        "error: not saved: no level met the SLO, so there is no capacity to store"
    )
    assert {r.method for r in server.requests} == {"GET"}  # nothing saved


def test_with_no_slo_every_level_runs_and_none_is_judged(capsys, engine):
    gateway = engine(**FAST)

    code, out, err = bench(capsys, admin(), gateway, "--key", KEY, "--levels", "1,2")

    assert code == 0
    rows = table(out.split("\n\n")[0])
    assert [(r[0], r[-1]) for r in rows[1:]] == [("1", "-"), ("2", "-")]
    assert out.split("\n\n")[1].startswith("no capacity judged: llama has no SLO")
    assert err.splitlines()[0].endswith("; it has no SLO, so no capacity will be judged")


def test_json_has_the_levels_and_the_capacity(capsys, engine):
    gateway = engine(**FAST)

    code, out, _ = bench(
        capsys, admin({"tpot_p95_ms": 100}), gateway, "--key", KEY, "--levels", "1,2", "--json"
    )

    assert code == 0
    doc = json.loads(out)
    assert [level["concurrency"] for level in doc["levels"]] == [1, 2]
    assert all(level["meets_slo"] for level in doc["levels"])
    assert doc["capacity"]["max_concurrency"] == 2
    assert doc["capacity"]["tok_per_sec"] == doc["levels"][1]["tok_per_sec"] > 0
    assert doc["slo"] == {"ttft_p95_ms": None, "tpot_p95_ms": 100.0}


def test_a_wrong_key_is_the_gateways_sentence_not_a_ramp_of_refusals(capsys, engine):
    gateway = engine(**FAST)

    code, out, err = bench(capsys, admin({"ttft_p95_ms": 500}), gateway, "--key", "wrong")

    assert (code, out) == (1, "")
    assert err.splitlines()[-1].endswith(
        "/chat/completions failed: 401: invalid or missing API key"
    )


@pytest.fixture
def plain_sigint() -> Iterator[None]:
    """Python's own SIGINT handler, which asyncio.run turns into cancelling the ramp,
    whatever another test's server may have installed."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, previous)


def test_ctrl_c_stops_the_ramp_and_shows_what_was_measured(
    capsys, engine, monkeypatch, plain_sigint
):
    gateway = engine(**FAST)
    done = Progress.level_done

    def interrupted_after(self: Progress, level: LevelSummary) -> None:
        done(self, level)
        os.kill(os.getpid(), signal.SIGINT)

    monkeypatch.setattr(Progress, "level_done", interrupted_after)

    code, out, err = bench(
        capsys,
        admin({"ttft_p95_ms": 1000}, [replica("cpu")]),
        gateway,
        "--key",
        KEY,
        "--levels",
        "1,2,4",
        "--save",
    )

    assert code == ctl_bench.INTERRUPTED
    rows = table(out.split("\n\n")[0])
    assert [r[0] for r in rows[1:]] == ["1"]
    capacity, why = out.split("\n\n")[1].splitlines()
    assert capacity.startswith("capacity: 1 request at once, ")
    assert why == "stopped by Ctrl-C before any level missed: it may serve more"
    assert err.splitlines()[-1] == (
        "error: stopped by Ctrl-C; the levels that finished are shown; nothing saved"
    )
    assert "Traceback" not in err


# Against the real REST API


@pytest.mark.django_db
def test_a_saved_bench_is_what_ctl_capacity_lists(capsys, engine, server):
    model_added(cpu_model("llama", slo={"ttft_p95_ms": 1000, "tpot_p95_ms": 100}))
    now = clock.now()
    for i, state in enumerate(("ready", "ready", "starting")):
        Replica.objects.create(
            id=f"r{i}",
            model="llama",
            profile="cpu",
            profile_fp="x",
            state=state,
            state_since=now,
            created_at=now,
        )
    gateway = engine(**FAST)

    argv = ["bench", "llama", "--key", KEY, "--gateway", gateway, "--seconds", "0.3"]
    code = ctl.main([*argv, "--levels", "1,2", "--max-tokens", "8", "--save"], transport=server)
    out = capsys.readouterr().out

    assert code == 0
    assert "saved for llama on profile cpu, per replica: 1 request at once, " in out
    stored = Measurement.objects.get()
    assert (stored.profile, stored.max_concurrency) == ("cpu", 1)
    assert stored.tok_per_sec > 0 and stored.ttft_p95_ms is not None

    assert ctl.main(["capacity"], transport=server) == 0
    assert table(capsys.readouterr().out)[1][:3] == ["llama", "cpu", "1"]


def test_the_queue_and_kv_use_the_engines_said_at_capacity_are_reported(capsys, engine):
    gateway = engine(**FAST)
    said = replica("cpu") | {"engine": {"running": 2, "waiting": 3, "kv_cache": 0.871}}
    quiet = replica("cpu") | {"engine": {"running": 1, "waiting": 0, "kv_cache": None}}
    server = admin({"ttft_p95_ms": 1000}, [said, quiet, replica("cpu", "starting")])

    code, out, err = bench(
        capsys, server, gateway, "--key", KEY, "--levels", "1", "--seconds", "1.5", "--json"
    )

    assert code == 0, err
    doc = json.loads(out)
    assert doc["levels"][0]["engines_waiting_max"] == 3  # summed over the replicas that said
    assert doc["levels"][0]["engines_kv_cache_max"] == 0.871  # on average over those that said
    assert doc["capacity"]["engines_waiting_max"] == 3
    assert doc["verdict"][1] == (
        "there its engines queued at most 3 requests and their KV caches were at most 87% full on average "
        "(scaling's target_waiting and kv_ceiling)"
    )


@pytest.mark.parametrize(
    ("replicas", "look"),
    [
        ([], EngineLook(None, None)),
        # Not ready, or nothing said: no figure, not 0.
        ([{"state": "starting", "engine": {"waiting": 4}}, {"state": "ready"}], EngineLook()),
        ([{"state": "ready", "engine": {"waiting": 0, "kv_cache": None}}], EngineLook(0, None)),
        (
            [{"state": "ready", "engine": {"waiting": 2, "kv_cache": 0.5}},
             {"state": "ready", "engine": {"waiting": 1, "kv_cache": 0.9}}],
            EngineLook(3, 0.7),  # their KV caches on average, as the autoscaler reads them
        ),
        ("not a list", EngineLook()),
    ],
)  # fmt: skip
def test_engine_look(replicas, look):
    assert engine_look(replicas) == look


def test_a_level_no_engine_spoke_at_says_nothing_of_them():
    sample = LevelSample(concurrency=1, wall_s=1.0, results=(), looks=(EngineLook(),))
    level = summarize(sample, Slo())
    assert (level.waiting_max, level.kv_cache_max) == (None, None)
    assert engines_seen(level) is None
    sample = LevelSample(1, 1.0, (), looks=(EngineLook(1, None), EngineLook(0, None)))
    assert engines_seen(summarize(sample, Slo())) == (
        "there its engines queued at most 1 request (scaling's target_waiting and kv_ceiling)"
    )


# The replicas' power, sampled each second from GET /models/{name}/power


def drawing(server: FakeServer, *shards: dict[str, Any]) -> FakeServer:
    """The admin API answering the power of one ready replica per shard given."""
    replicas = [{"id": f"r{i}", "profile": "a100", "shards": [s]} for i, s in enumerate(shards)]
    server.routes[("GET", "/api/v1/models/llama/power")] = (
        200,
        {"model": "llama", "replicas": replicas},
    )
    return server


def gpus_drawing(
    node: str, *watts: float | None, limit: float | None = None, default: float | None = None
) -> dict[str, Any]:
    gpus = [
        {"index": i, "power_w": w, "power_limit_w": limit, "power_default_w": default}
        for i, w in enumerate(watts)
    ]
    return {"node": node, "gpus": gpus, "cpu_power_w": None}


def test_a_bench_on_capped_gpus_says_so_and_saves_the_share_it_ran_at(capsys, engine):
    gateway = engine(**FAST)
    server = drawing(
        admin({"ttft_p95_ms": 1000}, [replica("a100"), replica("a100")]),
        gpus_drawing("gpu-a", 310, 290, limit=560, default=700),
        gpus_drawing("gpu-b", 400, limit=560, default=700),
    )

    code, out, err = bench(
        capsys, server, gateway, "--key", KEY, "--levels", "1", "--seconds", "1.5", "--save"
    )

    assert code == 0, err
    sentences = out.split("\n\n")[1].splitlines()
    drew = sentences.index(next(s for s in sentences if s.startswith("its replicas drew")))
    assert sentences[drew + 1] == "its GPUs were held to 80 % of their default power limit there"
    body = server.body()
    assert body["power_share"] == 0.8  # each replica's GPUs were held to it: not divided
    CapacityIn(**body)
    assert (
        out.strip()
        .splitlines()[-1]
        .endswith(
            ", 500 W (2 ready replicas shared the load; the figures are divided by 2), "
            "its GPUs held to 80 % of their default power limit"
        )
    )


def saved_json(capsys, server, gateway) -> tuple[dict, str]:
    """`ctl bench --save --json` at one level: its JSON document, and all it printed."""
    code, out, err = bench(
        capsys,
        server,
        gateway,
        *("--key", KEY, "--levels", "1", "--seconds", "1.5", "--save", "--json"),
    )
    assert code == 0, err
    return json.loads(out.split("\nsaved for")[0]), out


def test_a_bench_at_the_default_power_limit_saves_no_share_and_says_nothing_of_it(capsys, engine):
    gateway = engine(**FAST)
    server = drawing(
        admin({"ttft_p95_ms": 1000}, [replica("a100")]),
        gpus_drawing("gpu-a", 310, limit=700, default=700),
    )

    doc, out = saved_json(capsys, server, gateway)
    assert (doc["capacity"]["power_share"], doc["capacity"]["power_share_unknown"]) == (1.0, [])
    assert not any("held to" in line for line in doc["verdict"])
    assert "power_share" not in server.body()  # none: at the default
    assert "power share not recorded" not in out


def test_the_replicas_draw_is_shown_and_saved_per_replica_with_the_capacity(capsys, engine):
    gateway = engine(**FAST)
    server = drawing(
        admin({"ttft_p95_ms": 1000}, [replica("a100"), replica("a100")]),
        gpus_drawing("gpu-a", 310, 290),
        gpus_drawing("gpu-b", 400),
    )

    code, out, err = bench(
        capsys, server, gateway, "--key", KEY, "--levels", "1", "--seconds", "1.5", "--save"
    )

    assert code == 0, err
    tables, sentences = out.split("\n\n")
    header, row = table(tables)
    tok_per_sec = float(row[header.index("TOK/S")])
    assert row[header.index("WATTS")] == "1,000"  # both replicas' GPUs, summed
    assert float(row[header.index("TOK/W")]) == pytest.approx(tok_per_sec / 1000, rel=0.01)
    assert "its replicas drew 1,000 W on average there, " in sentences
    body = server.body()
    assert body["watts"] == 500.0  # per replica, divided as the rate is
    CapacityIn(**body)
    saved, unrecorded = out.strip().splitlines()[-2:]
    assert ", 500 W (2 ready replicas shared the load" in saved
    # Their agents say no power limit: saved as at the default, as before, and said why.
    assert "power_share" not in body
    assert unrecorded == (
        "power share not recorded: node gpu-a's GPUs report no power limit; "
        "node gpu-b's GPUs report no power limit"
    )


def test_a_gpu_reporting_no_draw_leaves_the_draw_unknown_said_and_unsaved(capsys, engine):
    gateway = engine(**FAST)
    server = drawing(
        admin({"ttft_p95_ms": 1000}, [replica("a100"), replica("a100")]),
        gpus_drawing("gpu-a", 310, 290),
        gpus_drawing("gpu-b", None),
    )

    doc, out = saved_json(capsys, server, gateway)
    assert doc["levels"][0]["watts"] is None and doc["levels"][0]["tok_per_watt"] is None
    assert doc["capacity"]["power_not_measured"] == ["node gpu-b's GPUs report no draw"]
    assert "power not measured: node gpu-b's GPUs report no draw" in doc["verdict"]
    assert "watts" not in server.body()  # unknown stays unknown: nothing saved for it


@pytest.mark.django_db
def test_what_the_server_answers_for_a_cpu_models_power_is_a_sample(server, no_settle):
    from fleet.models import Node
    from fleet.reconciler.run import reconcile_once
    from llmgw.cli.base import Api
    from llmgw.cli.bench_power import PowerSample, power_sample
    from tests.fleet.builders import node_add

    now = clock.now()
    node_add("cpu-a", now=now, gpus=())
    model_added(cpu_model("llama", scaling={"min": 2}))
    reconcile_once(now=now)
    Replica.objects.update(state="ready")
    api = Api(server="http://testserver", token=os.environ["LLMGW_TOKEN"], transport=server)

    Node.objects.filter(pk="cpu-a").update(load={"cpu_power_w": 180.5}, last_seen=now)
    # Two replicas on one node's CPUs: its draw counted once.
    assert power_sample(api.get("/models/llama/power")) == PowerSample(180.5)

    Node.objects.filter(pk="cpu-a").update(load={}, last_seen=now)
    assert power_sample(api.get("/models/llama/power")) == PowerSample(
        None, ("node cpu-a reports no CPU draw (RAPL)",)
    )


# Committed, as the bench asks the server from threads of its own while a level runs.
@pytest.mark.django_db(transaction=True)
def test_a_bench_saved_on_capped_gpus_is_not_scaled_down_again(capsys, engine, server, no_settle):
    from fleet.models import Node
    from fleet.reconciler.run import reconcile_once
    from llmgw.cli.base import Api
    from tests.fleet.builders import H100, gpu_model, node_add

    now = clock.now()
    node_add("gpu-a", now=now, gpus=(H100, H100))
    model_added(gpu_model("llama", slo={"ttft_p95_ms": 1000}, scaling={"min": 1}))
    reconcile_once(now=now)
    Replica.objects.update(state="ready")
    capped = [
        {"index": i, "power_w": 400, "power_limit_w": 560, "power_default_w": 700} for i in (0, 1)
    ]
    Node.objects.filter(pk="gpu-a").update(load={"gpus": capped}, last_seen=clock.now())
    gateway = engine(**FAST)

    argv = ["bench", "llama", "--key", KEY, "--gateway", gateway, "--seconds", "1.5"]
    code = ctl.main([*argv, "--levels", "1", "--max-tokens", "8", "--save"], transport=server)
    out = capsys.readouterr().out

    assert code == 0, out
    assert "its GPUs were held to 80 % of their default power limit there" in out
    stored = Measurement.objects.get()
    assert (stored.power_share, stored.watts) == (0.8, 400.0)
    # One more replica on the other GPU, held to the same 80 %: it counts all that was
    # measured, as the measurement was taken there; not 0.8 ** 0.6 of it a second time.
    api = Api(server="http://testserver", token=os.environ["LLMGW_TOKEN"], transport=server)
    room = api.get("/models/llama/headroom", limit=1)
    assert (room["tok_per_sec"], room["capped"]) == (pytest.approx(stored.tok_per_sec), [])
    # Held lower than it was measured at, it counts (50 / 80) ** 0.6 of it, and says so.
    halved = [g | {"power_limit_w": 350} for g in capped]
    Node.objects.filter(pk="gpu-a").update(load={"gpus": halved}, last_seen=clock.now())
    room = api.get("/models/llama/headroom", limit=1)
    assert room["tok_per_sec"] == pytest.approx(stored.tok_per_sec * (0.5 / 0.8) ** 0.6)
    assert room["capped"] and "at 80 % of their default" in room["capped"][0]
