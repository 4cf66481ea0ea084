"""benchmarks/gateway.py's CPU per streamed answer of 100 tokens (issue 41): its arithmetic,
the check that an answer carries its 100 words, and one loop against a real sim engine."""

from __future__ import annotations

import asyncio
import json
import os
import sys

import httpx
import pytest

from benchmarks import gateway
from benchmarks.gateway import Target, streamed_cpu_figures, streamed_words
from benchmarks.peers import Procs, free_port, wait
from tests.e2e.harness import listener_pid


def _loop(cpu_s: float, answers: int) -> dict:
    return {"cpu_s": cpu_s, "latencies": [0.01] * answers}


def test_cpu_per_answer_is_the_fronts_cpu_over_the_answers_and_each_peer_is_set_against_llmgw():
    loops = {
        "direct": _loop(0.2, 100),
        "llmgw": _loop(1.8, 100),
        "sglang-router": _loop(0.3, 50),
        "vllm-router": _loop(2.7, 120),
    }
    per_answer, over = streamed_cpu_figures(loops)
    assert per_answer == {"direct": 2.0, "llmgw": 18.0, "sglang-router": 6.0, "vllm-router": 22.5}
    # direct is the engine's own CPU, for reference: no ratio to llmgw.
    assert over == {"sglang-router": 0.33, "vllm-router": 1.25}


def test_no_answers_or_no_cpu_read_is_unknown_not_zero():
    loops = {
        "direct": _loop(0.0, 80),  # below /proc's tick
        "llmgw": _loop(1.0, 100),
        "portkey": _loop(0.5, 0),
    }
    per_answer, over = streamed_cpu_figures(loops)
    assert per_answer == {"direct": None, "llmgw": 10.0, "portkey": None}
    assert over == {"portkey": None}


def test_with_llmgw_unknown_every_ratio_is_unknown():
    per_answer, over = streamed_cpu_figures(
        {"llmgw": _loop(1.0, 0), "vllm-router": _loop(0.6, 100)}
    )
    assert per_answer == {"llmgw": None, "vllm-router": 6.0}
    assert over == {"vllm-router": None}


def _event(**choice) -> bytes:
    return b"data: " + json.dumps({"choices": [{"index": 0, **choice}]}).encode() + b"\n\n"


def test_the_words_streamed_are_counted_however_a_proxy_cut_the_events():
    body = (
        _event(delta={"role": "assistant", "content": ""})
        + _event(delta={"content": "alpha"})
        + _event(delta={"content": " beta gam"})  # two tokens in one event, one cut
        + _event(delta={"content": "ma"})
        + _event(delta={}, finish_reason="length")
        + b'data: {"choices": [], "usage": {"completion_tokens": 3}}\n\n'
        + b"data: [DONE]\n\n"
    )
    assert streamed_words(body) == 3
    assert streamed_words(b"data: [DONE]\n\n") == 0


@pytest.fixture
def sim_engine(tmp_path):
    """A real sim engine that streams as fast as it can, as the benchmark's does: (port, key)."""
    procs = Procs(tmp_path)
    port, key = free_port(), "sk-one-key"
    env = {**os.environ, "LLMGW_ENGINE_API_KEY": key}
    procs.spawn("engine", [sys.executable, "-m", "llmgw", "sim-engine", "--port", str(port),
                           "--model", gateway.MODEL, *gateway.SIM_ARGS], env)  # fmt: skip
    try:
        wait("the engine", lambda: httpx.get(f"http://127.0.0.1:{port}/health").status_code == 200)
        yield port, key
    finally:
        procs.stop()


@pytest.mark.e2e
def test_a_loop_of_streamed_answers_counts_the_engines_cpu_over_whole_answers(
    sim_engine, monkeypatch
):
    port, key = sim_engine
    monkeypatch.setattr(gateway, "WARMUP_SECONDS", 0.3)
    monkeypatch.setattr(gateway, "STREAM_SECONDS", 1.0)
    pid = listener_pid(port)
    assert pid is not None
    direct = Target("direct", port, key, lambda: [pid])
    loops = asyncio.run(gateway._streamed_cpu([direct]))
    loop = loops["direct"]
    assert loop["errors"] == 0 and len(loop["latencies"]) > 10
    assert loop["cpu_s"] > 0
    per_answer, over = streamed_cpu_figures(loops)
    assert per_answer["direct"] == round(loop["cpu_s"] / len(loop["latencies"]) * 1000, 3)
    assert over == {}


@pytest.mark.e2e
def test_an_answer_short_of_its_words_stops_the_benchmark_before_it_measures(
    sim_engine, monkeypatch
):
    port, key = sim_engine
    direct = Target("direct", port, key, lambda: [])
    monkeypatch.setattr(gateway, "STREAM_TOKENS", 101)  # asked for 100, as built
    with pytest.raises(RuntimeError, match="direct streamed 100 words, not 101"):
        asyncio.run(gateway._streamed_cpu([direct]))
