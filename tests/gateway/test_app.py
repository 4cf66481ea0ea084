"""The gateway's ASGI app in this process, in front of real sim engines on this loop.

Keys, models and replicas are real rows; the app reads them through its tables,
as it does in `llmgw serve`. End-to-end tests with agents and the `openai`
client are in tests/e2e/test_gateway.py.
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import replace

import httpx
import pytest
from asgiref.sync import sync_to_async

from fleet.models import ModelState, Replica
from llmgw.gateway import app as gateway_app
from llmgw.gateway.app import Gateway
from llmgw.gateway.load import BOARD
from llmgw.gateway.streaming import split_events
from tenancy.models import RequestRecord, Usage
from tenancy.services import api_key_create
from tests.fleet.builders import gpu_model, model_added
from tests.gateway.world import _replica

pytestmark = pytest.mark.django_db(transaction=True)


async def add(fn, *args, **kwargs):
    return await sync_to_async(fn)(*args, **kwargs)


async def new_key(**kwargs) -> str:
    _, secret = await add(api_key_create, project="Acme/ml/chat", name="k", actor="t", **kwargs)
    return secret


def client(gateway: Gateway, secret: str | None) -> httpx.AsyncClient:
    headers = {"Authorization": f"Bearer {secret}"} if secret else {}
    return httpx.AsyncClient(
        transport=httpx.ASGITransport(app=gateway), base_url="http://gw", headers=headers
    )


def chat(model: str, **extra) -> dict:
    return {"model": model, "messages": [{"role": "user", "content": "hello there"}], **extra}


async def refreshed(gateway: Gateway) -> None:
    """The tables read again now, as the background task does every second."""
    await gateway.runtime._refresh()


async def test_everything_but_v1_goes_to_django(gateway):
    async with client(gateway, None) as c:
        r = await c.get("/api/v1/models")
    assert (r.status_code, r.text) == (418, "django")


async def test_a_chat_completion_is_answered_by_a_ready_replica_with_its_engine_key(world, gateway):
    await add(model_added, gpu_model("llama", aliases=["chat"]))
    await add(_replica, "llama-1", "llama", await world.engine("llama-1", "llama"))
    secret = await new_key()
    async with client(gateway, secret) as c:
        r = await c.post("/v1/chat/completions", json=chat("chat", max_tokens=3))
    assert r.status_code == 200, r.text
    body = r.json()
    # Asked for by alias, sent on under the catalog name.
    assert body["model"] == "llama"
    assert body["usage"]["completion_tokens"] == 3
    assert world.engines["llama-1"].requests_total == 1
    # The caller is told which replica answered (the console's playground shows it).
    assert r.headers["x-llmgw-replica"] == "llama-1"


async def test_models_lists_what_the_key_may_use(world, gateway):
    await add(model_added, gpu_model("llama", aliases=["chat"]))
    await add(model_added, gpu_model("qwen"))
    secret = await new_key(models=["chat"])
    async with client(gateway, secret) as c:
        r = await c.get("/v1/models")
    assert r.status_code == 200
    assert [m["id"] for m in r.json()["data"]] == ["llama"]
    assert r.json()["data"][0]["aliases"] == ["chat"]


@pytest.mark.parametrize(
    ("header", "message"),
    [
        (None, "You didn't provide an API key"),
        ("Bearer llmgw_key_wrong", "Incorrect API key provided."),
        ("Basic abc", "You didn't provide an API key"),
    ],
)
async def test_missing_or_wrong_keys_get_the_openai_401(world, gateway, header, message):
    await add(model_added, gpu_model("llama"))
    headers = {"Authorization": header} if header else {}
    async with client(gateway, None) as c:
        r = await c.post("/v1/chat/completions", json=chat("llama"), headers=headers)
    assert r.status_code == 401
    assert r.json()["error"]["code"] == "invalid_api_key"
    assert message in r.json()["error"]["message"]


async def test_a_key_made_after_the_tables_were_read_is_accepted_at_once(world, gateway):
    # As when it is made through another server or worker: nothing here told the gateway.
    await add(model_added, gpu_model("llama"))
    first = await new_key()
    async with client(gateway, first) as c:
        assert (await c.get("/v1/models")).status_code == 200
    gateway.runtime._task.cancel()  # no read but the ones the keys ask for
    reads = []
    loader = gateway.runtime.loader
    real = loader.refresh
    loader.refresh = lambda: reads.append(1) or real()
    secret = await new_key()
    async with client(gateway, secret) as c:
        r = await c.get("/v1/models")
    assert r.status_code == 200, r.text
    # Wrong keys at once share one read of the tables, and wait for it.
    async with client(gateway, "llmgw_key_wrong") as c:
        answers = await asyncio.gather(*(c.get("/v1/models") for _ in range(20)))
    assert {a.status_code for a in answers} == {401}
    assert len(reads) == 2


async def test_a_revoked_key_is_refused_once_the_tables_refresh(world, gateway):
    from tenancy.services import api_key_revoke

    await add(model_added, gpu_model("llama"))
    key, secret = await add(api_key_create, project="Acme/ml/chat", name="k", actor="t")
    async with client(gateway, secret) as c:
        assert (await c.get("/v1/models")).status_code == 200
        await add(api_key_revoke, key_id=key.pk, actor="t")
        await refreshed(gateway)
        r = await c.get("/v1/models")
    assert r.status_code == 401
    rid = r.headers["x-request-id"]
    assert r.json()["error"]["message"] == f"Incorrect API key provided. (request {rid})"


async def test_a_model_the_key_may_not_use_is_as_unknown_as_one_that_does_not_exist(world, gateway):
    await add(model_added, gpu_model("llama"))
    await add(model_added, gpu_model("qwen"))
    secret = await new_key(models=["qwen"])
    async with client(gateway, secret) as c:
        not_allowed = await c.post("/v1/chat/completions", json=chat("llama"))
        unknown = await c.post("/v1/chat/completions", json=chat("nope"))
    for r, name in ((not_allowed, "llama"), (unknown, "nope")):
        assert r.status_code == 404
        assert r.json()["error"] == {
            "message": f"The model `{name}` does not exist or you do not have access to it. "
            f"(request {r.headers['x-request-id']})",
            "type": "invalid_request_error",
            "param": None,
            "code": "model_not_found",
        }


@pytest.mark.parametrize(
    ("method", "path", "body", "status", "words"),
    [
        ("POST", "/v1/chat/completions", b"{not json", 400, "not valid JSON"),
        ("POST", "/v1/chat/completions", b"[1, 2]", 400, "must be a JSON object"),
        # Nested deeper than Python's parser recurses: a RecursionError, not a 500.
        (
            "POST",
            "/v1/chat/completions",
            b'{"model": "llama", "x": ' + b"[" * 100_000 + b"]" * 100_000 + b"}",
            400,
            "not valid JSON",
        ),
        # Not JSON numbers, though Python's json module reads them: never passed on.
        ("POST", "/v1/chat/completions", b'{"model": "llama", "temperature": NaN}', 400, "JSON"),
        ("POST", "/v1/completions", b'{"model": "llama", "top_p": Infinity}', 400, "JSON"),
        ("POST", "/v1/completions", b'{"model": "llama", "top_p": -Infinity}', 400, "JSON"),
        # Past what a double holds: Python reads it as infinity.
        ("POST", "/v1/completions", b'{"model": "llama", "top_p": 1e400}', 400, "JSON"),
        ("POST", "/v1/chat/completions", b'{"messages": []}', 400, "'model' is required"),
        ("POST", "/v1/chat/completions", b'{"model": 3}', 400, "'model' is required"),
        ("POST", "/v1/chat/completions", b'{"model": "llama", "stream": "y"}', 400, "'stream'"),
        (
            "POST",
            "/v1/embeddings",
            b'{"model": "llama", "stream": true}',
            400,
            "cannot be streamed",
        ),
        ("GET", "/v1/chat/completions", None, 405, "Use POST"),
        ("POST", "/v1/models", b"{}", 405, "Use GET"),
        ("POST", "/v1/images/generations", b"{}", 404, "Unknown request URL"),
    ],
)
async def test_bad_requests_get_a_clear_error_and_reach_no_engine(
    world, gateway, method, path, body, status, words
):
    await add(model_added, gpu_model("llama"))
    await add(_replica, "llama-1", "llama", await world.engine("llama-1", "llama"))
    secret = await new_key()
    async with client(gateway, secret) as c:
        r = await c.request(method, path, content=body)
    assert r.status_code == status
    assert words in r.json()["error"]["message"]
    assert world.engines["llama-1"].requests_total == 0


@pytest.mark.parametrize(
    ("key_cap", "max_output", "asked", "words"),
    [
        (
            100,
            None,
            {"max_tokens": 101},
            "'max_tokens' is 101, more than this API key allows at most 100 a request.",
        ),
        (
            None,
            50,
            {"max_completion_tokens": 60},
            "'max_completion_tokens' is 60, more than "
            "model llama writes at most 50 (its max_output).",
        ),
        (100, 50, {"max_tokens": 80}, "model llama writes at most 50"),
        (40, 50, {"max_tokens": 45}, "this API key allows at most 40 a request"),
    ],
)
async def test_a_request_asking_past_a_cap_on_max_tokens_is_a_400_naming_it(
    world, gateway, key_cap, max_output, asked, words
):
    await add(model_added, gpu_model("llama", max_output=max_output))
    await add(_replica, "llama-1", "llama", await world.engine("llama-1", "llama"))
    secret = await new_key(limits={"max_tokens": key_cap} if key_cap else None)
    async with client(gateway, secret) as c:
        r = await c.post("/v1/chat/completions", json=chat("llama", **asked))
    assert r.status_code == 400
    error = r.json()["error"]
    assert words in error["message"]
    assert (error["type"], error["code"], error["param"]) == (
        "invalid_request_error",
        "max_tokens_too_large",
        next(iter(asked)),
    )
    assert world.engines["llama-1"].requests_total == 0


async def test_a_request_within_the_caps_goes_and_one_asking_nothing_is_given_the_cap(
    world, gateway
):
    await add(model_added, gpu_model("llama", max_output=50))
    # The sim engine writes 16 tokens unless told otherwise.
    await add(_replica, "llama-1", "llama", await world.engine("llama-1", "llama", max_tokens=16))
    secret = await new_key(limits={"max_tokens": 5})
    async with client(gateway, secret) as c:
        exactly = await c.post("/v1/chat/completions", json=chat("llama", max_tokens=5))
        unasked = await c.post("/v1/chat/completions", json=chat("llama"))
        embedded = await c.post("/v1/embeddings", json={"model": "llama", "input": "a b c"})
    assert exactly.status_code == 200 and exactly.json()["usage"]["completion_tokens"] == 5
    assert unasked.status_code == 200 and unasked.json()["usage"]["completion_tokens"] == 5
    assert embedded.status_code == 200  # an embedding writes nothing: no cap applies


async def test_a_body_over_the_bound_is_refused_before_it_is_read(world, gateway):
    await add(model_added, gpu_model("llama"))
    secret = await new_key()
    big = b'{"model": "llama", "prompt": "' + b"x" * (gateway_app.MAX_BODY_BYTES + 1) + b'"}'
    async with client(gateway, secret) as c:
        r = await c.post("/v1/completions", content=big)
    assert r.status_code == 413
    assert r.json()["error"]["code"] == "request_too_large"


async def test_requests_spread_over_ready_replicas(world, gateway):
    await add(model_added, gpu_model("llama", scaling={"min": 2, "max": 2}))
    for rid in ("llama-1", "llama-2"):
        await add(_replica, rid, "llama", await world.engine(rid, "llama"))
    secret = await new_key()
    async with client(gateway, secret) as c:
        for _ in range(6):
            assert (
                await c.post("/v1/completions", json={"model": "llama", "prompt": "hi"})
            ).is_success
    assert world.engines["llama-1"].requests_total == 3
    assert world.engines["llama-2"].requests_total == 3


async def test_a_replica_refusing_connections_is_retried_elsewhere_and_then_avoided(world, gateway):
    await add(model_added, gpu_model("llama", scaling={"min": 2, "max": 2}))
    await add(_replica, "llama-1", "llama", "http://127.0.0.1:9")  # nothing listens there
    await add(_replica, "llama-2", "llama", await world.engine("llama-2", "llama"))
    secret = await new_key()
    async with client(gateway, secret) as c:
        for _ in range(4):
            r = await c.post("/v1/chat/completions", json=chat("llama"))
            assert r.status_code == 200, r.text
    assert world.engines["llama-2"].requests_total == 4
    assert "llama-1" in gateway.runtime.suspect


async def test_no_replica_reachable_is_a_502_after_one_retry(world, gateway):
    await add(model_added, gpu_model("llama", scaling={"min": 3, "max": 3}))
    for rid in ("llama-1", "llama-2", "llama-3"):
        await add(_replica, rid, "llama", "http://127.0.0.1:9")
    secret = await new_key()
    async with client(gateway, secret) as c:
        r = await c.post("/v1/chat/completions", json=chat("llama"))
    assert r.status_code == 502
    assert r.json()["error"]["code"] == "upstream_unreachable"
    assert len(gateway.runtime.suspect) == 2


async def test_a_model_with_none_ready_falls_back_in_order(world, gateway):
    await add(model_added, gpu_model("small"))
    await add(model_added, gpu_model("big", fallbacks=["small"]))
    await add(_replica, "small-1", "small", await world.engine("small-1", "small"))
    secret = await new_key()
    async with client(gateway, secret) as c:
        r = await c.post("/v1/chat/completions", json=chat("big"))
    assert r.status_code == 200
    assert r.json()["model"] == "small"


async def test_a_model_with_none_ready_and_no_fallback_is_a_503_saying_why(world, gateway):
    await add(model_added, gpu_model("llama"))
    await add(_replica, "llama-1", "llama", "", state="starting")
    secret = await new_key()
    async with client(gateway, secret) as c:
        r = await c.post("/v1/chat/completions", json=chat("llama"))
    assert r.status_code == 503
    assert r.headers["retry-after"] == "10"
    assert r.json()["error"]["message"] == (
        "Model llama has no ready replica: it is loading (1 replica starting). "
        f"(request {r.headers['x-request-id']})"
    )


async def test_an_on_demand_model_is_asked_for_and_waited_on_until_ready(world, gateway):
    await add(model_added, gpu_model("code", scaling={"min": 0, "max": 1}))
    secret = await new_key()
    endpoint = await world.engine("code-1", "code")

    async def becomes_ready():
        while not await add(
            ModelState.objects.filter(pk="code", last_requested_at__isnull=False).exists
        ):
            await asyncio.sleep(0.05)
        assert BOARD.waiting.get("code") == 1
        await add(_replica, "code-1", "code", endpoint)
        await refreshed(gateway)

    async with client(gateway, secret) as c:
        r, _ = await asyncio.gather(
            c.post("/v1/chat/completions", json=chat("code")), becomes_ready()
        )
    assert r.status_code == 200, r.text
    assert BOARD.waiting["code"] == 0


async def test_an_on_demand_model_not_ready_within_the_bound_is_told_it_is_loading(
    world, gateway, settings
):
    settings.LLMGW = replace(settings.LLMGW, on_demand_wait=0.3)
    await add(model_added, gpu_model("code", scaling={"min": 0, "max": 1}))
    secret = await new_key()
    async with client(gateway, secret) as c:
        r = await c.post("/v1/chat/completions", json=chat("code"))
    assert r.status_code == 503
    assert r.headers["retry-after"] == "10"
    assert r.json()["error"]["code"] == "model_loading"
    assert "is loading" in r.json()["error"]["message"]


async def test_an_on_demand_model_that_cannot_be_placed_says_there_is_no_room(world, gateway):
    await add(model_added, gpu_model("code", scaling={"min": 0, "max": 1}))
    await add(
        ModelState.objects.create,
        model="code",
        unplaceable=True,
        explanation=[{"profile": "gpu", "reasons": ["no node has 1 free h100-80g GPU"]}],
    )
    secret = await new_key()
    async with client(gateway, secret) as c:
        r = await c.post("/v1/chat/completions", json=chat("code"))
    # Waiting will not bring it: no Retry-After, and the openai SDK told not to retry.
    assert r.status_code == 503
    assert "retry-after" not in r.headers
    assert r.headers["x-should-retry"] == "false"
    assert r.json()["error"]["code"] == "model_unplaceable"
    assert r.json()["error"]["message"] == (
        "Model code cannot be started now: no room: no node has 1 free h100-80g GPU. "
        f"(request {r.headers['x-request-id']})"
    )


async def test_a_key_past_its_requests_per_minute_gets_429_with_retry_after(world, gateway):
    await add(model_added, gpu_model("llama"))
    await add(_replica, "llama-1", "llama", await world.engine("llama-1", "llama"))
    secret = await new_key(limits={"requests_per_minute": 2})
    async with client(gateway, secret) as c:
        codes = [(await c.post("/v1/chat/completions", json=chat("llama"))) for _ in range(3)]
    assert [r.status_code for r in codes] == [200, 200, 429]
    refused = codes[2]
    assert int(refused.headers["retry-after"]) >= 1
    assert refused.json()["error"]["code"] == "rate_limit_exceeded"
    assert "allows 2 requests per minute" in refused.json()["error"]["message"]
    assert world.engines["llama-1"].requests_total == 2


async def test_a_scope_limit_up_the_tree_applies_to_every_key_beneath(world, gateway):
    from tenancy.services import limit_set

    await add(model_added, gpu_model("llama"))
    await add(_replica, "llama-1", "llama", await world.engine("llama-1", "llama"))
    await add(
        limit_set, scope="team:Acme/ml", requests_per_minute=1, tokens_per_minute=None, actor="t"
    )
    first, second = await new_key(), await new_key()
    async with client(gateway, first) as c:
        assert (await c.post("/v1/chat/completions", json=chat("llama"))).status_code == 200
    async with client(gateway, second) as c:
        r = await c.post("/v1/chat/completions", json=chat("llama"))
    assert r.status_code == 429
    assert "team:Acme/ml allows 1 requests per minute" in r.json()["error"]["message"]


async def test_a_burst_on_a_tokens_per_minute_key_stays_within_its_limit(world, gateway):
    # 20 requests at once that may each use about 40 tokens (a prompt estimated at ~23 from
    # its body, 17 to write) on a key allowed 100 a minute: each holds its 40 from its
    # admission, so those that would pass the limit are refused before they reach the
    # engine, whatever order they end in.
    await add(model_added, gpu_model("llama"))
    await add(_replica, "llama-1", "llama", await world.engine("llama-1", "llama"))
    secret = await new_key(limits={"tokens_per_minute": 100})
    async with client(gateway, secret) as c:
        answers = await asyncio.gather(
            *(c.post("/v1/chat/completions", json=chat("llama", max_tokens=17)) for _ in range(20))
        )
    codes = [r.status_code for r in answers]
    assert set(codes) == {200, 429}
    refused = next(r for r in answers if r.status_code == 429)
    assert int(refused.headers["retry-after"]) >= 1
    assert "allows 100 tokens per minute" in refused.json()["error"]["message"]
    await gateway.runtime._flush()
    row = await add(lambda: Usage.objects.get())
    assert row.requests == 20 and row.errors == codes.count(429)
    assert 0 < row.prompt_tokens + row.completion_tokens <= 100
    assert world.engines["llama-1"].requests_total == codes.count(200)


async def test_usage_is_written_in_batches_from_the_engines_figures(world, gateway):
    await add(model_added, gpu_model("llama"))
    await add(_replica, "llama-1", "llama", await world.engine("llama-1", "llama"))
    secret = await new_key()
    answers = []
    async with client(gateway, secret) as c:
        for n in (2, 5):
            r = await c.post("/v1/chat/completions", json=chat("llama", max_tokens=n))
            answers.append(r.json()["usage"])
    await gateway.runtime._flush()
    rows = await add(lambda: list(Usage.objects.values()))
    assert len(rows) == 1
    row = rows[0]
    assert row["model"] == "llama" and row["requests"] == 2 and row["errors"] == 0
    assert row["prompt_tokens"] == sum(a["prompt_tokens"] for a in answers)
    assert row["completion_tokens"] == sum(a["completion_tokens"] for a in answers) == 7
    used = await add(lambda: Replica.objects.get(pk="llama-1").last_used_at)
    assert used is not None


async def test_usage_the_database_could_not_take_is_kept_for_the_next_write(
    world, gateway, monkeypatch
):
    await add(model_added, gpu_model("llama"))
    await add(_replica, "llama-1", "llama", await world.engine("llama-1", "llama"))
    secret = await new_key()
    async with client(gateway, secret) as c:
        await c.post("/v1/chat/completions", json=chat("llama"))

    def down(**_):
        from django.db import OperationalError

        raise OperationalError("database is away")

    monkeypatch.setattr(gateway_app, "usage_write", down)
    await gateway.runtime._flush()
    monkeypatch.undo()
    await gateway.runtime._flush()
    assert await add(lambda: Usage.objects.get().requests) == 1
    # The request's record was given back with its tallies, and written once with them.
    assert await add(RequestRecord.objects.count) == 1


async def test_each_request_is_recorded_by_its_id_in_the_usages_batch(world, gateway):
    await add(model_added, gpu_model("llama"))
    await add(_replica, "llama-1", "llama", await world.engine("llama-1", "llama"))
    secret = await new_key(limits={"requests_per_minute": 1})
    async with client(gateway, secret) as c:
        ok = await c.post(
            "/v1/chat/completions", json=chat("llama", max_tokens=3), headers={"x-request-id": "a1"}
        )
        refused = await c.post("/v1/chat/completions", json=chat("llama"))
    assert (ok.status_code, refused.status_code) == (200, 429)
    assert await add(RequestRecord.objects.count) == 0  # not one write per request
    await gateway.runtime._flush()
    records = {r.request_id: r for r in await add(lambda: list(RequestRecord.objects.all()))}
    assert set(records) == {"a1", refused.headers["x-request-id"]}
    a1, usage = records["a1"], ok.json()["usage"]
    assert (a1.endpoint, a1.model, a1.status, a1.replica, a1.error) == (
        "/v1/chat/completions", "llama", 200, "llama-1", ""
    )  # fmt: skip
    assert (a1.prompt_tokens, a1.completion_tokens) == (usage["prompt_tokens"], 3)
    assert 0 <= a1.duration_ms < 10_000
    row = await add(lambda: Usage.objects.get())
    assert (a1.key_id, a1.project_id) == (row.api_key_id, row.project_id)
    no = records[refused.headers["x-request-id"]]
    assert (no.status, no.error, no.replica, no.completion_tokens) == (429, "limit", "", 0)


async def test_no_request_is_recorded_when_none_are_kept(world, gateway, settings):
    settings.LLMGW = replace(settings.LLMGW, requests_keep_hours=0.0)
    await add(model_added, gpu_model("llama"))
    await add(_replica, "llama-1", "llama", await world.engine("llama-1", "llama"))
    secret = await new_key()
    async with client(gateway, secret) as c:
        r = await c.post("/v1/chat/completions", json=chat("llama", max_tokens=3))
    assert r.status_code == 200
    await gateway.runtime._flush()
    assert await add(lambda: Usage.objects.get().requests) == 1
    assert await add(RequestRecord.objects.count) == 0


async def test_a_stream_is_passed_on_and_the_usage_asked_for_on_the_callers_behalf_is_left_out(
    world, gateway
):
    await add(model_added, gpu_model("llama"))
    await add(_replica, "llama-1", "llama", await world.engine("llama-1", "llama"))
    secret = await new_key()
    async with client(gateway, secret) as c:
        plain = await c.post("/v1/chat/completions", json=chat("llama", stream=True, max_tokens=4))
        asked = await c.post(
            "/v1/chat/completions",
            json=chat("llama", stream=True, max_tokens=4, stream_options={"include_usage": True}),
        )
    assert plain.headers["content-type"] == "text/event-stream"
    assert plain.headers["x-llmgw-replica"] == "llama-1"
    plain_events = [e for e in plain.text.split("\n\n") if e]
    assert plain_events[-1] == "data: [DONE]"
    assert not any('"usage": {' in e for e in plain_events)
    asked_events = [e for e in asked.text.split("\n\n") if e]
    usage = json.loads(asked_events[-2].removeprefix("data: "))["usage"]
    assert usage["completion_tokens"] == 4
    await gateway.runtime._flush()
    assert await add(lambda: Usage.objects.get().completion_tokens) == 8


async def test_a_client_that_hangs_up_mid_stream_cancels_the_engines_request(world, gateway):
    await add(model_added, gpu_model("llama"))
    endpoint = await world.engine("llama-1", "llama", tokens_per_sec=20, max_tokens=1000)
    await add(_replica, "llama-1", "llama", endpoint)
    secret = await new_key()
    body = json.dumps(chat("llama", stream=True, max_tokens=1000)).encode()
    incoming: asyncio.Queue = asyncio.Queue()
    await incoming.put({"type": "http.request", "body": body, "more_body": False})
    sent = []
    got_body = asyncio.Event()

    async def send(message):
        sent.append(message)
        if message["type"] == "http.response.body" and message.get("body"):
            got_body.set()

    scope = {
        "type": "http",
        "method": "POST",
        "path": "/v1/chat/completions",
        "headers": [(b"authorization", f"Bearer {secret}".encode())],
    }
    task = asyncio.get_running_loop().create_task(gateway(scope, incoming.get, send))
    await asyncio.wait_for(got_body.wait(), 10)
    engine = world.engines["llama-1"]
    assert engine.slots.running == 1
    await incoming.put({"type": "http.disconnect"})
    await asyncio.wait_for(task, 10)
    for _ in range(100):
        if engine.slots.running == 0:
            break
        await asyncio.sleep(0.05)
    assert engine.slots.running == 0
    assert gateway.runtime.inflight["llama-1"] == 0
    assert BOARD.running["llama"] == 0


async def _hang_up(gateway, world, secret: str, body: dict, *, after_body: bool) -> None:
    """Send `body` straight to the ASGI app and hang up once the engine is working on it
    (and, `after_body`, once the answer has begun)."""
    incoming: asyncio.Queue = asyncio.Queue()
    await incoming.put({"type": "http.request", "body": json.dumps(body).encode()})
    begun = asyncio.Event()

    async def send(message):
        if message["type"] == "http.response.body" and message.get("body"):
            begun.set()

    scope = {
        "type": "http",
        "method": "POST",
        "path": "/v1/chat/completions",
        "headers": [(b"authorization", f"Bearer {secret}".encode())],
    }
    task = asyncio.get_running_loop().create_task(gateway(scope, incoming.get, send))
    engine = world.engines["llama-1"]
    if after_body:
        await asyncio.wait_for(begun.wait(), 10)
    else:
        for _ in range(200):
            if engine.slots.running:
                break
            await asyncio.sleep(0.01)
    assert engine.slots.running == 1
    await incoming.put({"type": "http.disconnect"})
    await asyncio.wait_for(task, 10)


async def test_a_whole_answer_abandoned_by_its_caller_counts_what_it_may_have_written(
    world, gateway
):
    # No usage comes from an engine whose request was cut: the prompt is counted by its
    # estimate and the completion by what the request reserved, both marked estimated,
    # and they count against the token limit as they would have.
    await add(model_added, gpu_model("llama"))
    endpoint = await world.engine("llama-1", "llama", tokens_per_sec=20)
    await add(_replica, "llama-1", "llama", endpoint)
    secret = await new_key(limits={"tokens_per_minute": 10_000})
    body = chat("llama", max_tokens=100)
    await _hang_up(gateway, world, secret, body, after_body=False)
    await gateway.runtime._flush()
    row = await add(lambda: Usage.objects.get())
    estimate = len(json.dumps(body)) // 4 + 1
    assert (row.requests, row.errors) == (1, 1)
    assert (row.prompt_tokens, row.completion_tokens) == (estimate, 100)
    assert row.estimated_tokens == estimate + 100
    counters = gateway.runtime.limiter.counters
    key_id = await add(lambda: row.api_key_id)
    ((_, held),) = await counters.take([(f"key:{key_id}:tok", 0)], time.time())
    assert held == estimate + 100


async def test_a_stream_abandoned_by_its_caller_counts_the_tokens_passed_on(world, gateway):
    await add(model_added, gpu_model("llama"))
    endpoint = await world.engine("llama-1", "llama", tokens_per_sec=20, max_tokens=1000)
    await add(_replica, "llama-1", "llama", endpoint)
    secret = await new_key()
    body = chat("llama", stream=True, max_tokens=1000)
    await _hang_up(gateway, world, secret, body, after_body=True)
    await gateway.runtime._flush()
    row = await add(lambda: Usage.objects.get())
    estimate = len(json.dumps(body)) // 4 + 1
    # The role's event, then one a token: far fewer than the 1,000 it asked for.
    assert 1 <= row.completion_tokens < 1000
    assert (row.prompt_tokens, row.estimated_tokens) == (estimate, estimate)


async def test_a_stream_cut_upstream_ends_with_an_error_event(world, gateway):
    await add(model_added, gpu_model("llama"))
    endpoint = await world.engine("llama-1", "llama", tokens_per_sec=20, max_tokens=1000)
    await add(_replica, "llama-1", "llama", endpoint)
    secret = await new_key()

    async def cut_soon():
        await asyncio.sleep(0.3)
        await world.runners[0].cleanup()

    async with client(gateway, secret) as c:
        r, _ = await asyncio.gather(
            c.post("/v1/chat/completions", json=chat("llama", stream=True, max_tokens=1000)),
            cut_soon(),
        )
    events = [e for e in r.text.split("\n\n") if e]
    assert json.loads(events[-1].removeprefix("data: "))["error"]["code"] == "upstream_cut"
    world.runners.clear()


async def test_gateway_series_reach_metrics(world, gateway):
    from llmgw.gateway.metrics import gateway_text

    await add(model_added, gpu_model("llama"))
    await add(_replica, "llama-1", "llama", await world.engine("llama-1", "llama"))
    secret = await new_key()
    async with client(gateway, secret) as c:
        await c.post("/v1/chat/completions", json=chat("llama", max_tokens=2))
        await c.post("/v1/chat/completions", json=chat("nope"))
    text = gateway_text()
    assert 'llmgw_gateway_requests_total{code="200",model="llama"}' in text
    assert 'llmgw_gateway_errors_total{model="",reason="unknown_model"}' in text
    assert 'llmgw_gateway_tokens_total{kind="completion",model="llama"}' in text
    assert "llmgw_gateway_request_duration_seconds_bucket" in text


def test_split_events_holds_an_unfinished_event_until_it_ends():
    out, rest, usage = split_events(b'data: {"a": 1}\n\ndata: {"b"', drop_usage=True)
    assert (out, rest, usage) == (b'data: {"a": 1}\n\n', b'data: {"b"', None)


def test_split_events_finds_usage_and_drops_only_the_usage_only_event():
    usage_event = b'data: {"choices": [], "usage": {"prompt_tokens": 2, "completion_tokens": 3}}'
    data = (
        b'data: {"choices": [{"delta": {}}], "usage": null}\n\n'
        + usage_event
        + b"\n\ndata: [DONE]\n\n"
    )
    out, rest, usage = split_events(data, drop_usage=True)
    assert usage == {"prompt_tokens": 2, "completion_tokens": 3}
    assert out == b'data: {"choices": [{"delta": {}}], "usage": null}\n\ndata: [DONE]\n\n'
    kept, _, _ = split_events(data, drop_usage=False)
    assert kept == data


def test_split_events_takes_crlf_and_cr_line_ends_as_the_sse_format_allows():
    data = b'data: {"a": 1}\r\n\r\ndata: {"choices": [], "usage": {"prompt_tokens": 1}}\r\n\r\ndata: {"b"'
    out, rest, usage = split_events(data, drop_usage=True)
    assert out == b'data: {"a": 1}\r\n\r\n'
    assert rest == b'data: {"b"'
    assert usage == {"prompt_tokens": 1}
    assert split_events(b"data: x\r\rdata: y", drop_usage=False) == (
        b"data: x\r\r",
        b"data: y",
        None,
    )


async def test_an_engine_answering_what_is_not_http_is_a_502_not_a_crash(world, gateway):
    async def garbage(reader, writer):
        await reader.read(65536)
        writer.write(b"garbage\r\n\r\n")
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(garbage, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    await add(model_added, gpu_model("llama"))
    await add(_replica, "llama-1", "llama", f"http://127.0.0.1:{port}")
    secret = await new_key()
    try:
        async with client(gateway, secret) as c:
            r = await c.post("/v1/chat/completions", json=chat("llama"))
    finally:
        server.close()
    assert r.status_code == 502
    assert r.json()["error"]["code"] == "upstream_invalid"


async def test_secrets_the_gateway_does_not_know_are_not_remembered(world, gateway):
    await add(model_added, gpu_model("llama"))
    secret = await new_key()
    async with client(gateway, secret) as c:
        assert (await c.get("/v1/models")).status_code == 200
        for n in range(5):
            r = await c.get("/v1/models", headers={"Authorization": f"Bearer wrong-{n}"})
            assert r.status_code == 401
        r = await c.get("/v1/models", headers={"Authorization": "Bearer " + "x" * 10_000})
        assert r.status_code == 401
    assert list(gateway.runtime._digests) == [secret]


async def test_a_model_is_retrieved_by_its_name_or_alias_as_the_openai_client_asks(world, gateway):
    import openai

    await add(model_added, gpu_model("llama", aliases=["chat"]))
    await add(model_added, gpu_model("qwen"))
    secret = await new_key(models=["llama"])
    http = httpx.AsyncClient(transport=httpx.ASGITransport(app=gateway), base_url="http://gw/v1")
    sdk = openai.AsyncOpenAI(api_key=secret, base_url="http://gw/v1", http_client=http)
    for name in ("llama", "chat"):
        model = await sdk.models.retrieve(name)
        assert (model.id, model.object, model.owned_by) == ("llama", "model", "llmgw")
    # One the key may not use reads as one that does not exist.
    for name in ("qwen", "nope"):
        with pytest.raises(openai.NotFoundError) as missing:
            await sdk.models.retrieve(name)
        assert missing.value.code == "model_not_found"
        assert f"`{name}` does not exist" in missing.value.message
    async with client(gateway, secret) as c:
        assert (await c.delete("/v1/models/llama")).status_code == 405
    await http.aclose()


async def test_a_server_stopping_writes_its_last_usage_and_removes_its_journal(
    world, gateway, tmp_path
):
    from llmgw.gateway.journal import Journal
    from tenancy.models import UsageJournal

    gateway.journal = Journal.open(tmp_path)
    await add(model_added, gpu_model("llama"))
    await add(_replica, "llama-1", "llama", await world.engine("llama-1", "llama"))
    secret = await new_key()
    async with client(gateway, secret) as c:
        await c.post("/v1/chat/completions", json=chat("llama", max_tokens=2))
        await gateway.runtime._flush()
        assert await add(lambda: UsageJournal.objects.get().batch) == 1
        await c.post("/v1/chat/completions", json=chat("llama", max_tokens=3))
    await asyncio.to_thread(gateway.runtime.flush_now)
    assert await add(lambda: Usage.objects.get().completion_tokens) == 5
    assert list((tmp_path / "usage").iterdir()) == []
    assert not await add(lambda: UsageJournal.objects.exists())


async def test_a_server_stopping_while_a_batch_is_being_written_keeps_its_journal(
    world, gateway, tmp_path, monkeypatch
):
    # Whether that batch reaches the database this process will not hear: the next start
    # settles what the database does not hold, from the journal.
    from llmgw.gateway.journal import Journal

    gateway.journal = Journal.open(tmp_path)
    await add(model_added, gpu_model("llama"))
    await add(_replica, "llama-1", "llama", await world.engine("llama-1", "llama"))
    secret = await new_key()
    async with client(gateway, secret) as c:
        await c.post("/v1/chat/completions", json=chat("llama", max_tokens=2))
    writing, release = asyncio.Event(), asyncio.Event()
    loop = asyncio.get_running_loop()

    def slow_write(**_):
        loop.call_soon_threadsafe(writing.set)
        asyncio.run_coroutine_threadsafe(release.wait(), loop).result(10)

    monkeypatch.setattr(gateway_app, "usage_write", slow_write)
    flushing = loop.create_task(gateway.runtime._flush())
    await writing.wait()
    gateway.runtime.flush_now()
    release.set()
    await flushing
    assert [p.suffix for p in (tmp_path / "usage").iterdir()] == [".journal"]
