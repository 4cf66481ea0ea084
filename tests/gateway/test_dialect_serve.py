"""`/v1/responses` and `/v1/messages` through the gateway's own steps, in this process: the
official `openai` and `anthropic` SDKs against the ASGI app in front of a real sim engine.
What the engine wrote comes back in each API's shape, whole and streamed; the usage is
counted as a chat request's is; the gateway's own refusals (key, limits, a body it cannot
honour) come in the caller's API's shape. End to end with `llmgw serve`:
tests/e2e/test_dialects.py."""

from __future__ import annotations

import asyncio
import itertools
import json

import anthropic
import httpx
import httpx2
import openai
import pytest
from asgiref.sync import sync_to_async

from llmgw.gateway.app import Gateway
from llmgw.simengine import chat_prompt, generate_words
from tenancy.models import Usage
from tenancy.services import api_key_create
from tests.fleet.builders import gpu_model, model_added
from tests.gateway.world import _replica

pytestmark = pytest.mark.django_db(transaction=True)

QUESTION = "What is the capital of France?"
SYSTEM = "Be brief."


async def add(fn, *args, **kwargs):
    return await sync_to_async(fn)(*args, **kwargs)


def sim_text(*messages: str, n: int) -> str:
    """What the sim engine writes for a chat of these messages' contents, `n` words."""
    prompt = chat_prompt({"messages": [{"role": "user", "content": m} for m in messages]})
    return " ".join(itertools.islice(generate_words(prompt), n))


def transport(gateway: Gateway) -> httpx.AsyncClient:
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=gateway))


def openai_client(gateway: Gateway, secret: str) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(
        api_key=secret, base_url="http://gw/v1", http_client=transport(gateway), max_retries=0
    )


def anthropic_client(gateway: Gateway, secret: str) -> anthropic.AsyncAnthropic:
    # This anthropic SDK speaks httpx2, which takes the same transports as httpx.
    http = httpx2.AsyncClient(transport=httpx2.ASGITransport(app=gateway))
    return anthropic.AsyncAnthropic(
        api_key=secret, base_url="http://gw", http_client=http, max_retries=0
    )


@pytest.fixture
async def secret(world):
    await add(model_added, gpu_model("llama"))
    await add(_replica, "llama-1", "llama", await world.engine("llama-1", "llama"))
    _, secret = await add(api_key_create, project="Acme/ml/chat", name="k", actor="t")
    return secret


async def counted(gateway: Gateway) -> Usage:
    await gateway.runtime._flush()
    return await add(Usage.objects.get)


async def test_a_response_is_the_engines_answer_and_its_usage_is_counted(world, gateway, secret):
    client = openai_client(gateway, secret)
    response = await client.responses.create(
        model="llama", input=QUESTION, instructions=SYSTEM, max_output_tokens=5
    )
    assert response.output_text == sim_text(SYSTEM, QUESTION, n=5)
    assert response.status == "incomplete"  # the sim writes up to the cap
    assert response.usage.output_tokens == 5
    row = await counted(gateway)
    assert (row.requests, row.errors, row.completion_tokens) == (1, 0, 5)
    assert row.prompt_tokens == response.usage.input_tokens
    assert world.engines["llama-1"].requests_total == 1


async def test_a_streamed_response_sends_typed_events_and_counts_its_usage(world, gateway, secret):
    client = openai_client(gateway, secret)
    stream = await client.responses.create(
        model="llama", input=QUESTION, max_output_tokens=4, stream=True
    )
    events = [event async for event in stream]
    kinds = [e.type for e in events]
    assert kinds[:2] == ["response.created", "response.in_progress"]
    assert kinds[-1] == "response.incomplete"  # stopped by max_output_tokens
    deltas = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert deltas == sim_text(QUESTION, n=4) == events[-1].response.output_text
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert events[-1].response.usage.output_tokens == 4
    row = await counted(gateway)
    assert (row.requests, row.errors, row.completion_tokens) == (1, 0, 4)


async def test_a_message_is_the_engines_answer_and_its_usage_is_counted(world, gateway, secret):
    client = anthropic_client(gateway, secret)  # its key in x-api-key, as the SDK sends it
    message = await client.messages.create(
        model="llama",
        max_tokens=6,
        system=SYSTEM,
        messages=[{"role": "user", "content": QUESTION}],
    )
    assert message.content[0].text == sim_text(SYSTEM, QUESTION, n=6)
    assert message.stop_reason == "max_tokens"
    assert message.usage.output_tokens == 6
    row = await counted(gateway)
    assert (row.requests, row.errors, row.completion_tokens) == (1, 0, 6)
    assert row.prompt_tokens == message.usage.input_tokens + message.usage.cache_read_input_tokens


async def test_a_streamed_message_sends_its_events_and_counts_its_usage(world, gateway, secret):
    client = anthropic_client(gateway, secret)
    async with client.messages.stream(
        model="llama", max_tokens=3, messages=[{"role": "user", "content": QUESTION}]
    ) as stream:
        text = "".join([t async for t in stream.text_stream])
        message = await stream.get_final_message()
    assert text == sim_text(QUESTION, n=3) == message.content[0].text
    assert message.usage.output_tokens == 3
    row = await counted(gateway)
    assert (row.requests, row.errors, row.completion_tokens) == (1, 0, 3)


async def test_stored_responses_are_refused_with_a_sentence_that_says_why(world, gateway, secret):
    client = openai_client(gateway, secret)
    for extra in ({"previous_response_id": "resp_1"}, {"store": True}):
        with pytest.raises(openai.BadRequestError) as refused:
            await client.responses.create(model="llama", input=QUESTION, **extra)
        assert refused.value.status_code == 400
        assert "stateless" in refused.value.message
        assert refused.value.body["param"] == next(iter(extra))
    assert world.engines["llama-1"].requests_total == 0


async def test_the_gateways_own_refusals_come_in_anthropics_shape(world, gateway, secret):
    with pytest.raises(anthropic.AuthenticationError) as refused:
        await anthropic_client(gateway, "llmgw_key_wrong").messages.create(
            model="llama", max_tokens=2, messages=[{"role": "user", "content": QUESTION}]
        )
    assert refused.value.body["error"]["type"] == "authentication_error"
    with pytest.raises(anthropic.NotFoundError) as refused:
        await anthropic_client(gateway, secret).messages.create(
            model="nope", max_tokens=2, messages=[{"role": "user", "content": QUESTION}]
        )
    assert refused.value.body["error"]["type"] == "not_found_error"
    with pytest.raises(anthropic.BadRequestError) as refused:
        await anthropic_client(gateway, secret).messages.create(
            model="llama", max_tokens=2, messages=[], extra_body={"bogus": 1}
        )
    said = refused.value.body["error"]["message"]
    # The sentence, then the request's id (issue 39, item 1), as the header says it.
    assert (
        said
        == f"'bogus': this field is not supported. (request {refused.value.response.headers['x-request-id']})"
    )


async def test_a_limit_on_messages_is_anthropics_rate_limit_error(world, gateway, secret):
    _, limited = await add(
        api_key_create,
        project="Acme/ml/chat",
        name="slow",
        actor="t",
        limits={"requests_per_minute": 1},
    )
    client = anthropic_client(gateway, limited)
    ask = {"model": "llama", "max_tokens": 2, "messages": [{"role": "user", "content": "hi"}]}
    await client.messages.create(**ask)
    with pytest.raises(anthropic.RateLimitError) as refused:
        await client.messages.create(**ask)
    assert refused.value.body["error"]["type"] == "rate_limit_error"
    assert "allows 1 requests per minute" in refused.value.body["error"]["message"]
    assert int(refused.value.response.headers["retry-after"]) >= 1


async def test_a_bearer_key_is_taken_on_messages_and_x_api_key_on_chat(world, gateway, secret):
    async with transport(gateway) as http:
        body = {"model": "llama", "max_tokens": 2, "messages": [{"role": "user", "content": "hi"}]}
        bearer = {"Authorization": f"Bearer {secret}"}
        r = await http.post("http://gw/v1/messages", json=body, headers=bearer)
        assert r.status_code == 200 and r.json()["type"] == "message"
        chat = {"model": "llama", "max_tokens": 2, "messages": [{"role": "user", "content": "hi"}]}
        r = await http.post(
            "http://gw/v1/chat/completions", json=chat, headers={"x-api-key": secret}
        )
        assert r.status_code == 200 and r.json()["object"] == "chat.completion"
        r = await http.post("http://gw/v1/messages", json=body, headers={"x-api-key": " "})
        assert r.status_code == 401
        assert r.json()["error"]["type"] == "authentication_error"


@pytest.mark.parametrize(
    ("path", "body", "last"),
    [
        ("/v1/responses", {"input": "hi", "max_output_tokens": 1000}, "response.failed"),
        (
            "/v1/messages",
            {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 1000},
            "error",
        ),
    ],
)
async def test_a_stream_cut_upstream_ends_with_the_apis_own_failure(
    world, gateway, path, body, last
):
    await add(model_added, gpu_model("llama"))
    endpoint = await world.engine("llama-1", "llama", tokens_per_sec=20, max_tokens=1000)
    await add(_replica, "llama-1", "llama", endpoint)
    _, secret = await add(api_key_create, project="Acme/ml/chat", name="k", actor="t")

    async def cut_soon():
        await asyncio.sleep(0.3)
        await world.runners[0].cleanup()

    async with transport(gateway) as http:
        r, _ = await asyncio.gather(
            http.post(
                f"http://gw{path}",
                json={"model": "llama", "stream": True, **body},
                headers={"x-api-key": secret},
            ),
            cut_soon(),
        )
    world.runners.clear()
    events = [e for e in r.text.split("\n\n") if e]
    final = json.loads(events[-1].partition("data: ")[2])
    assert final["type"] == last
    assert "went away mid-way" in json.dumps(final)
    await gateway.runtime._flush()
    assert await add(lambda: Usage.objects.get().errors) == 1
