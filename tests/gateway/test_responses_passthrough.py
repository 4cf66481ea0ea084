"""`POST /v1/responses` passed through to an engine that serves it (issue 39, item 3): a
replica whose profile runs vLLM gets the caller's body as it is, its model renamed, at its
own `/v1/responses`, and its answer comes back as it is, whole and streamed; the usage
is read from the Response, so the accounting counts it exactly. An engine that does not
serve it (here the sim, profiled as llama.cpp) is sent the chat completion it translates
to, as before (tests/gateway/test_dialect_serve.py)."""

from __future__ import annotations

import json
from unittest.mock import ANY

import openai
import pytest
from aiohttp import web

from llmgw.gateway.app import Gateway
from llmgw.gateway.dialects.responses import chat_usage
from tenancy.models import Usage
from tenancy.services import api_key_create
from tests.fleet.builders import gpu_model, model_added
from tests.gateway.test_dialect_serve import QUESTION, add, openai_client, sim_text
from tests.gateway.world import _replica

pytestmark = pytest.mark.django_db(transaction=True)

USAGE = {
    "input_tokens": 17,
    "input_tokens_details": {"cached_tokens": 5},
    "output_tokens": 3,
    "output_tokens_details": {"reasoning_tokens": 0},
    "total_tokens": 20,
}
WORDS = ("Paris", " it", " is")


def response(model: str, status: str = "completed", rid: str = "resp_vllm1") -> dict:
    """A Response as vLLM writes one, named by the request's `request_id` where it has one."""
    return {
        "id": rid,
        "object": "response",
        "created_at": 1,
        "status": status,
        "model": model,
        "output": [
            {
                "id": "msg_1",
                "type": "message",
                "role": "assistant",
                "status": "completed",
                "content": [{"type": "output_text", "text": "".join(WORDS), "annotations": []}],
            }
        ],
        "parallel_tool_calls": True,
        "tool_choice": "auto",
        "tools": [],
        "usage": USAGE if status != "in_progress" else None,
    }


class FakeVllm:
    """vLLM's `/v1/responses`, whole and streamed (named events, no [DONE] after the last),
    noting each body it was sent; its chat completions must not be asked for."""

    def __init__(self) -> None:
        self.bodies: list[dict] = []
        self.paths: list[str] = []

    async def responses(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        self.bodies.append(body)
        self.paths.append(request.path)
        if not body.get("stream"):
            return web.json_response(response(body["model"], rid=body.get("request_id", "x")))
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        events = [{"type": "response.created", "response": response(body["model"], "in_progress")}]
        events += [{"type": "response.output_text.delta", "delta": w} for w in WORDS]
        events.append({"type": "response.completed", "response": response(body["model"])})
        for n, event in enumerate(events):
            data = json.dumps({**event, "sequence_number": n}, separators=(",", ":"))
            await resp.write(f"event: {event['type']}\ndata: {data}\n\n".encode())
        await resp.write_eof()
        return resp

    async def chat(self, request: web.Request) -> web.Response:
        self.paths.append(request.path)
        return web.json_response({"error": {"message": "not this way"}}, status=500)


@pytest.fixture
async def vllm():
    fake = FakeVllm()
    app = web.Application()
    app.router.add_post("/v1/responses", fake.responses)
    app.router.add_post("/v1/chat/completions", fake.chat)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    fake.url = f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}"
    yield fake
    await runner.cleanup()


def profiled(name: str, engine: str, **extra) -> dict:
    return gpu_model(
        name, profiles=[{"name": "gpu", "engine": engine, "gpu_class": "h100-80g"}], **extra
    )


@pytest.fixture
async def secret(world, vllm):
    await add(model_added, profiled("qwen", "vllm", aliases=["q"]))
    await add(_replica, "qwen-1", "qwen", vllm.url)
    await add(model_added, profiled("llama", "llamacpp"))
    await add(_replica, "llama-1", "llama", await world.engine("llama-1", "llama"))
    _, secret = await add(api_key_create, project="Acme/ml/chat", name="k", actor="t")
    return secret


async def counted(gateway: Gateway) -> Usage:
    await gateway.runtime._flush()
    return await add(Usage.objects.get)


async def test_a_response_reaches_vllm_as_it_was_sent_and_its_usage_is_counted(
    world, gateway, vllm, secret
):
    client = openai_client(gateway, secret)
    answer = await client.responses.create(
        model="q",  # an alias: renamed to the model's name, as chat's is
        input=[{"role": "user", "content": QUESTION}],
        instructions="Be brief.",
        max_output_tokens=8,
        metadata={"team": "ml"},
    )
    # vLLM's own Response, not one the gateway wrote, named as the gateway asked (vLLM's
    # `request_id`): by the request's id, as a translated answer is (test_dialect_ids.py).
    rid = answer.output[0].id  # FakeVllm's
    assert answer.id == vllm.bodies[0]["request_id"] != "x" and rid == "msg_1"
    assert answer.output_text == "".join(WORDS)
    assert vllm.paths == ["/v1/responses"]
    assert vllm.bodies == [
        {
            "request_id": answer.id,
            "model": "qwen",
            "input": [{"role": "user", "content": QUESTION}],
            "instructions": "Be brief.",
            "max_output_tokens": 8,
            "metadata": {"team": "ml"},
        }
    ]
    row = await counted(gateway)
    assert (row.requests, row.errors) == (1, 0)
    assert (row.prompt_tokens, row.completion_tokens, row.estimated_tokens) == (17, 3, 0)


async def test_a_streamed_response_passes_as_vllm_sent_it_and_counts_its_usage(
    world, gateway, vllm, secret
):
    client = openai_client(gateway, secret)
    stream = await client.responses.create(model="qwen", input=QUESTION, stream=True)
    events = [event async for event in stream]
    assert [e.type for e in events] == [
        "response.created",
        *["response.output_text.delta"] * len(WORDS),
        "response.completed",
    ]
    assert "".join(e.delta for e in events[1:-1]) == "".join(WORDS)
    (sent,) = vllm.bodies
    assert sent == {"model": "qwen", "input": QUESTION, "stream": True, "request_id": ANY}
    row = await counted(gateway)
    assert (row.requests, row.errors) == (1, 0)  # ended by response.completed: not cut
    assert (row.prompt_tokens, row.completion_tokens, row.estimated_tokens) == (17, 3, 0)


async def test_the_cap_the_gateway_sets_reaches_vllm_as_max_output_tokens(
    world, gateway, vllm, secret
):
    _, capped = await add(
        api_key_create,
        project="Acme/ml/chat",
        name="capped",
        actor="t",
        limits={"max_tokens": 64},
    )
    await openai_client(gateway, capped).responses.create(model="qwen", input=QUESTION)
    assert vllm.bodies[0]["max_output_tokens"] == 64


async def test_an_engine_that_does_not_serve_responses_gets_chat(world, gateway, vllm, secret):
    client = openai_client(gateway, secret)
    answer = await client.responses.create(model="llama", input=QUESTION, max_output_tokens=4)
    assert answer.output_text == sim_text(QUESTION, n=4)
    assert world.engines["llama-1"].requests_total == 1
    assert vllm.paths == []


async def test_what_only_vllm_honours_reaches_it_and_is_refused_for_chat(
    world, gateway, vllm, secret
):
    client = openai_client(gateway, secret)
    asked = {"input": QUESTION, "reasoning": {"effort": "high"}, "top_logprobs": 2}
    answer = await client.responses.create(model="qwen", **asked)
    assert answer.output_text == "".join(WORDS)
    assert vllm.bodies[-1]["reasoning"] == {"effort": "high"}
    assert vllm.bodies[-1]["top_logprobs"] == 2
    with pytest.raises(openai.BadRequestError) as refused:
        await client.responses.create(model="llama", **asked)
    assert "reasoning settings reach only an engine" in refused.value.message
    assert "runs llamacpp" in refused.value.message
    assert refused.value.body["param"] == "reasoning"
    assert world.engines["llama-1"].requests_total == 0
    # Asking nothing of them, the same fields go on to chat.
    plain = await client.responses.create(
        model="llama", input=QUESTION, reasoning={}, truncation="disabled", max_output_tokens=2
    )
    assert plain.output_text == sim_text(QUESTION, n=2)


async def test_vllm_names_its_response_by_the_requests_id(world, gateway, vllm, secret):
    client = openai_client(gateway, secret)
    raw = await client.responses.with_raw_response.create(
        model="qwen", input=QUESTION, extra_headers={"x-request-id": "v.7"}
    )
    assert vllm.bodies[-1]["request_id"] == "resp_v.7" == raw.parse().id
    raw = await client.responses.with_raw_response.create(model="qwen", input=QUESTION)
    assert raw.parse().id == "resp_" + raw.headers["x-request-id"].removeprefix("req_")


async def test_stored_responses_are_refused_before_reaching_vllm(world, gateway, vllm, secret):
    client = openai_client(gateway, secret)
    with pytest.raises(openai.BadRequestError) as refused:
        await client.responses.create(model="qwen", input=QUESTION, store=True)
    assert "stateless" in refused.value.message
    assert vllm.paths == []


def test_a_responses_usage_is_read_in_chats_names():
    assert chat_usage(USAGE) == {
        "prompt_tokens": 17,
        "completion_tokens": 3,
        "total_tokens": 20,
        "prompt_tokens_details": {"cached_tokens": 5},
    }
    chat = {"prompt_tokens": 1, "completion_tokens": 2}
    assert chat_usage(chat) is chat
