"""Sending a request on to a replica's engine: the pool (`client`), one attempt against one
replica (`Unreachable` when it cannot be reached, so that another is tried), and a whole
(not streamed) answer passed back, its usage and verdict noted on the request for the
accounting (`accounting.account`); a stream goes on to `streaming`."""

from __future__ import annotations

import asyncio
import json
import logging
import re

from llmgw.core import tracing
from llmgw.gateway.answers import Refused, Send, send_answer, with_request
from llmgw.gateway.client import Connection, Cut, NotHTTP, Pool
from llmgw.gateway.dialects.responses import chat_usage
from llmgw.gateway.load import BOARD
from llmgw.gateway.state import Request, State
from llmgw.gateway.streaming import model_named, relay_stream
from llmgw.gateway.tables import Upstream

log = logging.getLogger("llmgw.gateway")

MAX_ANSWER_BYTES = 64 * 1024 * 1024  # a whole (not streamed) answer from an engine


def open_pool() -> Pool:
    """The connection pool to every engine, for one process's requests."""
    return Pool()


class Unreachable(Exception):
    """The replica could not be reached, or hung up before answering: try another.
    `broken`: refused or cut (nothing listens, or the engine died), not merely slow."""

    def __init__(self, message: str, *, broken: bool = True) -> None:
        super().__init__(message)
        self.broken = broken


async def proxy(rt: State, req: Request, up: Upstream, send: Send) -> int:
    native = req.native(up, req.body) if req.native is not None else None
    path, body = native if native is not None else (req.path, _body(req, up))
    if tracing.TRACER is not None:
        return await _traced(rt, req, up, send, path, body)
    return await _proxy(rt, req, up, send, path, body, None)


def _body(req: Request, up: Upstream) -> bytes:
    """The body to send: the caller's bytes, unless its model is renamed, its usage asked
    for on its behalf, or the gateway added to it."""
    if req.body["model"] != up.model or (req.stream and not req.wants_usage) or req.body_changed:
        changed = dict(req.body, model=up.model)
        if req.stream and not req.wants_usage:
            options = changed.get("stream_options")
            changed["stream_options"] = dict(
                options if isinstance(options, dict) else {}, include_usage=True
            )
        return json.dumps(changed).encode()
    return req.raw


async def _traced(rt: State, req: Request, up: Upstream, send: Send, path: str, body) -> int:
    """One attempt inside a span of its own, its W3C traceparent passed on to the engine."""
    attributes = {
        "llmgw.replica": up.replica_id,
        "llmgw.model": up.model,
        "url.full": up.url + path,
    }
    with tracing.span("llmgw.upstream", "CLIENT", **attributes) as span:
        headers: dict[str, str] = {}
        tracing.inject(headers)
        try:
            status = await _proxy(rt, req, up, send, path, body, headers)
        except Unreachable as exc:
            tracing.said(span, **{"error.type": "unreachable", "llmgw.why": str(exc)})
            raise
        tracing.said(span, **{"http.response.status_code": status})
        return status


async def _proxy(
    rt: State, req: Request, up: Upstream, send: Send, path: str, body, headers: dict | None
) -> int:
    rid, model = up.replica_id, up.model
    rt.inflight[rid] = rt.inflight.get(rid, 0) + 1
    BOARD.running[model] = BOARD.running.get(model, 0) + 1
    rt.usage.used.add(rid)
    req.replica = rid
    try:
        try:
            resp = await rt.session.post(up.url, path, up.authorization, body, headers)
        except Cut as exc:
            raise Unreachable(str(exc), broken=not exc.timeout) from None
        except NotHTTP as exc:
            raise _not_http(model, exc) from None
        try:
            kind = resp.content_type
            if req.stream and resp.status == 200 and kind.startswith("text/event-stream"):
                return await relay_stream(rt, req, resp, send)
            return await _whole(req, resp, kind, send)
        finally:
            resp.release()
    except asyncio.CancelledError:
        # The caller hung up, or the server stopped waiting, while the engine worked on it
        # (before its answer was in): no usage will come, so what it may have used is
        # counted (accounting.tokens_used).
        if req.verdict is None:
            req.abandoned = True
        raise
    finally:
        rt.inflight[rid] -= 1
        BOARD.running[model] -= 1


def _not_http(model: str, exc: NotHTTP) -> Refused:
    log.error("a replica of %s answered what is not HTTP: %s", model, exc)
    return Refused(
        502,
        f"The replica serving {model} gave an answer that is not HTTP.",
        "api_error",
        "upstream_invalid",
        reason="upstream",
    )


_DECODER = json.JSONDecoder()


def _usage_in(data: bytes) -> dict | None:
    """The `usage` object of a JSON answer, found from the end without parsing the rest
    (an embeddings answer can be megabytes of numbers)."""
    at = data.rfind(b'"usage"')
    if at < 0:
        return None
    brace = data.find(b"{", at)
    if brace < 0:
        return None
    try:
        value, _ = _DECODER.raw_decode(data[brace:].decode())
    except (ValueError, UnicodeDecodeError):
        return None
    return value if isinstance(value, dict) else None


async def _whole(req: Request, resp: Connection, kind: str, send: Send) -> int:
    chunks, size = [], 0
    try:
        while chunk := await resp.read():
            size += len(chunk)
            if size > MAX_ANSWER_BYTES:
                raise Refused(
                    502,
                    f"The replica serving {req.model} answered more than "
                    f"{MAX_ANSWER_BYTES // (1024 * 1024)} MiB.",
                    "api_error",
                    "upstream_too_large",
                    reason="upstream",
                )
            chunks.append(chunk)
    except Cut as exc:
        # Nothing has reached the caller yet: another replica can still answer.
        raise Unreachable(f"cut before answering in full: {exc}", broken=not exc.timeout) from None
    except NotHTTP as exc:
        raise _not_http(req.model, exc) from None
    data = chunks[0] if len(chunks) == 1 else b"".join(chunks)
    status = resp.status
    if status in (401, 403):
        # The engine refused the gateway's own key: ours to fix, not the caller's.
        log.error("replica of %s refused the engine key (HTTP %d)", req.model, status)
        raise Refused(
            502,
            f"The replica serving {req.model} refused the gateway.",
            "api_error",
            "upstream_refused",
            reason="upstream_status",
        )
    if status == 200:
        usage = _usage_in(data)  # the engine's figures, for the request's span too
        req.usage = chat_usage(usage) if usage is not None else None
        if req.endpoint == "chat":
            data = with_refusal(data)
        if req.answer_model is not None:
            data = model_named(data, req.answer_model, count=1)
    req.verdict = "upstream_status" if status >= 400 else ""
    headers = req.replica_header()
    if status >= 400:
        status, data, more = engine_error(status, data, req.request_id)
        kind = "application/json"
        headers = [*headers, *more]
    content_type = (kind or "application/json").encode("latin-1", "replace")
    await send_answer(send, status, data, [(b"content-type", content_type), *headers])
    return status


# A choice's message object opening, and whether it is empty: a key, as JSON escapes the
# quotes of any such text inside a string.
_MESSAGE = re.compile(rb'"message":\s*\{(\s*\})?')


def with_refusal(data: bytes) -> bytes:
    """A chat answer with `message.refusal` in each choice, null where the engine left it
    out (llama.cpp does): OpenAI's schema requires it. Added to the engine's bytes where
    each message opens, not decoded and encoded again. An answer that has it, or that is
    not a chat completion, passes as it is."""
    if b'"refusal"' in data or b'"choices"' not in data:
        return data
    return _MESSAGE.sub(_refusal_added, data)


def _refusal_added(found: re.Match) -> bytes:
    return b'"message":{"refusal":null}' if found.group(1) else b'"message":{"refusal":null,'


def engine_error(status: int, data: bytes, rid: str) -> tuple[int, bytes, list]:
    """An engine's error as the gateway's own are: an OpenAI-style body whose message keeps
    the engine's words and names the request. A 4xx keeps its status (the request is at
    fault; the client fixes it). A 5xx becomes 502 `upstream_error` with `x-should-retry:
    false`: the engine took the request and failed on it, so the same body is not sent
    again blindly (the openai SDK obeys the header, as it otherwise retries any 5xx)."""
    error = _error_in(data)
    message = error.get("message")
    if not isinstance(message, str) or not message:
        text = data.decode("utf-8", "replace").strip()[:2000]
        message = f"The engine answered HTTP {status}" + (f": {text}" if text else ".")
    shaped = {
        "message": with_request(message, rid) if rid else message,
        "type": error.get("type") if isinstance(error.get("type"), str) else None,
        "param": error.get("param") if isinstance(error.get("param"), str) else None,
        "code": error.get("code") if isinstance(error.get("code"), str | int) else None,
    }
    more = []
    if status >= 500:
        status, more = 502, [(b"x-should-retry", b"false")]
        shaped["type"], shaped["code"] = "api_error", "upstream_error"
    elif shaped["type"] is None:
        shaped["type"] = "invalid_request_error"
    return status, json.dumps({"error": shaped}).encode(), more


def _error_in(data: bytes) -> dict:
    """The `error` object of an engine's JSON error body ({"error": {...}}, or vLLM's and
    llama.cpp's flatter ones with a `message`); empty for anything else."""
    try:
        body = json.loads(data)
    except (ValueError, UnicodeDecodeError):
        return {}
    if not isinstance(body, dict):
        return {}
    error = body.get("error", body)
    if isinstance(error, str):
        return {"message": error}
    return error if isinstance(error, dict) else {}
