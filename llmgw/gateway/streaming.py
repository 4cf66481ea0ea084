"""Passing an engine's server-sent events back as they arrive, with an error event for a
stream cut short (upstream, or by a server that stops); and counting what a request used,
however it was answered: tokens from the engine's `usage` figures, or the events passed on
for a stream that ended before them, in the usage book, the metrics and the token limits."""

from __future__ import annotations

import asyncio
import json
import logging
import re
import time

import aiohttp

from llmgw.gateway import metrics
from llmgw.gateway.answers import Send
from llmgw.gateway.state import Request, State

log = logging.getLogger("llmgw.gateway")

SSE_HEADERS = [
    (b"content-type", b"text/event-stream"),
    (b"cache-control", b"no-cache"),
    (b"x-accel-buffering", b"no"),
]


def record_usage(rt: State, req: Request, usage: dict | None, *, error: bool) -> None:
    """Usage and token counts for one request (`tokens_used`), and what it held of the token
    limits settled; only the first call for a request counts."""
    if req.recorded:
        return
    req.recorded = True
    prompt, completion, cached, estimated = tokens_used(req, usage)
    now = time.time()
    rt.usage.record(
        key_id=req.key.id,
        project_id=req.key.project_id,
        model=req.model,
        prompt=prompt,
        completion=completion,
        estimated=estimated,
        request=req.rid,
        error=error,
        latency_ms=(time.perf_counter() - req.started) * 1000,
        now=now,
    )
    if prompt or completion:
        s = metrics.series(req.model)
        s.prompt.inc(prompt)
        s.completion.inc(completion)
        if cached:
            s.cached(cached)
        if estimated:
            s.estimated(estimated)
    if req.held:
        rt.limiter.settle(req.held, prompt + completion, req.admitted)


def tokens_used(req: Request, usage: dict | None) -> tuple[int, int, int, int]:
    """(prompt, completion, cached, estimated) tokens of a request: from the engine's own
    `usage` figures when they came. Otherwise, for a request an engine worked on: a stream
    counts a completion token per event passed on (each carries about one), and one cut
    before its answer (the caller hung up, the server stopped) what it may have written,
    its reservation; either way its prompt by the estimate. `estimated` says how many of
    them no engine counted. A request no engine worked on, or that one refused, used none.
    """
    if isinstance(usage, dict):
        prompt = _tokens(usage.get("prompt_tokens"))
        completion = _tokens(usage.get("completion_tokens"))
        details = usage.get("prompt_tokens_details")
        cached = 0
        if isinstance(details, dict):  # OpenAI's, vLLM's and llama.cpp's place for it
            cached = min(_tokens(details.get("cached_tokens")), prompt)
        return prompt, completion, cached, 0
    if req.events:
        return req.estimate, req.events, 0, req.estimate
    if req.abandoned:
        written = 0 if req.stream else req.reserved - req.estimate
        return req.estimate, written, 0, req.estimate + written
    return 0, 0, 0, 0


MOST_TOKENS = 100_000_000  # more in one answer is an engine's mistake, not a figure


def _tokens(value: object) -> int:
    """A token count as an engine reported it: a whole number from 0 to MOST_TOKENS, else 0."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        return 0
    return min(value, MOST_TOKENS)


_EVENT_END = re.compile(rb"\r\n\r\n|\n\n|\r\r")


def split_events(data: bytes, drop_usage: bool) -> tuple[bytes, bytes, dict | None]:
    """Complete server-sent events in `data`: the bytes to pass on, the incomplete rest, and
    the engine's usage figures if an event carried them. The usage-only event the gateway
    asked for on the caller's behalf is left out when the caller did not ask for it.
    Events end with a blank line, written with LF, CRLF or CR as the SSE format allows."""
    last = None
    for last in _EVENT_END.finditer(data):  # noqa: B007 - the last one is the one wanted
        pass
    if last is None:
        # No event ends here; a very long one is passed on as it is rather than held.
        return (data, b"", None) if len(data) > 65536 else (b"", data, None)
    whole, rest = data[: last.end()], data[last.end() :]
    if b'"usage"' not in whole:
        return whole, rest, None
    usage = None
    kept = []
    at = 0
    for end in _EVENT_END.finditer(whole):
        event, at = whole[at : end.start()], end.end()
        if b'"usage"' in event and b'"usage":null' not in event and b'"usage": null' not in event:
            payload = event.partition(b"data:")[2].strip()
            try:
                obj = json.loads(payload)
            except ValueError:
                obj = None
            if isinstance(obj, dict) and isinstance(obj.get("usage"), dict):
                usage = obj["usage"]
                if drop_usage and not obj.get("choices"):
                    continue
        kept.append(event + end.group())
    return b"".join(kept), rest, usage


STREAM_CUT = (
    b'data: {"error": {"message": "The replica serving this stream went away mid-way.", '
    b'"type": "server_error", "param": null, "code": "upstream_cut"}}\n\n'
)
SHUTDOWN_CUT = (
    b'data: {"error": {"message": "This llmgw server stopped before the stream ended '
    b'(LLMGW_SHUTDOWN_GRACE_SECONDS ran out); retry it.", "type": "server_error", '
    b'"param": null, "code": "server_shutdown"}}\n\n'
)


async def relay_stream(rt: State, req: Request, resp, send: Send) -> int:
    """Pass the events on as they arrive; a stream cut upstream ends with an error event."""
    headers = [*SSE_HEADERS, *req.replica_header()]
    await send({"type": "http.response.start", "status": 200, "headers": headers})
    series = metrics.series(req.model)
    drop = not req.wants_usage
    rest, usage, first, cut, stopped = b"", None, True, False, False
    try:
        async for chunk in resp.content.iter_any():
            if first:
                series.first_token.observe(time.perf_counter() - req.started)
                first = False
            out, rest, found = split_events(rest + chunk if rest else chunk, drop)
            if found is not None:
                usage = req.usage = found
            if out:
                if b"data: [DONE]" in out:
                    req.done = True
                req.events += out.count(b"data:")
                await send({"type": "http.response.body", "body": out, "more_body": True})
    except (aiohttp.ClientError, TimeoutError) as exc:
        log.warning("stream from a replica of %s cut: %s", req.model, exc)
        cut = True
    except asyncio.CancelledError:
        if not rt.stopping:
            raise
        # The server stopped waiting for it: ended with an error event, its usage written.
        asyncio.current_task().uncancel()
        cut = stopped = True
    if not req.done and not cut:
        log.warning("stream from a replica of %s ended before [DONE]", req.model)
        cut = True
    # Half an event is not passed on: the error must arrive as an event of its own.
    tail = (SHUTDOWN_CUT if stopped else STREAM_CUT) if cut else rest
    await send({"type": "http.response.body", "body": tail, "more_body": False})
    if cut:
        series.failed("stream_cut")
    record_usage(rt, req, usage, error=cut)
    return 200
