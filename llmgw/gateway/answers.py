"""What a `/v1/` request is answered with when it is not an engine's answer: the ASGI
types, the JSON headers, the OpenAI-style error (`Refused`) and its sentences, and the 503
of a server that is stopping."""

from __future__ import annotations

import json
import re
import secrets
from collections.abc import Awaitable, Callable

from llmgw.core.ids import GENERATED

Scope = dict
Receive = Callable[[], Awaitable[dict]]
Send = Callable[[dict], Awaitable[None]]

MAX_BODY_BYTES = 8 * 1024 * 1024
JSON_HEADERS = [(b"content-type", b"application/json")]


class Refused(Exception):
    """A request answered with an OpenAI-style error and no upstream call."""

    def __init__(
        self,
        status: int,
        message: str,
        kind: str,
        code: str | None = None,
        *,
        reason: str,
        retry_after: int | None = None,
        param: str | None = None,
    ) -> None:
        super().__init__(message)
        self.status, self.message, self.kind, self.code = status, message, kind, code
        self.reason, self.retry_after, self.param = reason, retry_after, param

    def body(self, rid: str | None = None) -> bytes:
        """The OpenAI-style body; with `rid`, its message names the request, for the caller
        to quote."""
        message = self.message if rid is None else with_request(self.message, rid)
        error = {"message": message, "type": self.kind, "param": self.param, "code": self.code}
        return json.dumps({"error": error}).encode()


def with_request(message: str, rid: str) -> str:
    return f"{message} (request {rid})"


# A caller's own id is kept when it is one a log line and a header can carry as it is.
_SANE_ID = re.compile(r"[A-Za-z0-9._:-]{1,128}")


def request_id(headers) -> str:
    """The request's id, told back in `x-request-id`: the caller's own when it sent a sane
    one, so its logs and ours name the request alike; else a new one."""
    for name, value in headers:
        if name == b"x-request-id":
            given = value.decode("latin-1")
            if _SANE_ID.fullmatch(given):
                return given
            break
    return f"{GENERATED}{secrets.token_hex(12)}"


def with_id(send: Send, rid: str) -> Send:
    """`send`, with `x-request-id` added to the answer's start, whoever sends it."""
    header = (b"x-request-id", rid.encode())

    async def sending(message: dict) -> None:
        if message["type"] == "http.response.start":
            message = dict(message, headers=[*message.get("headers", ()), header])
        await send(message)

    return sending


class ClientGone(Exception):
    """The caller hung up."""


def no_key() -> Refused:
    return Refused(
        401,
        "You didn't provide an API key. Send it as 'Authorization: Bearer YOUR_KEY'.",
        "invalid_request_error",
        "invalid_api_key",
        reason="auth",
    )


def unknown_model(name: str) -> Refused:
    # A model the key may not use is as unknown to it as one that does not exist.
    return Refused(
        404,
        f"The model `{name}` does not exist or you do not have access to it.",
        "invalid_request_error",
        "model_not_found",
        reason="unknown_model",
    )


def bad_key() -> Refused:
    # The same answer for a wrong, unknown or revoked key: nothing says which keys exist.
    return Refused(
        401,
        "Incorrect API key provided.",
        "invalid_request_error",
        "invalid_api_key",
        reason="auth",
    )


def bad_request(message: str, code: str | None = None, param: str | None = None) -> Refused:
    return Refused(400, message, "invalid_request_error", code, reason="bad_request", param=param)


def unplaceable(message: str) -> Refused:
    """A model nothing is bringing up (no replica starting; the reconciler says why, or none
    is asked for): 503 `model_unplaceable` with no Retry-After and `x-should-retry: false`
    (requests.py), since waiting will not bring it: a client that retries blindly would
    only stall. A model that is loading answers `model_not_ready` or `model_loading`, with
    the Retry-After its wait needs."""
    return Refused(503, message, "server_error", "model_unplaceable", reason="no_replica")


def too_large() -> Refused:
    return Refused(
        413,
        f"The request body is larger than {MAX_BODY_BYTES // (1024 * 1024)} MiB.",
        "invalid_request_error",
        "request_too_large",
        reason="bad_request",
    )


async def send_answer(send: Send, status: int, body: bytes, headers=JSON_HEADERS) -> None:
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


SHUTTING_DOWN = Refused(
    503,
    "This llmgw server is stopping; retry the request (another server takes it).",
    "server_error",
    "server_shutdown",
    reason="shutdown",
    retry_after=1,
)
# Its headers: retry at once, on another connection (so, behind a balancer, another server).
SHUTTING_DOWN_HEADERS = [
    *JSON_HEADERS,
    (b"retry-after", str(SHUTTING_DOWN.retry_after).encode()),
    (b"connection", b"close"),
]
