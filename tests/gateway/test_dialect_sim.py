"""The translations against a real engine's answers: a sim engine (llmgw.simengine) serves
the chat bodies they make, whole and streamed, and what it answers translates back into a
Response and a Message the SDKs' own types accept."""

from __future__ import annotations

import aiohttp
import pytest
from anthropic.types import Message, RawMessageStreamEvent
from openai.types.responses import Response, ResponseStreamEvent
from pydantic import TypeAdapter

from llmgw.gateway.dialects.messages import MessagesStream, message_body, messages_request
from llmgw.gateway.dialects.responses import ResponsesStream, response_body, responses_request
from llmgw.gateway.dialects.sse import ChatEvents
from llmgw.simengine import SimConfig, start_server

RESPONSES = {"model": "sim", "input": "Tell me about the sea.", "instructions": "Be brief.", "max_output_tokens": 8}  # fmt: skip
MESSAGES = {"model": "sim", "max_tokens": 8, "system": "Be brief.", "messages": [{"role": "user", "content": "The sea?"}]}  # fmt: skip


@pytest.fixture
async def engine():
    runner, port = await start_server(SimConfig(model="sim", ttft_ms=0, tokens_per_sec=10_000))
    async with aiohttp.ClientSession(f"http://127.0.0.1:{port}") as session:
        yield session
    await runner.cleanup()


async def chat(engine: aiohttp.ClientSession, body: dict) -> dict:
    async with engine.post("/v1/chat/completions", json=body) as answer:
        assert answer.status == 200, await answer.text()
        return await answer.json()


async def streamed(engine: aiohttp.ClientSession, body: dict, translator) -> list[dict]:
    reader, events = ChatEvents(), translator.start()
    async with engine.post("/v1/chat/completions", json=body) as answer:
        assert answer.status == 200, await answer.text()
        async for data in answer.content.iter_any():
            for chunk in reader.feed(data):
                events += translator.feed(chunk)
    assert reader.done
    return events + translator.close()


async def test_a_response_from_the_sim_engine(engine):
    answer = await chat(engine, responses_request(RESPONSES))
    response = Response.model_validate(response_body(RESPONSES, answer, rid="r1", now=1.0))
    assert response.output_text and response.status == "incomplete"  # the sim writes to the cap
    assert response.usage.output_tokens == 8


async def test_a_streamed_response_from_the_sim_engine(engine):
    body = {**RESPONSES, "stream": True}
    events = await streamed(
        engine, responses_request(body), ResponsesStream(body, rid="r1", now=1.0)
    )
    adapter = TypeAdapter(ResponseStreamEvent)
    final = [adapter.validate_python(e) for e in events][-1].response
    deltas = "".join(e["delta"] for e in events if e["type"] == "response.output_text.delta")
    assert deltas == final.output_text and final.usage.output_tokens == 8


async def test_a_message_from_the_sim_engine(engine):
    answer = await chat(engine, messages_request(MESSAGES))
    message = Message.model_validate(message_body(MESSAGES, answer, rid="r1"))
    assert message.content[0].text and message.stop_reason == "max_tokens"
    assert message.usage.output_tokens == 8


async def test_a_streamed_message_from_the_sim_engine(engine):
    body = {**MESSAGES, "stream": True}
    events = await streamed(engine, messages_request(body), MessagesStream(body, rid="r1"))
    adapter = TypeAdapter(RawMessageStreamEvent)
    for event in events:
        adapter.validate_python(event)
    assert events[-2]["delta"]["stop_reason"] == "max_tokens"
    assert events[-2]["usage"]["output_tokens"] == 8
