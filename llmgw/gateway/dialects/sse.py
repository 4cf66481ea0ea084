"""Server-sent events both ways: `sse` writes one typed event as the Responses and the
Messages APIs send them, and `ChatEvents` reads an engine's chat completion stream, as its
bytes arrive, into the chunks the translators take."""

from __future__ import annotations

import json
import re


def sse(event: dict) -> bytes:
    """An `event:` line with the event's `type` (Anthropic's SDK skips an event without one)
    and its JSON on a `data:` line."""
    data = json.dumps(event, ensure_ascii=False, separators=(",", ":"))
    return f"event: {event['type']}\ndata: {data}\n\n".encode()


# Events end with a blank line, written with LF, CRLF or CR as the SSE format allows.
_EVENT_END = re.compile(rb"\r\n\r\n|\n\n|\r\r")
_LINE_END = re.compile(rb"\r\n|\n|\r")


class ChatEvents:
    """`feed(data)` with each piece of an engine's stream as it comes; it returns the
    chunks (parsed JSON objects) of the events that piece completed, keeping an event's
    start until its end arrives. `[DONE]` sets `done`; comments and data that is not a
    JSON object are skipped, as the clients skip them."""

    def __init__(self) -> None:
        self.rest = b""
        self.done = False

    def feed(self, data: bytes) -> list[dict]:
        data = self.rest + data
        chunks, at = [], 0
        for end in _EVENT_END.finditer(data):
            chunk = self._event(data[at : end.start()])
            at = end.end()
            if chunk is not None:
                chunks.append(chunk)
        self.rest = data[at:]
        return chunks

    def _event(self, event: bytes) -> dict | None:
        lines = [line for line in _LINE_END.split(event) if line.startswith(b"data:")]
        payload = b"\n".join(line[5:].removeprefix(b" ") for line in lines)
        if payload.strip() == b"[DONE]":
            self.done = True
            return None
        try:
            chunk = json.loads(payload)
        except ValueError:
            return None
        return chunk if isinstance(chunk, dict) else None
