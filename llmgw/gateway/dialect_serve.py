"""`POST /v1/responses` and `POST /v1/messages` served through chat's own steps. A request
in either API is a chat completion on its way through the gateway: its body is translated
on the way in (`Dialect.translated`), so the key, the limits, the routing, the accounting
and the tracing see a chat request and treat it as one; its answer is translated on the
way out (`Dialect.send`, which stands in for the ASGI `send`), whole or streamed, the
gateway's own errors included (in Anthropic's shape for `/v1/messages`).

A streamed request asks the engine for its usage (`stream_options.include_usage`), so
the usage reaches the accounting exactly as a chat stream's does (`streaming`), and the
closing event (`response.completed`, `message_delta`) carries it to the caller.

An engine that serves the caller's API itself (vLLM serves the Responses API) is sent the
caller's own body instead, its model renamed (`native_body`), and its answer passes back
as it is: the gateway's steps still saw the chat request it translates to, so the limits
and the caps held it alike, and the usage is read from the Response (`chat_usage`). What
only such an engine honours (`reasoning`, `truncation: "auto"`, `top_logprobs`…) reaches it
as sent, and is refused with a 400 naming the field and the engine when the replica chosen
would be sent the chat completion instead (`responses.not_translatable`)."""

from __future__ import annotations

import json
import time
import uuid

from llmgw.core.ids import answer_tail
from llmgw.gateway.answers import Refused, Send
from llmgw.gateway.dialects.messages import (
    MessagesStream,
    anthropic_error,
    message_body,
    messages_request,
)
from llmgw.gateway.dialects.responses import (
    SERVE_RESPONSES,
    ResponsesStream,
    not_translatable,
    response_body,
    responses_request,
)
from llmgw.gateway.dialects.sse import ChatEvents, sse
from llmgw.gateway.tables import Upstream

CHAT_PATH = "/v1/chat/completions"
PATHS = ("/v1/responses", "/v1/messages")
JSON = b"application/json"


def dialect_for(path: str, send: Send, request_id: str | None = None) -> Dialect | None:
    """The translation for a request to `path`, its answer's ids made from `request_id`;
    None for an API the engines speak."""
    return Dialect(path == "/v1/messages", send, request_id) if path in PATHS else None


class Dialect:
    """One request in the Responses (`anthropic` false) or the Messages API: `translated`
    turns its body into chat's, `send` turns chat's answer into this API's."""

    def __init__(self, anthropic: bool, send: Send, request_id: str | None = None) -> None:
        self.anthropic, self.downstream = anthropic, send
        # The ids of the answer's objects (resp_…, msg_…): the request's, so the id a client
        # keeps finds the request (llmgw/core/ids.py); a new one where none was given.
        self.rid = answer_tail(request_id) if request_id else uuid.uuid4().hex[:24]
        self.now = time.time()
        self.request: dict | None = None  # the caller's body, once translated
        self.start: dict | None = None  # the answer's start, held until its body is known
        self.held: list[bytes] = []
        self.reader: ChatEvents | None = None
        self.stream: ResponsesStream | MessagesStream | None = None
        self.native = False  # the engine answering serves this API: its answer passes as is

    def translated(self, body: dict) -> dict:
        """Chat's body for the caller's (a 400 naming the field it cannot honour)."""
        chat = messages_request(body) if self.anthropic else responses_request(body)
        self.request = body
        return chat

    def native_body(self, up: Upstream, chat: dict) -> tuple[str, bytes] | None:
        """The path and body to send `up` when its engine serves this API itself: the
        caller's body, its model renamed as chat's is and with the cap on its output the
        gateway set on `chat` (the translated body, as admitted); None for an engine it is
        translated for. The answer then passes as it is. A 400 for a body that asks what
        only such an engine gives (`not_translatable`), before anything is sent."""
        self.native = not self.anthropic and up.engine in SERVE_RESPONSES and bool(self.request)
        if not self.native:
            if not self.anthropic and self.request:
                refused = not_translatable(self.request, up.engine)
                if refused is not None:
                    raise refused
            return None
        # vLLM names its Response by `request_id` (one of its extra fields): ours.
        body = dict(self.request, model=up.model, request_id=f"resp_{self.rid}")
        if body.get("max_output_tokens") is None and chat.get("max_tokens") is not None:
            body["max_output_tokens"] = chat["max_tokens"]
        return "/v1/responses", json.dumps(body).encode()

    async def send(self, message: dict) -> None:
        if self.native:
            await self.downstream(message)
        elif message["type"] == "http.response.start":
            await self._started(message)
        elif message["type"] == "http.response.body":
            if self.stream is not None:
                await self._streamed(message)
            else:
                await self._whole(message)
        else:
            await self.downstream(message)

    async def _started(self, message: dict) -> None:
        if self.stream is not None:  # a second start, after a stream began: as it would go
            await self.downstream(message)
            return
        kind = dict(message.get("headers", ())).get(b"content-type", b"")
        if message["status"] == 200 and kind.startswith(b"text/event-stream") and self.request:
            self.reader = ChatEvents()
            if self.anthropic:
                self.stream = MessagesStream(self.request, rid=self.rid)
            else:
                self.stream = ResponsesStream(self.request, rid=self.rid, now=self.now)
            await self.downstream(message)
            await self._events(self.stream.start(), more=True)
        else:
            self.start = message  # a whole answer is translated once it is all here

    async def _streamed(self, message: dict) -> None:
        events = []
        for chunk in self.reader.feed(message.get("body", b"")):
            events += self.stream.feed(chunk)
        more = message.get("more_body", False)
        if not more:
            events += self.stream.close()
        await self._events(events, more=more)

    async def _events(self, events: list[dict], *, more: bool) -> None:
        if events or not more:
            body = b"".join(sse(event) for event in events)
            await self.downstream({"type": "http.response.body", "body": body, "more_body": more})

    async def _whole(self, message: dict) -> None:
        self.held.append(message.get("body", b""))
        if message.get("more_body", False):
            return
        status, body = self._answer(self.start["status"], b"".join(self.held))
        headers = [
            (name, value)
            for name, value in self.start.get("headers", ())
            if name not in (b"content-type", b"content-length")
        ]
        await self.downstream(
            {
                "type": "http.response.start",
                "status": status,
                "headers": [(b"content-type", JSON), *headers],
            }
        )
        await self.downstream({"type": "http.response.body", "body": body})

    def _answer(self, status: int, data: bytes) -> tuple[int, bytes]:
        """The status and body of a whole answer in this API: an engine's completion
        translated, an error in this API's shape (OpenAI's is the Responses API's)."""
        if status == 200 and self.request is not None:
            try:
                completion = json.loads(data)
            except ValueError:
                completion = None
            if isinstance(completion, dict):
                if self.anthropic:
                    answer = message_body(self.request, completion, rid=self.rid)
                else:
                    answer = response_body(self.request, completion, rid=self.rid, now=self.now)
                return 200, json.dumps(answer).encode()
            status = 502
            data = Refused(
                502,
                "The replica's answer was not a JSON object.",
                "api_error",
                "upstream_invalid",
                reason="upstream",
            ).body()
        if self.anthropic:
            return status, json.dumps(anthropic_error(status, data)).encode()
        return status, data
