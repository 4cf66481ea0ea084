"""Spans from real gateway requests and a reconciler pass, with the SDK's in-memory exporter
(issue 14, item 1). A real `llmgw serve` sending to an OTLP/HTTP receiver is
tests/e2e/test_tracing.py."""

from __future__ import annotations

import pytest
from aiohttp import web
from asgiref.sync import sync_to_async
from django.conf import settings
from django.utils import timezone
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from fleet.reconciler.run import reconcile_once
from llmgw.core import tracing
from llmgw.core.secrets import engine_key
from tests.fleet.builders import gpu_model, model_added, node_add

from .test_app import add, chat, client, new_key
from .world import _replica

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def spans():
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracing.use(provider)
    yield exporter
    tracing.use(None)


class HeadersSeen:
    """An OpenAI-compatible engine that keeps the headers of each request it answers."""

    def __init__(self) -> None:
        self.headers: list[dict] = []
        self.runner = None

    async def start(self) -> str:
        async def answer(request: web.Request) -> web.Response:
            self.headers.append(dict(request.headers))
            return web.json_response(
                {
                    "id": "x",
                    "object": "chat.completion",
                    "model": "llama",
                    "choices": [{"index": 0, "message": {"role": "assistant", "content": "hi"}}],
                    "usage": {"prompt_tokens": 7, "completion_tokens": 2, "total_tokens": 9},
                }
            )

        app = web.Application()
        app.router.add_post("/v1/chat/completions", answer)
        self.runner = web.AppRunner(app)
        await self.runner.setup()
        site = web.TCPSite(self.runner, "127.0.0.1", 0)
        await site.start()
        return f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}"


async def test_a_request_is_a_span_with_admission_routing_and_the_upstream_attempt(
    world, gateway, spans
):
    await add(model_added, gpu_model("llama", aliases=["chat"]))
    engine = HeadersSeen()
    await add(_replica, "llama-1", "llama", await engine.start())
    secret = await new_key()
    try:
        async with client(gateway, secret) as c:
            r = await c.post("/v1/chat/completions", json=chat("chat"))
    finally:
        await engine.runner.cleanup()
    assert r.status_code == 200, r.text

    by_name = {s.name: s for s in spans.get_finished_spans()}
    request = by_name["POST /v1/chat/completions"]
    assert request.kind.name == "SERVER"
    a = request.attributes
    assert (a["llmgw.model"], a["gen_ai.request.model"], a["llmgw.served_by"]) == (
        "llama",
        "chat",
        "llama",
    )
    assert a["llmgw.project"] == "project:Acme/ml/chat"
    assert a["llmgw.key"] == secret[: len(a["llmgw.key"])]
    assert (a["http.response.status_code"], a["gen_ai.usage.input_tokens"]) == (200, 7)
    assert a["gen_ai.usage.output_tokens"] == 2
    assert a["llmgw.request_id"] == r.headers["x-request-id"]  # what a team quotes
    for child in (
        "llmgw.admission.key",
        "llmgw.admission.limits",
        "llmgw.routing",
        "llmgw.upstream",
    ):
        assert by_name[child].parent.span_id == request.context.span_id, child
        assert by_name[child].context.trace_id == request.context.trace_id
    routing = by_name["llmgw.routing"].attributes
    assert routing["llmgw.replica"] == "llama-1"
    assert routing["llmgw.why"] == "fewest requests in flight (0) of 1 ready"
    upstream = by_name["llmgw.upstream"]
    assert upstream.kind.name == "CLIENT"
    assert upstream.attributes["http.response.status_code"] == 200
    # The engine was told the attempt's trace and span, as W3C says.
    trace_id, span_id = upstream.context.trace_id, upstream.context.span_id
    flags = int(upstream.context.trace_flags)
    assert flags & 1  # sampled
    assert engine.headers[0]["traceparent"] == f"00-{trace_id:032x}-{span_id:016x}-{flags:02x}"


async def test_a_refused_request_says_why_and_an_unreachable_replica_is_an_attempt(
    world, gateway, spans
):
    await add(model_added, gpu_model("llama"))
    await add(_replica, "llama-1", "llama", "http://127.0.0.1:9")  # nothing listens there
    secret = await new_key()
    async with client(gateway, "llmgw_key_wrong") as c:
        assert (await c.post("/v1/chat/completions", json=chat("llama"))).status_code == 401
    async with client(gateway, secret) as c:
        answer = await c.post("/v1/chat/completions", json=chat("llama"))
        assert answer.status_code == 502

    finished = spans.get_finished_spans()
    refused, failed = [s for s in finished if s.name == "POST /v1/chat/completions"]
    assert refused.attributes["llmgw.refused"] == "auth"
    assert refused.attributes["http.response.status_code"] == 401
    assert failed.attributes["http.response.status_code"] == 502
    assert failed.status.status_code.name == "ERROR"
    assert failed.attributes["llmgw.request_id"] == answer.headers["x-request-id"]
    attempt = next(s for s in finished if s.name == "llmgw.upstream")
    assert attempt.attributes["error.type"] == "unreachable"
    assert [s.attributes["llmgw.why"] for s in finished if s.name == "llmgw.routing"][-1] == (
        "no replica ready untried (1 tried)"
    )


def _pass(now):
    model_added(gpu_model("llama"))
    node_add("gpu-a", now=now)
    return reconcile_once(now=now)


async def test_a_reconciler_pass_is_a_span_with_its_decisions_as_events(spans, no_settle):
    done = await sync_to_async(_pass)(timezone.now())

    [span] = [s for s in spans.get_finished_spans() if s.name == "llmgw.reconciler.pass"]
    assert (span.attributes["llmgw.ran"], span.attributes["llmgw.starts"]) == (True, 1)
    assert [e.attributes["message"] for e in span.events] == done["events"]
    assert any("placed on gpu-a" in e.attributes["message"] for e in span.events)


async def test_off_nothing_is_traced_and_the_engine_gets_no_traceparent(world, gateway):
    assert tracing.TRACER is None
    await add(model_added, gpu_model("llama"))
    engine = HeadersSeen()
    await add(_replica, "llama-1", "llama", await engine.start())
    secret = await new_key()
    try:
        async with client(gateway, secret) as c:
            assert (await c.post("/v1/chat/completions", json=chat("llama"))).status_code == 200
    finally:
        await engine.runner.cleanup()
    assert "traceparent" not in {k.lower() for k in engine.headers[0]}
    assert (
        engine.headers[0]["Authorization"] == f"Bearer {engine_key(settings.SECRET_KEY, 'llama-1')}"
    )


def test_the_environment_decides_whether_traces_are_sent():
    assert not tracing.wanted({})
    assert tracing.wanted({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318"})
    assert tracing.wanted({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://c:4318/v1/traces"})
    endpoint = {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318"}
    assert not tracing.wanted({**endpoint, "OTEL_SDK_DISABLED": "true"})
    assert not tracing.wanted({**endpoint, "OTEL_TRACES_EXPORTER": "none"})
