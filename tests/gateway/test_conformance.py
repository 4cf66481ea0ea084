"""What the gateway answers, read by the `openai` SDK's own types, strictly: request ids on
every answer, `/v1/models` as OpenAI's schema has it, nulls accepted, `message.refusal`,
every error (an engine's too) OpenAI-shaped with a status that says whether to retry, and
CORS for the origins an operator opts in (issue 39)."""

from __future__ import annotations

import re
from dataclasses import replace

import httpx
import openai
import pytest
from aiohttp import web
from openai.types import Model
from openai.types.chat import ChatCompletion, ChatCompletionChunk

from tests.fleet.builders import gpu_model, model_added
from tests.gateway.test_app import add, chat, client, new_key
from tests.gateway.world import _replica

pytestmark = pytest.mark.django_db(transaction=True)

GENERATED = re.compile(r"req_[0-9a-f]{24}")
HI = [{"role": "user", "content": "hi"}]


async def served(world, name: str = "llama") -> str:
    await add(model_added, gpu_model(name))
    await add(_replica, f"{name}-1", name, await world.engine(f"{name}-1", name))
    return await new_key()


def sdk(gateway, secret: str, **kwargs) -> openai.AsyncOpenAI:
    http = httpx.AsyncClient(transport=httpx.ASGITransport(app=gateway), base_url="http://gw/v1")
    return openai.AsyncOpenAI(api_key=secret, base_url="http://gw/v1", http_client=http, **kwargs)


async def test_every_answer_carries_a_request_id_the_sdk_reads(world, gateway):
    secret = await served(world)
    client_ = sdk(gateway, secret, max_retries=0)
    answer = await client_.chat.completions.create(model="llama", messages=HI, max_tokens=2)
    assert GENERATED.fullmatch(answer._request_id)
    models = await client_.models.with_raw_response.list()
    assert GENERATED.fullmatch(models.headers["x-request-id"])
    stream = await client_.chat.completions.with_raw_response.create(
        model="llama", messages=[{"role": "user", "content": "hi"}], stream=True
    )
    assert GENERATED.fullmatch(stream.headers["x-request-id"])
    with pytest.raises(openai.NotFoundError) as missing:
        await client_.chat.completions.create(model="nope", messages=[])
    rid = missing.value.request_id
    assert GENERATED.fullmatch(rid)
    assert missing.value.body["message"].endswith(f"(request {rid})")


async def test_a_callers_sane_id_is_kept_and_another_replaced(world, gateway):
    secret = await served(world)
    async with client(gateway, secret) as c:
        mine = await c.post(
            "/v1/chat/completions", json=chat("llama"), headers={"x-request-id": "trace.42:a-b_c"}
        )
        for odd in ("has space", "x" * 129, "a/b"):
            other = await c.get("/v1/models", headers={"x-request-id": odd})
            assert GENERATED.fullmatch(other.headers["x-request-id"]), odd
        unknown = await c.post(
            "/v1/chat/completions", json=chat("nope"), headers={"x-request-id": "mine-1"}
        )
    assert mine.headers["x-request-id"] == "trace.42:a-b_c"
    assert unknown.headers["x-request-id"] == "mine-1"
    assert unknown.json()["error"]["message"].endswith("(request mine-1)")


async def test_a_failed_request_is_logged_by_its_id(world, gateway, caplog):
    secret = await served(world)
    await add(_replica, "llama-2", "llama", await failing_engine(world))
    caplog.set_level("INFO", logger="llmgw.gateway.access")
    async with client(gateway, secret) as c:
        for _ in range(4):  # one of them reaches the failing replica
            r = await c.post("/v1/chat/completions", json=chat("llama"))
            if r.status_code != 200:
                break
    assert r.status_code == 502
    (line,) = [m for m in caplog.messages if r.headers["x-request-id"] in m]
    assert "replica=llama-2 status=502 failed=upstream_status" in line


async def test_models_are_what_openais_schema_says(world, gateway):
    secret = await served(world)
    client_ = sdk(gateway, secret)
    raw = await client_.models.with_raw_response.list()
    (entry,) = raw.http_response.json()["data"]
    model = Model.model_validate(entry, strict=True)
    assert isinstance(model.created, int) and model.created > 1_700_000_000
    assert model.owned_by == "llmgw"
    listed = [m async for m in await client_.models.list()]
    assert sorted(listed, key=lambda m: m.created)[0].id == "llama"
    one = await client_.models.with_raw_response.retrieve("llama")
    assert Model.model_validate(one.http_response.json(), strict=True).created == model.created


async def test_nullable_fields_are_accepted_as_null_and_the_answer_validates(world, gateway):
    secret = await served(world)
    nulls = {
        "stream": None,
        "stream_options": None,
        "max_tokens": None,
        "max_completion_tokens": None,
        "n": None,
        "temperature": None,
        "top_p": None,
        "stop": None,
        "seed": None,
        "user": None,
    }
    async with client(gateway, secret) as c:
        r = await c.post("/v1/chat/completions", json=chat("llama", **nulls))
    assert r.status_code == 200, r.text
    body = r.json()
    ChatCompletion.model_validate(body, strict=True)
    # Required by the schema, though the SDK defaults it: null where the engine left it out.
    assert body["choices"][0]["message"]["refusal"] is None
    # And the SDK's own `stream=None` passes.
    answer = await sdk(gateway, secret).chat.completions.create(
        model="llama", messages=[{"role": "user", "content": "hi"}], stream=None, max_tokens=2
    )
    assert answer.choices[0].message.refusal is None


async def test_streamed_chunks_validate(world, gateway):
    secret = await served(world)
    stream = await sdk(gateway, secret).chat.completions.create(
        model="llama", messages=[{"role": "user", "content": "hi"}], stream=True, max_tokens=3
    )
    chunks = [chunk async for chunk in stream]
    for chunk in chunks:
        ChatCompletionChunk.model_validate(chunk.model_dump(exclude_unset=True), strict=True)
    assert chunks


async def failing_engine(
    world, status: int = 500, body: bytes = b"Internal Server Error", kind="text/plain"
):
    """An engine that answers every request with `status` and `body`."""

    async def fail(_request):
        return web.Response(status=status, body=body, content_type=kind)

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", fail)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    world.runners.append(runner)
    return f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}"


@pytest.mark.parametrize(
    ("status", "body", "kind", "answered", "words", "code"),
    [
        (
            500,
            b"Internal Server Error",
            "text/plain",
            502,
            "Internal Server Error",
            "upstream_error",
        ),
        (
            500,
            b'{"error": {"code": 500, "message": "CUDA out of memory", "type": "server_error"}}',
            "application/json",
            502,
            "CUDA out of memory",
            "upstream_error",
        ),
        (
            400,
            b'{"object": "error", "message": "prompt is too long", "type": "BadRequestError", "param": null, "code": 400}',
            "application/json",
            400,
            "prompt is too long",
            400,
        ),
        (404, b"", "text/plain", 404, "The engine answered HTTP 404.", None),
    ],
)
async def test_an_engines_error_is_openai_shaped_with_its_words_kept(
    world, gateway, status, body, kind, answered, words, code
):
    await add(model_added, gpu_model("llama"))
    await add(_replica, "llama-1", "llama", await failing_engine(world, status, body, kind))
    secret = await new_key()
    async with client(gateway, secret) as c:
        r = await c.post("/v1/chat/completions", json=chat("llama"))
    assert r.status_code == answered
    assert r.headers["content-type"] == "application/json"
    error = r.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert words in error["message"]
    assert error["message"].endswith(f"(request {r.headers['x-request-id']})")
    assert error["code"] == code
    assert isinstance(error["type"], str)
    assert r.headers.get("x-should-retry") == ("false" if status >= 500 else None)


async def test_the_sdk_does_not_send_an_engines_failure_again(world, gateway):
    engine = await failing_engine(world)
    await add(model_added, gpu_model("llama"))
    await add(_replica, "llama-1", "llama", engine)
    secret = await new_key()
    sent = []
    transport = httpx.ASGITransport(app=gateway)

    class Counting(httpx.AsyncBaseTransport):
        async def handle_async_request(self, request):
            sent.append(request.url.path)
            return await transport.handle_async_request(request)

    http = httpx.AsyncClient(transport=Counting(), base_url="http://gw/v1")
    client_ = openai.AsyncOpenAI(api_key=secret, base_url="http://gw/v1", http_client=http)
    with pytest.raises(openai.APIStatusError) as failed:
        await client_.chat.completions.create(model="llama", messages=[])
    assert failed.value.status_code == 502
    assert "Internal Server Error" in failed.value.message
    assert len(sent) == 1


ORIGIN = "https://app.example.com"


async def test_cors_answers_an_allowed_origins_preflight_before_the_key(world, gateway, settings):
    settings.LLMGW = replace(settings.LLMGW, cors_origins=(ORIGIN,))
    gateway.cors_origins = settings.LLMGW.cors_origins
    secret = await served(world)
    preflight = {"Origin": ORIGIN, "Access-Control-Request-Method": "POST"}
    async with client(gateway, None) as c:
        r = await c.options("/v1/chat/completions", headers=preflight)
        other = await c.options(
            "/v1/chat/completions", headers={**preflight, "Origin": "https://evil.example"}
        )
    assert r.status_code == 204
    assert r.headers["access-control-allow-origin"] == ORIGIN
    assert "authorization" in r.headers["access-control-allow-headers"]
    assert "POST" in r.headers["access-control-allow-methods"]
    assert other.status_code == 401
    assert "access-control-allow-origin" not in other.headers
    async with client(gateway, secret) as c:
        answer = await c.post(
            "/v1/chat/completions", json=chat("llama"), headers={"Origin": ORIGIN}
        )
    assert answer.status_code == 200
    assert answer.headers["access-control-allow-origin"] == ORIGIN
    assert "x-request-id" in answer.headers["access-control-expose-headers"]


async def test_without_cors_origins_nothing_is_added(world, gateway):
    assert gateway.cors_origins == ()
    secret = await served(world)
    async with client(gateway, secret) as c:
        r = await c.options(
            "/v1/models", headers={"Origin": ORIGIN, "Access-Control-Request-Method": "GET"}
        )
        answer = await c.get("/v1/models", headers={"Origin": ORIGIN})
    assert r.status_code == 405
    assert "access-control-allow-origin" not in r.headers
    assert "access-control-allow-origin" not in answer.headers


def test_cors_origins_are_read_and_checked():
    from llmgw.core.config import SettingError, _origins

    assert _origins({}) == ()
    assert _origins({"LLMGW_CORS_ORIGINS": " https://a.example/, http://b:3000 "}) == (
        "https://a.example",
        "http://b:3000",
    )
    with pytest.raises(SettingError):
        _origins({"LLMGW_CORS_ORIGINS": "a.example"})
