"""One typed server-sent event as both the Responses and the Messages APIs write them: an
`event:` line with the event's `type` (Anthropic's SDK skips an event without one) and its
JSON on a `data:` line."""

from __future__ import annotations

import json


def sse(event: dict) -> bytes:
    data = json.dumps(event, ensure_ascii=False, separators=(",", ":"))
    return f"event: {event['type']}\ndata: {data}\n\n".encode()
