"""Passing an engine's server-sent events back as they arrive, with an error event for a
stream cut short (upstream, or by a server that stops), noting on the request what the
accounting reads once it is answered (`accounting.account`): the engine's `usage` figures,
the events passed on, and the stream's verdict."""

from __future__ import annotations

import asyncio
import json
import logging
import re
import time

from llmgw.gateway import metrics
from llmgw.gateway.answers import Send
from llmgw.gateway.client import Connection, Cut, NotHTTP
from llmgw.gateway.dialects.responses import chat_usage
from llmgw.gateway.state import Request, State

log = logging.getLogger("llmgw.gateway")

SSE_HEADERS = [
    (b"content-type", b"text/event-stream"),
    (b"cache-control", b"no-cache"),
    (b"x-accel-buffering", b"no"),
]


_EVENT_END = re.compile(rb"\r\n\r\n|\n\n|\r\r")
# The event that ends a stream: chat's [DONE], or the Responses API's last (from an engine
# that serves it itself: vLLM sends no [DONE] after it).
_ENDED = re.compile(rb'data: \[DONE\]|"type":\s*"response\.(?:completed|incomplete|failed)"')


# How a chunk usually ends: at the end of an event (LF, CRLF or CR line ends).
_WHOLE = (b"\n\n", b"\r\n\r\n", b"\r\r")
# A usage object, not the `"usage": null` each chunk carries once usage is asked for. JSON
# escapes a quote inside a string, so text that mentions usage does not match.
_USAGE = re.compile(rb'"usage":\s*\{')


# An answer's `model` member: a key, as JSON escapes the quotes of any such text inside a
# string (an answer's content cannot hold it).
_MODEL = re.compile(rb'"model":\s*"(?:[^"\\]|\\.)*"')


def model_named(data: bytes, name: str, count: int = 0) -> bytes:
    """`data` (an answer, or whole server-sent events) with its `model` member(s) naming
    `name`: the first `count`, or every one at 0."""
    return _MODEL.sub(b'"model":' + json.dumps(name).encode(), data, count=count)


def split_events(data: bytes, drop_usage: bool) -> tuple[bytes, bytes, dict | None]:
    """Complete server-sent events in `data`: the bytes to pass on, the incomplete rest, and
    the engine's usage figures if an event carried them. The usage-only event the gateway
    asked for on the caller's behalf is left out when the caller did not ask for it.
    Events end with a blank line, written with LF, CRLF or CR as the SSE format allows.
    The bytes pass on as they came: only a chunk holding a usage object (a stream's last
    events) is cut into its events, and the event that carries it decoded."""
    if data.endswith(_WHOLE):
        whole, rest = data, b""
    else:
        last = None
        for last in _EVENT_END.finditer(data):  # noqa: B007 - the last one is the one wanted
            pass
        if last is None:
            # No event ends here; a very long one is passed on as it is rather than held.
            return (data, b"", None) if len(data) > 65536 else (b"", data, None)
        whole, rest = data[: last.end()], data[last.end() :]
    if b'"usage"' not in whole or _USAGE.search(whole) is None:
        return whole, rest, None
    out, usage = _usage_events(whole, drop_usage)
    return out, rest, usage


def _usage_events(whole: bytes, drop_usage: bool) -> tuple[bytes, dict | None]:
    """Whole events, one of which carries a usage object: the events to pass on, and the
    usage figures (chat's, or a Responses API event's turned into chat's)."""
    usage = None
    kept = []
    at = 0
    for end in _EVENT_END.finditer(whole):
        event, at = whole[at : end.start()], end.end()
        if _USAGE.search(event) is not None:
            payload = event.partition(b"data:")[2].strip()
            try:
                obj = json.loads(payload)
            except ValueError:
                obj = None
            if isinstance(obj, dict) and isinstance(obj.get("usage"), dict):
                usage = obj["usage"]
                if drop_usage and not obj.get("choices"):
                    continue
            elif isinstance(obj, dict) and (found := _response_usage(obj)) is not None:
                usage = chat_usage(found)
        kept.append(event + end.group())
    return b"".join(kept), usage


def _response_usage(event: dict) -> dict | None:
    """The usage a Responses API event carries in its Response (`response.completed`)."""
    response = event.get("response")
    usage = response.get("usage") if isinstance(response, dict) else None
    return usage if isinstance(usage, dict) else None


def _ends(out: bytes) -> bool:
    """Whether `out` holds the event that ends a stream; plain words looked for first, as
    no chat chunk but the last holds them."""
    return (b"[DONE]" in out or b'"response.' in out) and _ENDED.search(out) is not None


STREAM_CUT = (
    b'data: {"error": {"message": "The replica serving this stream went away mid-way.", '
    b'"type": "server_error", "param": null, "code": "upstream_cut"}}\n\n'
)
SHUTDOWN_CUT = (
    b'data: {"error": {"message": "This llmgw server stopped before the stream ended '
    b'(LLMGW_SHUTDOWN_GRACE_SECONDS ran out); retry it.", "type": "server_error", '
    b'"param": null, "code": "server_shutdown"}}\n\n'
)


async def relay_stream(rt: State, req: Request, resp: Connection, send: Send) -> int:
    """Pass the events on as they arrive; a stream cut upstream ends with an error event."""
    headers = [*SSE_HEADERS, *req.replica_header()]
    await send({"type": "http.response.start", "status": 200, "headers": headers})
    drop = not req.wants_usage
    rest, first, cut, stopped = b"", True, False, False
    try:
        while chunk := await resp.read():
            if first:
                metrics.series(req.model).first_token.observe(time.perf_counter() - req.started)
                first = False
            out, rest, found = split_events(rest + chunk if rest else chunk, drop)
            if found is not None:
                req.usage = found
            if out:
                if req.answer_model is not None:
                    out = model_named(out, req.answer_model)
                if not req.done and _ends(out):
                    req.done = True
                req.events += out.count(b"data:")
                await send({"type": "http.response.body", "body": out, "more_body": True})
    except (Cut, NotHTTP) as exc:
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
    req.verdict = "stream_cut" if cut else ""
    return 200
