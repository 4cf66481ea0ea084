"""The sim engine's prefix cache: the pure cache, the prefill time, and what the engine reports.

Nothing here times anything: the prefill time is shown by the pure function,
and the engine is shown to hand that function the right figures.
"""

from __future__ import annotations

import itertools
from typing import Any

import pytest
from hypothesis import given, strategies as st

from llmgw import simengine
from llmgw.simcache import PrefixCache, first_token_seconds
from llmgw.simengine import SimConfig
from tests.simengine.test_sim_engine import CHAT, chat_body, engine, events, metric


def words(text: str) -> list[str]:
    return text.split()


def numbered(count: int, start: int = 0) -> list[str]:
    """`count` distinct words, so no block repeats by chance."""
    return [f"w{i}" for i in range(start, start + count)]


def test_a_repeated_prompt_is_cached_to_its_last_whole_block() -> None:
    cache = PrefixCache(100, block_tokens=4)
    prompt = numbered(10)
    assert cache.lookup(prompt) == 0
    cache.insert(prompt)
    assert cache.lookup(prompt) == 8
    assert cache.lookup(prompt[:7]) == 4
    assert cache.lookup([*prompt, "and", "more", "words"]) == 8
    assert cache.held_tokens == 8


def test_a_prompt_that_differs_in_its_first_token_caches_nothing() -> None:
    cache = PrefixCache(100, block_tokens=4)
    cache.insert(numbered(12))
    assert cache.lookup(["other", *numbered(11, start=1)]) == 0


def test_a_later_block_counts_only_when_every_block_before_it_matches() -> None:
    cache = PrefixCache(100, block_tokens=4)
    head, tail, other = numbered(4), numbered(4, start=4), numbered(4, start=100)
    cache.insert([*other, *tail])
    cache.insert(head)
    # `tail` was only ever seen after `other`: after `head` it is another block.
    assert cache.lookup([*head, *tail]) == 4
    assert cache.lookup([*other, *tail]) == 8
    assert cache.lookup([*numbered(4, start=200), *tail]) == 0


def test_eviction_drops_the_least_recently_used_blocks() -> None:
    cache = PrefixCache(8, block_tokens=4)
    first, second, third = numbered(4), numbered(4, start=10), numbered(4, start=20)
    cache.insert(first)
    cache.insert(second)
    cache.insert(first)  # refreshed: now the second is the oldest
    cache.insert(third)
    assert cache.held_tokens == 8
    assert (cache.lookup(first), cache.lookup(second), cache.lookup(third)) == (4, 0, 4)


def test_a_lookup_does_not_refresh_a_block() -> None:
    cache = PrefixCache(8, block_tokens=4)
    first, second = numbered(4), numbered(4, start=10)
    cache.insert(first)
    cache.insert(second)
    assert cache.lookup(first) == 4
    cache.insert(numbered(4, start=20))
    assert cache.lookup(first) == 0


def test_a_sequence_longer_than_the_cache_keeps_its_head() -> None:
    cache = PrefixCache(8, block_tokens=4)
    cache.insert(numbered(4, start=100))
    cache.insert(numbered(20))
    assert cache.held_tokens == 8
    assert cache.lookup(numbered(20)) == 8
    assert cache.lookup(numbered(4, start=100)) == 0


def test_a_sequence_is_evicted_from_its_tail_first() -> None:
    cache = PrefixCache(12, block_tokens=4)
    cache.insert(numbered(8))
    cache.insert(numbered(4, start=100))
    cache.insert(numbered(4, start=200))  # one block must go: the oldest sequence's tail
    assert cache.lookup(numbered(8)) == 4


def test_an_endless_sequence_is_read_only_as_far_as_the_cache_holds() -> None:
    cache = PrefixCache(12, block_tokens=4)
    cache.insert(f"w{i}" for i in itertools.count())
    assert cache.held_tokens == 12
    assert cache.lookup(numbered(16)) == 12


@pytest.mark.parametrize(("capacity", "block"), [(0, 4), (3, 4), (0, 1)])
def test_a_cache_smaller_than_one_block_caches_nothing(capacity: int, block: int) -> None:
    cache = PrefixCache(capacity, block_tokens=block)
    cache.insert(numbered(40))
    assert cache.held_tokens == 0
    assert cache.lookup(numbered(40)) == 0


@pytest.mark.parametrize(("capacity", "block"), [(-1, 16), (100, 0)])
def test_sizes_that_make_no_cache_are_refused(capacity: int, block: int) -> None:
    with pytest.raises(ValueError, match="prefix"):
        PrefixCache(capacity, block_tokens=block)


operations = st.lists(
    st.tuples(st.booleans(), st.lists(st.sampled_from("abc"), max_size=40)), max_size=30
)


@given(capacity=st.integers(0, 64), block=st.integers(1, 8), ops=operations)
def test_the_cache_stays_in_bounds_whatever_it_is_asked(
    capacity: int, block: int, ops: list[tuple[bool, list[str]]]
) -> None:
    cache = PrefixCache(capacity, block_tokens=block)
    for is_insert, tokens in ops:
        if is_insert:
            cache.insert(tokens)
            # Just inserted, its head is held as far as the cache can hold it.
            held = min(len(tokens) // block, capacity // block) * block
            assert cache.lookup(tokens) == held
        else:
            hit = cache.lookup(tokens)
            assert 0 <= hit <= len(tokens)
            assert hit % block == 0
        assert cache.held_tokens <= capacity
        assert cache.held_tokens % block == 0


@pytest.mark.parametrize(
    ("ttft_ms", "uncached", "rate", "seconds"),
    [
        (50.0, 10_000, 0.0, 0.05),  # a rate of 0: prefill is free, as before
        (0.0, 100, 1000.0, 0.1),
        (50.0, 200, 1000.0, 0.25),
        (10.0, 0, 500.0, 0.01),  # all cached: only the fixed part
        (0.0, 0, 0.0, 0.0),
    ],
)
def test_the_first_token_waits_for_the_prefill_of_what_was_not_cached(
    ttft_ms: float, uncached: int, rate: float, seconds: float
) -> None:
    got = first_token_seconds(
        ttft_ms=ttft_ms, uncached_tokens=uncached, prefill_tokens_per_sec=rate
    )
    assert got == pytest.approx(seconds)


LONG = " ".join(numbered(40))  # two whole blocks of 16 before its last word


def cached_tokens(usage: dict[str, Any]) -> int:
    return usage["prompt_tokens_details"]["cached_tokens"]


async def test_a_repeated_chat_reports_its_cached_tokens_whole_and_streamed() -> None:
    async with engine() as client:
        body = chat_body(LONG, max_tokens=4)
        first = await (await client.post(CHAT, json=body)).json()
        assert cached_tokens(first["usage"]) == 0
        second = await (await client.post(CHAT, json=body)).json()
        assert cached_tokens(second["usage"]) == 32
        streamed = body | {"stream": True, "stream_options": {"include_usage": True}}
        chunks = (await events(await client.post(CHAT, json=streamed)))[:-1]
        assert chunks[-1]["usage"]["prompt_tokens"] == 40
        assert cached_tokens(chunks[-1]["usage"]) == 32

        text = await (await client.get("/metrics")).text()
        assert "# TYPE llmgw_sim:prompt_tokens_total counter" in text
        assert "# TYPE llmgw_sim:prompt_tokens_cached_total counter" in text
        assert "# TYPE llmgw_sim:prefix_cache_hits_total counter" in text
        assert "# TYPE llmgw_sim:prefix_cache_tokens gauge" in text
        assert metric(text, "prompt_tokens_total") == 120
        assert metric(text, "prompt_tokens_cached_total") == 64
        assert metric(text, "prefix_cache_hits_total") == 2
        # 40 prompt words and 4 answer words: two whole blocks.
        assert metric(text, "prefix_cache_tokens") == 32


async def test_a_second_turn_hits_the_first_turn_and_its_answer() -> None:
    async with engine(prefix_block_tokens=4) as client:
        question = " ".join(numbered(20))
        turn = await (await client.post(CHAT, json=chat_body(question, max_tokens=6))).json()
        answer = turn["choices"][0]["message"]
        body = chat_body(question, max_tokens=1)
        body["messages"] += [answer, {"role": "user", "content": "and then what"}]
        again = await (await client.post(CHAT, json=body)).json()
        # 20 question words and 6 answer words were cached as six blocks of 4; the
        # seventh holds the answer's last two words and the new question's first two.
        assert again["usage"]["prompt_tokens"] == 29
        assert cached_tokens(again["usage"]) == 24


async def test_an_exact_repeat_still_computes_its_last_token() -> None:
    async with engine(prefix_block_tokens=2) as client:
        body = {"model": "sim", "prompt": list(range(6)), "max_tokens": 1}
        answers = [await (await client.post("/v1/completions", json=body)).json() for _ in "ab"]
        # All six ids are cached, but the last one is computed again, as vLLM and
        # llama-server do for the logits of the first answer token: its block is not a hit.
        assert [cached_tokens(a["usage"]) for a in answers] == [0, 4]


async def test_a_cache_of_zero_tokens_caches_nothing() -> None:
    async with engine(prefix_cache_tokens=0) as client:
        for _ in range(2):
            answer = await (await client.post(CHAT, json=chat_body(LONG, max_tokens=2))).json()
            assert cached_tokens(answer["usage"]) == 0
        text = await (await client.get("/metrics")).text()
        assert metric(text, "prompt_tokens_total") == 80
        assert metric(text, "prompt_tokens_cached_total") == 0
        assert metric(text, "prefix_cache_hits_total") == 0
        assert metric(text, "prefix_cache_tokens") == 0


async def test_embeddings_are_neither_cached_nor_counted_as_prompts() -> None:
    async with engine() as client:
        for _ in range(2):
            resp = await client.post("/v1/embeddings", json={"input": LONG})
            assert "prompt_tokens_details" not in (await resp.json())["usage"]
        text = await (await client.get("/metrics")).text()
        assert metric(text, "prompt_tokens_total") == 0
        assert metric(text, "prefix_cache_tokens") == 0


async def test_the_engine_waits_for_the_prefill_of_what_the_cache_missed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    asked: list[dict[str, Any]] = []

    def recorded(**figures: Any) -> float:
        asked.append(figures)
        return first_token_seconds(**figures)

    monkeypatch.setattr(simengine, "first_token_seconds", recorded)
    async with engine(ttft_ms=2.0, prefill_tokens_per_sec=1e6) as client:
        body = chat_body(LONG, max_tokens=1)
        await (await client.post(CHAT, json=body)).json()
        await (await client.post(CHAT, json=body | {"stream": True})).read()
    figures = {"ttft_ms": 2.0, "prefill_tokens_per_sec": 1e6}
    assert asked == [figures | {"uncached_tokens": 40}, figures | {"uncached_tokens": 8}]


def test_the_cache_options_reach_the_engine(monkeypatch: pytest.MonkeyPatch) -> None:
    served: list[SimConfig] = []

    async def serve(config: SimConfig, host: str, port: int) -> None:
        served.append(config)

    monkeypatch.setattr(simengine, "_serve", serve)
    assert simengine.main(["--port", "0"]) == 0
    options = ["--prefill-tokens-per-sec", "2500", "--prefix-cache-tokens", "0"]
    assert simengine.main(["--port", "0", *options, "--prefix-block-tokens", "32"]) == 0
    assert [
        (c.prefill_tokens_per_sec, c.prefix_cache_tokens, c.prefix_block_tokens) for c in served
    ] == [
        (0.0, 32768, 16),
        (2500.0, 0, 32),
    ]


@pytest.mark.parametrize(
    "option",
    [
        ["--prefill-tokens-per-sec", "-1"],
        ["--prefill-tokens-per-sec", "nan"],
        ["--prefix-cache-tokens", "-16"],
        ["--prefix-block-tokens", "0"],
        ["--prefix-block-tokens", "1.5"],
    ],
)
def test_bad_cache_options_are_refused(option: list[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        simengine.main(["--port", "1", *option])
    assert exit_info.value.code == 2
