"""`llmgw sim-engine`: the OpenAI-compatible stand-in engine.

Timings are tiny and nothing asserts how long anything took: the tests wait
for states (a request queued, a slot freed) and check orders and counts.
"""

from __future__ import annotations

import asyncio
import base64
import json
import math
import os
import signal
import struct
import subprocess
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import aiohttp
import httpx
import openai
import pytest

from llmgw.simengine import VOCABULARY, SimConfig, Slots, start_server

REPO = Path(__file__).resolve().parents[2]
FAST = {"ttft_ms": 1.0, "tokens_per_sec": 2000.0}
# Enough tokens to keep a slot busy for the whole test; it is cut, never finished.
FOREVER = 1_000_000
CHAT = "/v1/chat/completions"


@asynccontextmanager
async def engine(**overrides: Any) -> AsyncIterator[aiohttp.ClientSession]:
    """The engine on a free loopback port, served as `llmgw sim-engine` serves it."""
    runner, port = await start_server(SimConfig(**(FAST | overrides)))
    try:
        async with aiohttp.ClientSession(f"http://127.0.0.1:{port}") as client:
            yield client
    finally:
        await runner.cleanup()


async def eventually(check: Callable[[], Awaitable[bool]]) -> None:
    """Wait for a state; the bound only keeps a broken engine from hanging the run."""
    for _ in range(2000):
        if await check():
            return
        await asyncio.sleep(0.005)
    raise AssertionError("the state never came")


async def health(client: aiohttp.ClientSession) -> dict[str, Any]:
    return await (await client.get("/health")).json()


async def load_is(client: aiohttp.ClientSession, running: int, waiting: int) -> bool:
    state = await health(client)
    return (state["running"], state["waiting"]) == (running, waiting)


def chat_body(text: str = "hello there", **extra: Any) -> dict[str, Any]:
    return {"model": "sim", "messages": [{"role": "user", "content": text}]} | extra


async def events(resp: Any) -> list[Any]:
    """The SSE `data:` payloads of a response, `[DONE]` kept as a string."""
    out = []
    async for line in resp.content:
        if line.startswith(b"data: "):
            data = line[6:].strip().decode()
            out.append(data if data == "[DONE]" else json.loads(data))
    return out


async def hold_a_slot(client: aiohttp.ClientSession) -> Any:
    """A streaming request that has its slot and its first chunk."""
    resp = await client.post(CHAT, json=chat_body(stream=True, max_tokens=FOREVER))
    assert resp.status == 200
    await resp.content.readline()
    return resp


def metric(text: str, name: str) -> float:
    """A series of the sim's own (`requests_total`), or of vLLM's by its whole name."""
    full = name if ":" in name else f"llmgw_sim:{name}"
    for line in text.splitlines():
        if line.startswith(f"{full}{{"):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"{name} is not in /metrics")


@pytest.mark.asyncio
async def test_health_shows_the_model_slots_and_threads() -> None:
    async with engine(model="llama-3-8b", slots=3, threads=6) as client:
        resp = await client.get("/health")
        assert resp.status == 200
        assert await resp.json() == {
            "status": "ok",
            "model": "llama-3-8b",
            "running": 0,
            "waiting": 0,
            "slots": 3,
            "threads": 6,
        }


@pytest.mark.asyncio
async def test_models_lists_the_served_model() -> None:
    async with engine(model="qwen") as client:
        listing = await (await client.get("/v1/models")).json()
        assert listing["object"] == "list"
        assert [(m["id"], m["object"], m["owned_by"]) for m in listing["data"]] == [
            ("qwen", "model", "llmgw-sim")
        ]


@pytest.mark.asyncio
async def test_the_same_prompt_gets_the_same_answer() -> None:
    async with engine() as client:
        answers = []
        for text in ("tell me a story", "tell me a story", "something else entirely"):
            resp = await client.post(CHAT, json=chat_body(text, max_tokens=12))
            answers.append((await resp.json())["choices"][0]["message"]["content"])
        assert answers[0] == answers[1]
        assert answers[0] != answers[2]
        assert all(word in VOCABULARY for word in answers[0].split())


@pytest.mark.asyncio
async def test_usage_counts_what_was_generated() -> None:
    async with engine() as client:
        body = chat_body("one two three", max_tokens=7)
        body["messages"].append({"role": "user", "content": [{"type": "text", "text": "four"}]})
        answer = await (await client.post(CHAT, json=body)).json()
        content = answer["choices"][0]["message"]["content"]
        assert len(content.split()) == 7
        assert answer["usage"] == {
            "prompt_tokens": 4,
            "completion_tokens": 7,
            "total_tokens": 11,
            "prompt_tokens_details": {"cached_tokens": 0},
        }
        assert answer["choices"][0]["finish_reason"] == "length"
        assert answer["object"] == "chat.completion"


@pytest.mark.asyncio
async def test_without_a_limit_the_default_length_is_used_and_ends_with_stop() -> None:
    async with engine(max_tokens=5) as client:
        answer = await (await client.post(CHAT, json=chat_body())).json()
        assert answer["usage"]["completion_tokens"] == 5
        assert answer["choices"][0]["finish_reason"] == "stop"


@pytest.mark.asyncio
async def test_max_completion_tokens_is_honoured_for_chat() -> None:
    async with engine() as client:
        resp = await client.post(CHAT, json=chat_body(max_completion_tokens=3, max_tokens=9))
        assert (await resp.json())["usage"]["completion_tokens"] == 3


@pytest.mark.asyncio
async def test_the_response_echoes_the_requested_model_name() -> None:
    async with engine(model="sim") as client:
        resp = await client.post(CHAT, json=chat_body(model="any-name-at-all", max_tokens=1))
        assert resp.status == 200
        assert (await resp.json())["model"] == "any-name-at-all"


@pytest.mark.asyncio
async def test_a_streamed_chat_answer_matches_the_whole_one() -> None:
    async with engine() as client:
        whole = await (await client.post(CHAT, json=chat_body(max_tokens=6))).json()
        resp = await client.post(CHAT, json=chat_body(max_tokens=6, stream=True))
        assert resp.headers["Content-Type"].startswith("text/event-stream")
        chunks = await events(resp)
        assert chunks[-1] == "[DONE]"
        chunks = chunks[:-1]
        assert {c["object"] for c in chunks} == {"chat.completion.chunk"}
        assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
        text = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks)
        assert text == whole["choices"][0]["message"]["content"]
        reasons = [c["choices"][0]["finish_reason"] for c in chunks]
        assert reasons == [None] * (len(chunks) - 1) + ["length"]
        assert all("usage" not in c for c in chunks)


@pytest.mark.asyncio
async def test_include_usage_adds_a_final_usage_chunk() -> None:
    async with engine() as client:
        body = chat_body("a b", max_tokens=4, stream=True, stream_options={"include_usage": True})
        chunks = (await events(await client.post(CHAT, json=body)))[:-1]
        assert chunks[-1]["choices"] == []
        assert chunks[-1]["usage"] == {
            "prompt_tokens": 2,
            "completion_tokens": 4,
            "total_tokens": 6,
            "prompt_tokens_details": {"cached_tokens": 0},
        }
        assert all(c["usage"] is None for c in chunks[:-1])


@pytest.mark.asyncio
async def test_completions_stream_and_whole_agree() -> None:
    async with engine() as client:
        body = {"model": "sim", "prompt": "once upon a time", "max_tokens": 5}
        whole = await (await client.post("/v1/completions", json=body)).json()
        assert whole["object"] == "text_completion"
        assert whole["usage"] == {
            "prompt_tokens": 4,
            "completion_tokens": 5,
            "total_tokens": 9,
            "prompt_tokens_details": {"cached_tokens": 0},
        }
        assert whole["choices"][0]["finish_reason"] == "length"
        chunks = await events(await client.post("/v1/completions", json=body | {"stream": True}))
        assert chunks[-1] == "[DONE]"
        assert {c["object"] for c in chunks[:-1]} == {"text_completion"}
        assert "".join(c["choices"][0]["text"] for c in chunks[:-1]) == whole["choices"][0]["text"]


@pytest.mark.asyncio
async def test_token_id_prompts_count_one_token_per_id() -> None:
    async with engine() as client:
        body = {"model": "sim", "prompt": [1, 2, 3, 4, 5, 6], "max_tokens": 1}
        answer = await (await client.post("/v1/completions", json=body)).json()
        assert answer["usage"]["prompt_tokens"] == 6


@pytest.mark.asyncio
@pytest.mark.parametrize(
    ("path", "body"),
    [
        (CHAT, b"{not json"),
        (CHAT, b"[1, 2]"),
        (CHAT, json.dumps({"model": "sim"}).encode()),
        (CHAT, json.dumps({"messages": "hello"}).encode()),
        (CHAT, json.dumps({"messages": []}).encode()),
        (CHAT, json.dumps({"messages": [{"content": "no role"}]}).encode()),
        (CHAT, json.dumps(chat_body(max_tokens=-1)).encode()),
        (CHAT, json.dumps(chat_body(max_tokens="5")).encode()),
        (CHAT, json.dumps(chat_body(max_tokens=2.5)).encode()),
        (CHAT, json.dumps(chat_body(max_completion_tokens=True)).encode()),
        (CHAT, json.dumps(chat_body(n=2)).encode()),
        ("/v1/completions", json.dumps({"model": "sim"}).encode()),
        ("/v1/completions", json.dumps({"prompt": ["two", "prompts"]}).encode()),
        ("/v1/completions", json.dumps({"prompt": "x", "max_tokens": -3}).encode()),
        ("/v1/embeddings", json.dumps({"input": 42}).encode()),
        ("/v1/embeddings", json.dumps({"input": "x", "encoding_format": "int8"}).encode()),
    ],
)
async def test_bad_requests_get_a_400_in_the_openai_shape(path: str, body: bytes) -> None:
    async with engine() as client:
        resp = await client.post(path, data=body, headers={"Content-Type": "application/json"})
        assert resp.status == 400
        error = (await resp.json())["error"]
        assert error["type"] == "invalid_request_error"
        assert error["message"]
        assert (await health(client))["running"] == 0
        metrics = await (await client.get("/metrics")).text()
        assert metric(metrics, "requests_total") == 0


@pytest.mark.asyncio
async def test_a_body_over_one_mebibyte_is_refused() -> None:
    async with engine() as client:
        body = json.dumps(chat_body("x" * (1024 * 1024)))
        resp = await client.post(CHAT, data=body, headers={"Content-Type": "application/json"})
        assert resp.status == 413
        assert (await resp.json())["error"]["type"] == "invalid_request_error"


@pytest.mark.asyncio
async def test_a_key_is_required_when_one_was_given() -> None:
    async with engine(api_key="s3cret") as client:
        for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": "s3cret"}):
            for resp in (
                await client.get("/v1/models", headers=headers),
                await client.post(CHAT, json=chat_body(max_tokens=1), headers=headers),
            ):
                assert resp.status == 401
                assert (await resp.json())["error"]["type"] == "authentication_error"
        good = {"Authorization": "Bearer s3cret"}
        assert (await client.post(CHAT, json=chat_body(max_tokens=1), headers=good)).status == 200
        # The agent polls these without the key.
        assert (await client.get("/health")).status == 200
        assert (await client.get("/metrics")).status == 200


@pytest.mark.asyncio
async def test_requests_beyond_the_slots_wait() -> None:
    async with engine(slots=2) as client:
        first, second = await hold_a_slot(client), await hold_a_slot(client)
        third = asyncio.create_task(client.post(CHAT, json=chat_body(max_tokens=2)))
        await eventually(lambda: load_is(client, running=2, waiting=1))
        assert not third.done()
        first.close()
        resp = await third
        assert resp.status == 200
        assert (await resp.json())["usage"]["completion_tokens"] == 2
        second.close()
        await eventually(lambda: load_is(client, running=0, waiting=0))


@pytest.mark.asyncio
async def test_waiting_requests_are_served_in_arrival_order() -> None:
    async with engine(slots=1) as client:
        holder = await hold_a_slot(client)
        finished: list[str] = []

        async def ask(name: str) -> None:
            await (await client.post(CHAT, json=chat_body(name, max_tokens=3))).json()
            finished.append(name)

        tasks = []
        for waiting, name in enumerate(("b", "c", "d"), start=1):
            tasks.append(asyncio.create_task(ask(name)))
            await eventually(lambda n=waiting: load_is(client, running=1, waiting=n))
        holder.close()
        await asyncio.gather(*tasks)
        assert finished == ["b", "c", "d"]


@pytest.mark.asyncio
async def test_metrics_show_running_waiting_and_cache_use() -> None:
    async with engine(slots=2) as client:
        await (await client.post(CHAT, json=chat_body(max_tokens=1))).json()
        holders = [await hold_a_slot(client), await hold_a_slot(client)]
        waiter = asyncio.create_task(client.post(CHAT, json=chat_body(max_tokens=1)))
        await eventually(lambda: load_is(client, running=2, waiting=1))
        resp = await client.get("/metrics")
        assert resp.headers["Content-Type"].startswith("text/plain; version=0.0.4")
        text = await resp.text()
        assert "# TYPE llmgw_sim:requests_total counter" in text
        assert "# TYPE vllm:num_requests_running gauge" in text
        assert metric(text, "vllm:num_requests_running") == 2
        assert metric(text, "vllm:num_requests_waiting") == 1
        assert metric(text, "vllm:kv_cache_usage_perc") == 1.0
        assert metric(text, "requests_total") == 4
        holders[0].close()
        await waiter
        holders[1].close()
        await eventually(lambda: load_is(client, running=0, waiting=0))
        text = await (await client.get("/metrics")).text()
        assert metric(text, "vllm:kv_cache_usage_perc") == 0.0


@pytest.mark.asyncio
async def test_kv_use_counts_the_running_requests_tokens_when_a_size_is_given() -> None:
    async with engine(slots=4, kv_cache_tokens=4 * FOREVER) as client:
        holder = await hold_a_slot(client)  # a few prompt tokens and FOREVER more
        text = await (await client.get("/metrics")).text()
        assert 0.25 < metric(text, "vllm:kv_cache_usage_perc") < 0.2501
        holder.close()
        await eventually(lambda: load_is(client, running=0, waiting=0))
        text = await (await client.get("/metrics")).text()
        assert metric(text, "vllm:kv_cache_usage_perc") == 0.0


@pytest.mark.asyncio
async def test_prefix_cache_counters_count_tokens_as_vllm_does() -> None:
    async with engine(prefix_block_tokens=2) as client:
        prompt = " ".join(f"w{i}" for i in range(20))
        for _ in range(2):
            await (await client.post(CHAT, json=chat_body(prompt, max_tokens=1))).json()
        text = await (await client.get("/metrics")).text()
        queries = metric(text, "vllm:prefix_cache_queries_total")
        hits = metric(text, "vllm:prefix_cache_hits_total")
        assert queries == metric(text, "prompt_tokens_total") > 0
        assert 0 < hits < queries / 2  # the second found most of its prompt; the first none


@pytest.mark.asyncio
async def test_a_client_that_disconnects_mid_stream_frees_its_slot() -> None:
    async with engine(slots=1) as client:
        holder = await hold_a_slot(client)
        assert await load_is(client, running=1, waiting=0)
        holder.close()
        await eventually(lambda: load_is(client, running=0, waiting=0))
        resp = await client.post(CHAT, json=chat_body(max_tokens=2))
        assert resp.status == 200


@pytest.mark.asyncio
async def test_a_client_that_hangs_up_while_queued_leaves_the_queue() -> None:
    async with engine(slots=1) as client:
        holder = await hold_a_slot(client)
        queued = asyncio.create_task(client.post(CHAT, json=chat_body(max_tokens=2)))
        await eventually(lambda: load_is(client, running=1, waiting=1))
        queued.cancel()
        await eventually(lambda: load_is(client, running=1, waiting=0))
        holder.close()
        await eventually(lambda: load_is(client, running=0, waiting=0))


@pytest.mark.asyncio
async def test_a_client_that_gives_up_on_a_whole_answer_frees_its_slot() -> None:
    async with engine(slots=1) as client:
        pending = asyncio.create_task(client.post(CHAT, json=chat_body(max_tokens=FOREVER)))
        await eventually(lambda: load_is(client, running=1, waiting=0))
        pending.cancel()
        await eventually(lambda: load_is(client, running=0, waiting=0))


@pytest.mark.asyncio
async def test_a_waiter_cancelled_as_it_is_handed_the_slot_passes_it_on() -> None:
    slots = Slots(1)
    served: list[str] = []

    async def use(name: str) -> None:
        async with slots.hold():
            served.append(name)

    async with slots.hold():
        b = asyncio.create_task(use("b"))
        c = asyncio.create_task(use("c"))
        await asyncio.sleep(0)
        assert (slots.running, slots.waiting) == (1, 2)
    # Leaving the block handed the slot to b, which has not run yet.
    b.cancel()
    await asyncio.wait_for(c, timeout=10)  # a lost slot would leave c waiting for ever
    with pytest.raises(asyncio.CancelledError):
        await b
    assert served == ["c"]
    assert (slots.running, slots.waiting) == (0, 0)


@pytest.mark.asyncio
async def test_a_waiter_cancelled_before_its_turn_is_dropped_from_the_queue() -> None:
    slots = Slots(1)

    async def use() -> None:
        async with slots.hold():
            raise AssertionError("a cancelled waiter was served")

    async with slots.hold():
        waiter = asyncio.create_task(use())
        await asyncio.sleep(0)
        waiter.cancel()
    # The release ran before the waiter saw its cancellation.
    with pytest.raises(asyncio.CancelledError):
        await waiter
    assert (slots.running, slots.waiting) == (0, 0)


@pytest.mark.asyncio
async def test_embeddings_are_deterministic_unit_vectors() -> None:
    async with engine(embedding_dim=8) as client:
        body = {"model": "emb", "input": ["hello world", "bye", "hello world"]}
        answer = await (await client.post("/v1/embeddings", json=body)).json()
        vectors = [d["embedding"] for d in answer["data"]]
        assert [d["index"] for d in answer["data"]] == [0, 1, 2]
        assert all(len(v) == 8 for v in vectors)
        assert all(math.isclose(math.hypot(*v), 1.0, rel_tol=1e-9) for v in vectors)
        assert vectors[0] == vectors[2] != vectors[1]
        assert answer["usage"] == {"prompt_tokens": 5, "total_tokens": 5}
        assert answer["model"] == "emb"
        packed = await client.post(
            "/v1/embeddings", json={"input": "bye", "encoding_format": "base64"}
        )
        raw = base64.b64decode((await packed.json())["data"][0]["embedding"])
        assert struct.unpack("<8f", raw) == pytest.approx(vectors[1], rel=1e-6)


@pytest.mark.asyncio
async def test_the_official_openai_client_works_against_it() -> None:
    runner, port = await start_server(SimConfig(**FAST, model="sim-7b", api_key="k-123"))
    base_url = f"http://127.0.0.1:{port}/v1"
    try:
        client = openai.AsyncOpenAI(base_url=base_url, api_key="k-123", max_retries=0)
        messages = [{"role": "user", "content": "why is the sky blue"}]
        chat = await client.chat.completions.create(model="sim-7b", messages=messages, max_tokens=4)
        assert chat.model == "sim-7b"
        assert chat.usage is not None and chat.usage.completion_tokens == 4
        assert chat.choices[0].finish_reason == "length"

        stream = await client.chat.completions.create(
            model="sim-7b",
            messages=messages,
            max_tokens=4,
            stream=True,
            stream_options={"include_usage": True},
        )
        parts, usage = [], None
        async for chunk in stream:
            parts += [c.delta.content or "" for c in chunk.choices]
            usage = chunk.usage or usage
        assert "".join(parts) == chat.choices[0].message.content
        assert usage is not None and usage.total_tokens == chat.usage.total_tokens

        text = await client.completions.create(model="sim-7b", prompt="hi", max_tokens=3)
        assert len(text.choices[0].text.split()) == 3

        emb = await client.embeddings.create(model="sim-7b", input=["a", "b"])
        assert [len(d.embedding) for d in emb.data] == [16, 16]

        models = await client.models.list()
        assert [m.id for m in models.data] == ["sim-7b"]

        intruder = openai.AsyncOpenAI(base_url=base_url, api_key="wrong", max_retries=0)
        with pytest.raises(openai.AuthenticationError):
            await intruder.chat.completions.create(model="sim-7b", messages=messages)
        await client.close()
        await intruder.close()
    finally:
        await runner.cleanup()


def test_the_command_serves_with_the_key_from_the_environment_and_stops_on_sigterm() -> None:
    env = os.environ | {"LLMGW_ENGINE_API_KEY": "env-key", "PYTHONPATH": str(REPO)}
    command = [sys.executable, "-m", "llmgw.simengine", "--port", "0", "--model", "m"]
    proc = subprocess.Popen(
        [*command, "--ttft-ms", "1", "--tokens-per-sec", "1000"],
        cwd=REPO,
        env=env,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stderr is not None
        banner = proc.stderr.readline()
        url = banner.split(" on ")[1].strip()
        with httpx.Client(base_url=url) as http:
            assert http.get("/health").json()["model"] == "m"
            assert http.get("/v1/models").status_code == 401
            auth = {"Authorization": "Bearer env-key"}
            assert http.get("/v1/models", headers=auth).status_code == 200
            body = chat_body(max_tokens=FOREVER, stream=True)
            with http.stream("POST", CHAT, json=body, headers=auth) as resp:
                assert resp.status_code == 200
                next(resp.iter_lines())
                # In flight, and cut by the signal.
                proc.send_signal(signal.SIGTERM)
                assert proc.wait(timeout=30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_bad_options_are_refused() -> None:
    from llmgw.simengine import main

    for argv in (["--port", "1", "--slots", "0"], ["--port", "1", "--tokens-per-sec", "0"], []):
        with pytest.raises(SystemExit) as exit_info:
            main(argv)
        assert exit_info.value.code == 2
