"""The endpoints beside chat, read by the SDKs' own types, strictly, through the gateway in
front of a real sim engine: `/v1/completions` (whole and streamed) and `/v1/embeddings` as
OpenAI's schema has them, every nullable field the `openai` SDK may send accepted as null,
their errors OpenAI-shaped; `/v1/responses` and `/v1/messages` as the `openai` and
`anthropic` SDKs' types have them (issue 39, item 2)."""

from __future__ import annotations

import json

import pytest
from anthropic.types import Message
from openai.types import Completion, CreateEmbeddingResponse
from openai.types.responses import Response

from tests.gateway.test_app import client
from tests.gateway.test_conformance import GENERATED, sdk, served

pytestmark = pytest.mark.django_db(transaction=True)

# Every field of a completion request the schema lets be null.
COMPLETION_NULLS = {
    "stream": None,
    "stream_options": None,
    "max_tokens": None,
    "n": None,
    "temperature": None,
    "top_p": None,
    "stop": None,
    "seed": None,
    "user": None,
    "echo": None,
    "best_of": None,
    "logprobs": None,
    "logit_bias": None,
    "suffix": None,
    "frequency_penalty": None,
    "presence_penalty": None,
}


def strictly(kind, body: dict):
    """`body` read by `kind` in pydantic's strict mode: no coercion, every required field."""
    return kind.model_validate(body, strict=True)


def data_events(raw: bytes) -> list[dict]:
    events = [e.strip() for e in raw.split(b"\n\n") if e.strip()]
    assert events[-1] == b"data: [DONE]"
    return [json.loads(e.removeprefix(b"data: ")) for e in events[:-1]]


async def test_a_completion_validates_with_every_nullable_field_null(world, gateway):
    secret = await served(world)
    body = {"model": "llama", "prompt": "once upon", **COMPLETION_NULLS}
    async with client(gateway, secret) as c:
        r = await c.post("/v1/completions", json=body)
    assert r.status_code == 200, r.text
    answer = strictly(Completion, r.json())
    assert answer.choices[0].text and answer.usage.completion_tokens > 0
    # The SDK's own `stream=None` and `max_tokens=None` pass too.
    made = await sdk(gateway, secret).completions.create(
        model="llama", prompt="once upon", stream=None, max_tokens=None
    )
    assert GENERATED.fullmatch(made._request_id) and made.choices[0].text


async def test_streamed_completion_chunks_validate(world, gateway):
    secret = await served(world)
    body = {"model": "llama", "prompt": "once upon", "max_tokens": 3, "stream": True}
    async with client(gateway, secret) as c:
        r = await c.post(
            "/v1/completions", json={**body, "stream_options": {"include_usage": True}}
        )
    assert r.status_code == 200, r.text
    chunks = data_events(r.content)
    *texts, last = chunks
    # OpenAI sends a null finish_reason until the last text chunk, which its own schema
    # (and the SDK's type, shared by whole and streamed answers) does not allow: the text
    # chunks are read with it filled, and must have it null.
    for chunk in texts[:-1]:
        assert chunk["choices"][0]["finish_reason"] is None
        strictly(Completion, _finished(chunk))
    strictly(Completion, texts[-1])
    assert texts[-1]["choices"][0]["finish_reason"] == "length"
    assert strictly(Completion, last).usage.completion_tokens == 3 and last["choices"] == []
    stream = await sdk(gateway, secret).completions.create(**body)
    assert "".join([c.choices[0].text async for c in stream if c.choices])


def _finished(chunk: dict) -> dict:
    choice = {**chunk["choices"][0], "finish_reason": "stop"}
    return {**chunk, "choices": [choice]}


async def test_embeddings_validate_and_null_fields_are_accepted(world, gateway):
    secret = await served(world)
    body = {"model": "llama", "input": ["a b", "c"], "encoding_format": "float"}
    async with client(gateway, secret) as c:
        whole = await c.post("/v1/embeddings", json=body)
        nulls = await c.post(
            "/v1/embeddings", json={**body, "stream": None, "user": None, "dimensions": None}
        )
    for r in (whole, nulls):
        assert r.status_code == 200, r.text
        answer = strictly(CreateEmbeddingResponse, r.json())
        assert [e.index for e in answer.data] == [0, 1] and answer.usage.prompt_tokens == 3
    # The SDK asks for base64 and decodes it into the same vectors.
    made = await sdk(gateway, secret).embeddings.create(model="llama", input=["a b", "c"])
    assert GENERATED.fullmatch(made._request_id)
    floats = strictly(CreateEmbeddingResponse, whole.json())
    for mine, theirs in zip(made.data, floats.data, strict=True):
        assert mine.embedding == pytest.approx(theirs.embedding, rel=1e-6)


@pytest.mark.parametrize(
    ("path", "body", "words"),
    [
        ("/v1/embeddings", {"input": "hi", "stream": True}, "Embeddings cannot be streamed."),
        ("/v1/completions", {"prompt": "hi", "stream": "yes"}, "'stream' must be true or false."),
        ("/v1/completions", {"prompt": "hi", "max_tokens": -1}, "'max_tokens' must be a whole"),
        ("/v1/embeddings", {"input": 3}, "'input' must be a string"),  # the engine's words
    ],
)
async def test_their_errors_are_openai_shaped(world, gateway, path, body, words):
    secret = await served(world)
    async with client(gateway, secret) as c:
        r = await c.post(path, json={"model": "llama", **body})
    assert r.status_code == 400
    error = r.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert words in error["message"]
    assert error["message"].endswith(f"(request {r.headers['x-request-id']})")


async def test_a_response_validates_strictly(world, gateway):
    secret = await served(world)
    async with client(gateway, secret) as c:
        r = await c.post(
            "/v1/responses",
            json={"model": "llama", "input": "hi", "instructions": None, "temperature": None},
        )
    assert r.status_code == 200, r.text
    response = strictly(Response, r.json())
    assert response.status == "completed" and response.output_text


async def test_a_message_validates_strictly(world, gateway):
    secret = await served(world)
    body = {"model": "llama", "max_tokens": 4, "messages": [{"role": "user", "content": "hi"}]}
    async with client(gateway, secret) as c:
        r = await c.post("/v1/messages", json=body)
    assert r.status_code == 200, r.text
    message = strictly(Message, r.json())
    assert message.content and message.usage.output_tokens == 4
