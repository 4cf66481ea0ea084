"""One `/v1/` request from its first byte to its answer: the key, the body read and
checked, the model found, admission by the limits, then `routing`; whatever fails is
answered with an OpenAI-style error. However it ends, it is counted once, at its end
(`accounting.account`)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from datetime import UTC, datetime
from typing import TYPE_CHECKING

import orjson

from llmgw.core import tracing
from llmgw.gateway import metrics
from llmgw.gateway.accounting import Outcome, account
from llmgw.gateway.answers import (
    JSON_HEADERS,
    MAX_BODY_BYTES,
    SHUTTING_DOWN,
    SHUTTING_DOWN_HEADERS,
    ClientGone,
    Receive,
    Refused,
    Scope,
    Send,
    bad_request,
    request_id,
    send_answer,
    too_large,
    unknown_model,
    with_id,
)
from llmgw.gateway.bands import RETRY_AFTER_S, model_work, refused
from llmgw.gateway.dialect_serve import CHAT_PATH, Dialect, dialect_for
from llmgw.gateway.limits import Limiter, prompt_estimate, refusal_sentence, reservation
from llmgw.gateway.routing import route
from llmgw.gateway.state import Request, State
from llmgw.gateway.tables import Key

if TYPE_CHECKING:
    from catalog.domain import ModelSpec

log = logging.getLogger("llmgw.gateway")

ENDPOINTS = {
    "/v1/chat/completions": "chat",
    "/v1/completions": "completion",
    "/v1/embeddings": "embedding",
    # Translated to chat completions and back (dialect_serve).
    "/v1/responses": "chat",
    "/v1/messages": "chat",
}


async def _read_body(scope: Scope, receive: Receive) -> bytes:
    for name, value in scope["headers"]:
        if name == b"content-length":
            try:
                declared = int(value)
            except ValueError:
                raise bad_request("Content-Length is not a number.") from None
            if declared > MAX_BODY_BYTES:
                raise too_large()
    chunks, size = [], 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise ClientGone
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > MAX_BODY_BYTES:
            raise too_large()
        chunks.append(chunk)
        if not message.get("more_body"):
            return chunks[0] if len(chunks) == 1 else b"".join(chunks)


def _json(raw: bytes) -> dict:
    # orjson, not json: Python's reader takes NaN and Infinity (and reads 1e400 as infinity),
    # which are not JSON and which an engine should not be handed. orjson refuses them, and
    # bodies nested past 1,024 levels, and is several times faster.
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise bad_request(f"The body is not valid JSON: {exc}.") from None
    if not isinstance(body, dict):
        raise bad_request("The body must be a JSON object.")
    return body


def _parse(raw: bytes, endpoint: str) -> dict:
    body = _json(raw)
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise bad_request("'model' is required: the name of the model to use.", "missing_model")
    stream = body.get("stream")
    if stream is not None and not isinstance(stream, bool):
        raise bad_request("'stream' must be true or false.")
    if stream and endpoint == "embedding":
        raise bad_request("Embeddings cannot be streamed.")
    return body


# Where each endpoint's body says how many tokens to write at most, in the order engines
# read them (OpenAI's newer name first).
MAX_TOKENS_FIELDS = {"chat": ("max_completion_tokens", "max_tokens"), "completion": ("max_tokens",)}


def _asked(body: dict, endpoint: str) -> tuple[str, int] | None:
    """The field that says how many tokens to write at most, and its figure; None when the
    body gives none. 400 for one that is not a whole number."""
    for name in MAX_TOKENS_FIELDS.get(endpoint, ()):
        value = body.get(name)
        if value is not None:
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise bad_request(f"'{name}' must be a whole number, 0 or more.", param=name)
            return name, value
    return None


def _capped(req: Request, spec, asked: tuple[str, int] | None) -> tuple[str, int] | None:
    """`asked` held to the caps on it, its key's (the limits' max_tokens) and its model's (the
    catalog's max_output): a 400 naming the cap when it asks for more. A request that asks
    for nothing is given the smaller cap as its max_tokens, so no engine writes past it."""
    if req.endpoint == "embedding":
        return asked
    key_cap, model_cap = req.key.max_tokens, spec.max_output
    if key_cap is None and model_cap is None:
        return asked
    if asked is None:
        cap = min(c for c in (key_cap, model_cap) if c is not None)
        req.body["max_tokens"] = cap
        req.body_changed = True
        return "max_tokens", cap
    name, value = asked
    if key_cap is not None and value > key_cap:
        why = f"this API key allows at most {key_cap:,} a request"
    elif model_cap is not None and value > model_cap:
        why = f"model {spec.name} writes at most {model_cap:,} (its max_output)"
    else:
        return asked
    raise bad_request(f"'{name}' is {value:,}, more than {why}.", "max_tokens_too_large", name)


def _reserved(cfg, req: Request, spec, asked: tuple[str, int] | None) -> int:
    """What `req` may use at most, to hold against the token limits (`limits.reservation`):
    its prompt estimate and, for each choice it asks for (`n`), its completion."""
    if req.endpoint == "embedding":
        return req.estimate
    n = req.body.get("n")
    return reservation(
        prompt=req.estimate,
        asked=asked[1] if asked is not None else None,
        default=cfg.reserve_max_tokens,
        cap=spec.max_output,
        choices=n if isinstance(n, int) and not isinstance(n, bool) and n > 1 else 1,
    )


async def serve(rt: State, scope: Scope, receive: Receive, send: Send) -> None:
    """Answer one `/v1/` request, whatever happens: an error is always an OpenAI-style body.
    With tracing on, inside a span of its own (docs/tracing.md)."""
    if tracing.TRACER is None:
        await _serve(rt, scope, receive, send, None)
        return
    path = scope["path"]
    with tracing.span(
        f"{scope['method']} {path}",
        "SERVER",
        **{"http.request.method": scope["method"], "url.path": path},
    ) as span:
        await _serve(rt, scope, receive, send, span)


async def _serve(rt: State, scope: Scope, receive: Receive, send: Send, span) -> None:
    """The request as a stack of steps: its key; the models listed, or its body read and
    checked (`_request`), held to its caps and limits (`_admit`), and sent to a replica
    (`routing.route`, which passes the engine's answer back). A step that fails raises,
    and is answered below. Whichever way it went, it is counted once, at its end."""
    out = Outcome(started=time.perf_counter(), rid=request_id(scope["headers"]))
    send = with_id(send, out.rid)
    tracing.said(span, **{"llmgw.request_id": out.rid})
    req: Request | None = None
    dialect = dialect_for(scope["path"], send, out.rid)
    if dialect is not None:
        send = dialect.send  # the answer, the gateway's own errors too, in the caller's API
    try:
        key = await _key(rt, scope, span)
        path = scope["path"]
        if path == "/v1/models" or path.startswith("/v1/models/"):
            await _models(rt, key, scope, send, out)
            return
        req, spec = await _request(rt, key, scope, receive, out.started, dialect)
        req.request_id = out.rid
        await _admit(rt, req, spec, out, span)
        status = await route(rt, req, receive, send)
        out.model = req.model  # a fallback's, when one served it
        out.answered(status)
    except Refused as refused:
        await _refused(send, refused, out, span)
    except ClientGone:
        _gone(req, out)
    except asyncio.CancelledError:
        if not rt.stopping:
            raise
        # Cut by a server that stopped waiting for it (Runtime.drain): said, and counted.
        asyncio.current_task().uncancel()
        await _stopping(send, out)
    except Exception:
        # A bug of ours, or something no rule foresaw: still an OpenAI-style answer, counted.
        log.exception("gateway request %s %s (%s) failed", scope["method"], scope["path"], out.rid)
        await _failed(send, out)
    finally:
        # Cancelled from underneath too (daphne gives up on an application some seconds
        # after its connection is lost): what it held and used still counts.
        account(rt, req, out, span)


async def _key(rt: State, scope: Scope, span) -> Key:
    """The caller's API key (401 without a good one), told to the request's span."""
    with tracing.span("llmgw.admission.key"):
        key = await rt.key_of(scope["headers"])
    if span is not None:
        project = rt.tables.scope_names.get(key.scopes[0], key.scopes[0])
        tracing.said(span, **{"llmgw.key": key.prefix, "llmgw.project": project})
    return key


async def _models(rt: State, key: Key, scope: Scope, send: Send, out: Outcome) -> None:
    """`GET /v1/models` and `/v1/models/{name}`: the models the key may use."""
    path = scope["path"]
    if scope["method"] != "GET":
        raise Refused(405, "Use GET.", "invalid_request_error", reason="bad_request")
    # The ASGI path is decoded already: `/v1/models/org%2Fm` names `org/m`.
    name = path[len("/v1/models/") :] if path != "/v1/models" else None
    answer = rt.models_json(key) if name is None else rt.model_json(key, name)
    out.status = 200  # the span's, even when the send is cut; counted once it is sent
    await send_answer(send, 200, answer)
    out.answered(200)


async def _request(
    rt: State, key: Key, scope: Scope, receive: Receive, started: float, dialect: Dialect | None
) -> tuple[Request, ModelSpec]:
    """The request its URL, method and body make, and the model it names (404 for one the
    key may not use); 400 for a body that is not what its endpoint takes. A body in another
    API (`dialect`) goes on as the chat completion it translates to."""
    path, method = scope["path"], scope["method"]
    endpoint = ENDPOINTS.get(path)
    if endpoint is None:
        raise Refused(
            404,
            f"Unknown request URL: {method} {path}.",
            "invalid_request_error",
            "unknown_url",
            reason="bad_request",
        )
    if method != "POST":
        raise Refused(405, f"Use POST for {path}.", "invalid_request_error", reason="bad_request")
    raw = await _read_body(scope, receive)
    if dialect is not None:
        raw, path = orjson.dumps(dialect.translated(_json(raw))), CHAT_PATH
    body = _parse(raw, endpoint)
    spec = rt.tables.resolve(body["model"])
    if spec is None or not rt.tables.allows(key, spec.name):
        raise unknown_model(body["model"])
    options = body.get("stream_options")
    req = Request(
        key=key,
        endpoint=endpoint,
        path=path,
        body=body,
        raw=raw,
        stream=body.get("stream") is True,
        wants_usage=isinstance(options, dict) and options.get("include_usage") is True,
        started=started,
        model=spec.name,
        native=dialect.native_body if dialect is not None else None,
    )
    req.estimate = prompt_estimate(len(raw))
    return req, spec


async def _admit(rt: State, req: Request, spec: ModelSpec, out: Outcome, span) -> None:
    """`req` held to its caps on `max_tokens` (400 past one) and let in by the limits with
    what it may use reserved (429 past one), then begun in the usage book."""
    req.reserved = _reserved(rt.cfg, req, spec, _capped(req, spec, _asked(req.body, req.endpoint)))
    out.model = spec.name
    tracing.said(span, **{"gen_ai.request.model": req.body["model"], "llmgw.model": spec.name})
    req.admitted = time.time()
    _budgeted(rt, req)
    _displaced(rt, req)
    with tracing.span("llmgw.admission.limits"):
        await _limited(rt, req)
    rt.usage.begin(req, req.admitted)


def _budgeted(rt: State, req: Request) -> None:
    """Let in by the budgets along its key's chain (tenancy/budgets.py, the book the tables
    hold), or a 429 until the refusing one resets; a budget spent past its warning share is
    told in a header on the answer."""
    book = rt.tables.budgets
    if not book.budgets:
        return
    now = datetime.fromtimestamp(req.admitted, UTC)
    verdict = book.verdict(req.key.chain(), now)
    if not verdict.allowed:
        raise Refused(
            429,
            verdict.refusal,
            "insufficient_quota",
            "budget_exceeded",
            reason="budget",
            retry_after=verdict.retry_after(now),
        )
    if verdict.warnings:
        req.warning = verdict.warnings[0]


def _displaced(rt: State, req: Request) -> None:
    """A 429 for a request of a band below others present while its model's waiting work
    is past its bound (llmgw/gateway/bands.py); else its band noted as present."""
    ups = rt.tables.upstreams.get(req.model, ())
    present = rt.bands_present(req.model)
    if ups and present.keys() - {req.key.band}:
        pressure = model_work(
            ((u.replica_id, u.weight) for u in ups),
            rt.inflight,
            rt.readings,
            rt.inflight_read,
            rt.slots,
        )
        if refused(req.key.band, present, pressure):
            metrics.DISPLACED.labels(req.model, req.key.band).inc()
            raise Refused(
                429,
                f"Model {req.model} is overloaded ({pressure.work} requests at or waiting "
                f"for its replicas, past {pressure.bound}): requests of band "
                f"{req.key.band} wait until it keeps up; try again shortly.",
                "rate_limit_error",
                "model_overloaded",
                reason="overloaded",
                retry_after=RETRY_AFTER_S,
            )
    rt.band_seen(req.model, req.key.band)


async def _limited(rt: State, req: Request) -> None:
    """Let in by every limit along its key's chain, holding what it reserves; else a 429."""
    checks = Limiter.checks(req.key, rt.tables.limits, req.reserved)
    if not checks:
        return
    refusal, req.held = await rt.limiter.admit(checks, req.admitted)
    if refusal is None:
        return
    raise Refused(
        429,
        refusal_sentence(refusal, req.key, rt.tables.scope_names),
        "rate_limit_error" if refusal.subject.endswith(":req") else "tokens",
        "rate_limit_exceeded",
        reason="limit",
        retry_after=refusal.retry_after,
    )


# Each way a request can fail, answered (when it still can be) and noted for `account`.


async def _refused(send: Send, refused: Refused, out: Outcome, span) -> None:
    out.answered(refused.status)
    out.failed = refused.reason
    tracing.said(span, **{"llmgw.refused": refused.reason, "error.type": refused.code})
    headers = JSON_HEADERS
    if refused.retry_after is not None:
        headers = [*JSON_HEADERS, (b"retry-after", str(refused.retry_after).encode())]
    elif refused.code == "model_unplaceable":
        headers = [*JSON_HEADERS, (b"x-should-retry", b"false")]
    await send_answer(send, refused.status, refused.body(out.rid), headers)


def _gone(req: Request | None, out: Outcome) -> None:
    """The caller hung up. Once the whole answer had passed that is no failure: only the
    close was left."""
    if req is not None and req.done:
        out.model = req.model
        out.answered(200)
        if req.verdict is None:
            req.verdict = ""
    else:
        out.status = 499  # as nginx says it: the client went before its answer
        out.failed = "client_gone"


async def _stopping(send: Send, out: Outcome) -> None:
    out.status, out.failed = 503, "shutdown"
    with contextlib.suppress(Exception):  # the answer may have begun already
        await send_answer(send, 503, SHUTTING_DOWN.body(out.rid), SHUTTING_DOWN_HEADERS)


async def _failed(send: Send, out: Outcome) -> None:
    out.answered(500)
    out.failed = "internal"
    error = Refused(500, "The gateway failed to answer.", "server_error", reason="internal")
    with contextlib.suppress(Exception):  # the answer may have begun already
        await send_answer(send, 500, error.body(out.rid))
