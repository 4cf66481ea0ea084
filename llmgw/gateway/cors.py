"""CORS for `/v1/`, for the origins an operator opts in (LLMGW_CORS_ORIGINS): a browser
app's preflight is answered here, before the key is asked for (a preflight carries none),
and every answer to an allowed origin carries the Access-Control headers its page needs
to read it. With no origins set, nothing here adds or answers anything."""

from __future__ import annotations

from llmgw.gateway.answers import Receive, Scope, Send

ALLOW_HEADERS = b"authorization, content-type, x-request-id, x-api-key, anthropic-version"
EXPOSE_HEADERS = b"x-request-id, x-llmgw-replica, retry-after"
MAX_AGE = b"600"


def origin_allowed(scope: Scope, origins: tuple[str, ...]) -> bytes | None:
    """The request's Origin when it is one of `origins` (or they include `*`); else None."""
    if not origins:
        return None
    for name, value in scope["headers"]:
        if name == b"origin":
            if "*" in origins or value.decode("latin-1").rstrip("/") in origins:
                return value
            return None
    return None


def preflight(scope: Scope) -> bool:
    return scope["method"] == "OPTIONS" and any(
        name == b"access-control-request-method" for name, _ in scope["headers"]
    )


async def answer_preflight(send: Send, origin: bytes) -> None:
    headers = [
        *_allowed(origin),
        (b"access-control-allow-methods", b"GET, POST, OPTIONS"),
        (b"access-control-allow-headers", ALLOW_HEADERS),
        (b"access-control-max-age", MAX_AGE),
        (b"content-length", b"0"),
    ]
    await send({"type": "http.response.start", "status": 204, "headers": headers})
    await send({"type": "http.response.body", "body": b""})


def with_cors(send: Send, origin: bytes) -> Send:
    """`send`, with the Access-Control headers added to the answer's start."""
    extra = [*_allowed(origin), (b"access-control-expose-headers", EXPOSE_HEADERS)]

    async def sending(message: dict) -> None:
        if message["type"] == "http.response.start":
            message = dict(message, headers=[*message.get("headers", ()), *extra])
        await send(message)

    return sending


def _allowed(origin: bytes) -> list[tuple[bytes, bytes]]:
    # The origin itself, never `*`: an answer that varies by origin says so to caches.
    return [(b"access-control-allow-origin", origin), (b"vary", b"origin")]


async def cors(origins: tuple[str, ...], scope: Scope, receive: Receive, send: Send, app) -> None:
    """`app` for one `/v1/` request, with CORS for an allowed origin."""
    origin = origin_allowed(scope, origins)
    if origin is None:
        await app(scope, receive, send)
    elif preflight(scope):
        await answer_preflight(send, origin)
    else:
        await app(scope, receive, with_cors(send, origin))
