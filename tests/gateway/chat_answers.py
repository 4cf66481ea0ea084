"""Chat completions as an engine writes them, whole and streamed, for the translation tests
(tests/gateway/test_responses_api.py, test_messages_api.py)."""

from __future__ import annotations


def completion(
    text: str | None = "Hello there.",
    *,
    calls: tuple[tuple[str, str, str], ...] = (),
    finish: str = "stop",
    usage: tuple[int, int] = (12, 5),
    cached: int = 0,
    **choice,
) -> dict:
    """A chat completion; `calls` are (id, name, arguments)."""
    message: dict = {"role": "assistant", "content": text, "refusal": None}
    if calls:
        message["tool_calls"] = [
            {"id": c, "type": "function", "function": {"name": n, "arguments": a}}
            for c, n, a in calls
        ]
    prompt, written = usage
    return {
        "id": "chatcmpl-1",
        "object": "chat.completion",
        "created": 1,
        "model": "smol",
        "choices": [{"index": 0, "message": message, "finish_reason": finish, **choice}],
        "usage": {
            "prompt_tokens": prompt,
            "completion_tokens": written,
            "total_tokens": prompt + written,
            "prompt_tokens_details": {"cached_tokens": cached},
        },
    }


def _chunk(delta: dict, finish: str | None = None) -> dict:
    return {
        "id": "chatcmpl-1",
        "object": "chat.completion.chunk",
        "created": 1,
        "model": "smol",
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
    }


def chunks(
    pieces: list[str] = ("Hel", "lo ", "there."),
    *,
    calls: tuple[tuple[str, str, list[str]], ...] = (),
    finish: str = "stop",
    usage: tuple[int, int] | None = (12, 5),
) -> list[dict]:
    """The chunks of a streamed answer: the text in `pieces`, then each call, (id, name,
    argument pieces), one after another, then the finish and the usage-only chunk."""
    out = [_chunk({"role": "assistant", "content": ""})]
    out += [_chunk({"content": p}) for p in pieces]
    for index, (call_id, name, parts) in enumerate(calls):
        first = {"index": index, "id": call_id, "type": "function"}
        out.append(_chunk({"tool_calls": [{**first, "function": {"name": name, "arguments": ""}}]}))
        out += [
            _chunk({"tool_calls": [{"index": index, "function": {"arguments": p}}]}) for p in parts
        ]
    out.append(_chunk({}, finish))
    if usage is not None:
        prompt, written = usage
        counts = {"prompt_tokens": prompt, "completion_tokens": written}
        out.append({**_chunk({}), "choices": [], "usage": counts})
    return out
