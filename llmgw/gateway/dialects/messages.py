"""Anthropic's Messages API (`POST /v1/messages`) over chat completions:
`messages_request` turns its body into a chat completions body, `message_body` turns the
engine's chat completion into a Message, `MessagesStream` turns the engine's chunks into the
Messages API's events, and `anthropic_error` gives an OpenAI-shaped error Anthropic's shape.

Hints a chat engine has no use for are accepted and left out, so the clients that send them
(coding agents) work: `cache_control` (engines cache prefixes themselves), `thinking` and
`output_config.effort` (the answer comes without thinking blocks, which the API allows),
`service_tier`. What would change the answer and cannot be honoured is refused by name."""

from __future__ import annotations

import json

from llmgw.gateway.dialects import fields as f
from llmgw.gateway.dialects.chat import (
    ChunkReader,
    Counted,
    Failed,
    Finish,
    Text,
    ToolArgs,
    ToolStart,
    Usage,
    answer_read,
)

KNOWN = frozenset(
    {
        "model", "messages", "max_tokens", "system", "stop_sequences", "temperature",
        "top_p", "top_k", "tools", "tool_choice", "stream", "metadata", "thinking",
        "service_tier", "output_config", "cache_control",
    }
)  # fmt: skip
HINT = "cache_control"  # allowed on every block and tool, and left out


def messages_request(body: dict) -> dict:
    """The chat completions body for a Messages API body; a 400 naming the field for one
    the translation cannot honour."""
    f.only_known(body, KNOWN)
    if body.get("max_tokens") is None:
        raise f.refuse(
            "max_tokens",
            "is required: how many tokens to write at most.",
            "missing_required_parameter",
        )
    messages = _system(body.get("system"))
    for i, message in enumerate(f.array(body.get("messages"), "messages", empty=False)):
        messages += _message(f.obj(message, f"messages[{i}]"), f"messages[{i}]")
    chat: dict = {
        "model": f.text(body.get("model"), "model"),
        "messages": messages,
        "max_tokens": f.whole(body["max_tokens"], "max_tokens", least=1),
    }
    f.sampling(body, chat, temperature_max=1.0)
    if body.get("top_k") is not None:
        chat["top_k"] = f.whole(body["top_k"], "top_k")  # vLLM's and llama.cpp's extension
    if body.get("stop_sequences") is not None:
        stops = f.array(body["stop_sequences"], "stop_sequences")
        chat["stop"] = [f.text(s, f"stop_sequences[{i}]") for i, s in enumerate(stops)]
    if body.get("tools") is not None:
        chat["tools"] = [_tool(t, i) for i, t in enumerate(f.array(body["tools"], "tools"))]
    if body.get("tool_choice") is not None:
        chat.update(_tool_choice(f.obj(body["tool_choice"], "tool_choice")))
    _hints(body, chat)
    if f.stream(body):
        chat["stream"] = True
        chat["stream_options"] = {"include_usage": True}  # message_delta carries usage
    return chat


def _hints(body: dict, chat: dict) -> None:
    """metadata.user_id becomes chat's `user`; the rest is checked and left out."""
    if body.get("metadata") is not None:
        metadata = f.obj(body["metadata"], "metadata")
        f.only_known(metadata, frozenset({"user_id"}), "metadata.")
        if metadata.get("user_id") is not None:
            chat["user"] = f.text(metadata["user_id"], "metadata.user_id")
    if body.get("thinking") is not None:
        thinking = f.obj(body["thinking"], "thinking")
        f.one_of(thinking.get("type"), "thinking.type", ("enabled", "disabled", "adaptive"))
    if body.get("service_tier") is not None:
        f.one_of(body["service_tier"], "service_tier", ("auto", "standard_only"))
    if body.get("output_config") is not None:
        config = f.obj(body["output_config"], "output_config")
        f.only_known(config, frozenset({"effort", "format"}), "output_config.")
        if config.get("format") is not None:
            fmt = f.obj(config["format"], "output_config.format")
            f.one_of(fmt.get("type"), "output_config.format.type", ("json_schema",))
            schema = f.obj(fmt.get("schema"), "output_config.format.schema")
            chat["response_format"] = {
                "type": "json_schema",
                "json_schema": {"name": "output", "schema": schema},
            }


def _system(value: object) -> list[dict]:
    if value is None:
        return []
    if isinstance(value, str):
        return [{"role": "system", "content": value}] if value else []
    blocks = f.array(value, "system")
    texts = [_text_block(f.obj(b, f"system[{i}]"), f"system[{i}]") for i, b in enumerate(blocks)]
    return [{"role": "system", "content": "\n".join(texts)}] if texts else []


def _text_block(block: dict, where: str) -> str:
    if block.get("type") != "text":
        raise f.refuse(f"{where}.type", "must be 'text' here.", "unsupported_value")
    f.only_known(block, frozenset({"type", "text", "citations", HINT}), f"{where}.")
    return f.text(block.get("text"), f"{where}.text")


def _message(message: dict, where: str) -> list[dict]:
    """One Messages API message as chat messages: a user's tool results come first, as tool
    messages, then what else it says; an assistant's text and tool uses are one message."""
    f.only_known(message, frozenset({"role", "content"}), f"{where}.")
    role = f.one_of(message.get("role"), f"{where}.role", ("user", "assistant"))
    content = message.get("content")
    if isinstance(content, str):
        return [{"role": role, "content": content}]
    blocks = [
        f.obj(b, f"{where}.content[{j}]")
        for j, b in enumerate(f.array(content, f"{where}.content"))
    ]
    if role == "assistant":
        return [_assistant(blocks, where)]
    tools, parts = [], []
    for j, block in enumerate(blocks):
        at = f"{where}.content[{j}]"
        if block.get("type") == "tool_result":
            tools.append(_tool_result(block, at))
        else:
            parts.append(_user_part(block, at))
    out = tools
    if parts and all(p["type"] == "text" for p in parts):
        out.append({"role": "user", "content": "\n".join(p["text"] for p in parts)})
    elif parts:
        out.append({"role": "user", "content": parts})
    return out


def _assistant(blocks: list[dict], where: str) -> dict:
    texts, calls = [], []
    for j, block in enumerate(blocks):
        at, kind = f"{where}.content[{j}]", block.get("type")
        if kind == "text":
            texts.append(_text_block(block, at))
        elif kind == "tool_use":
            f.only_known(block, frozenset({"type", "id", "name", "input", HINT}), f"{at}.")
            arguments = json.dumps(f.obj(block.get("input"), f"{at}.input"), ensure_ascii=False)
            calls.append(
                {
                    "id": f.text(block.get("id"), f"{at}.id"),
                    "type": "function",
                    "function": {
                        "name": f.text(block.get("name"), f"{at}.name"),
                        "arguments": arguments,
                    },
                }
            )
        elif kind not in ("thinking", "redacted_thinking"):  # replayed thinking: no place in chat
            raise f.refuse(
                f"{at}.type",
                f"blocks of type {kind!r} are not supported in an assistant message; use text or tool_use.",
                "unsupported_value",
            )
    # No content is null beside tool calls; alone, an empty string (some templates want one).
    message: dict = {"role": "assistant", "content": "".join(texts) or (None if calls else "")}
    if calls:
        message["tool_calls"] = calls
    return message


def _user_part(block: dict, where: str) -> dict:
    kind = block.get("type")
    if kind == "text":
        return {"type": "text", "text": _text_block(block, where)}
    if kind == "image":
        f.only_known(block, frozenset({"type", "source", HINT}), f"{where}.")
        return {
            "type": "image_url",
            "image_url": {
                "url": _image_url(f.obj(block.get("source"), f"{where}.source"), f"{where}.source")
            },
        }
    raise f.refuse(
        f"{where}.type",
        f"blocks of type {kind!r} are not supported; use text, image or tool_result.",
        "unsupported_value",
    )


def _image_url(source: dict, where: str) -> str:
    """An image as chat completions take it: by URL, or base64 as a data: URL."""
    kind = f.one_of(source.get("type"), f"{where}.type", ("base64", "url"))
    if kind == "url":
        return f.text(source.get("url"), f"{where}.url")
    media = f.one_of(
        source.get("media_type"),
        f"{where}.media_type",
        ("image/jpeg", "image/png", "image/gif", "image/webp"),
    )
    return f"data:{media};base64,{f.text(source.get('data'), f'{where}.data')}"


def _tool_result(block: dict, where: str) -> dict:
    f.only_known(
        block, frozenset({"type", "tool_use_id", "content", "is_error", HINT}), f"{where}."
    )
    content = block.get("content", "")
    if not isinstance(content, str):
        items = f.array(content, f"{where}.content")
        content = "\n".join(
            _text_block(f.obj(b, f"{where}.content[{k}]"), f"{where}.content[{k}]")
            for k, b in enumerate(items)
        )
    if block.get("is_error") is not None and f.flag(block["is_error"], f"{where}.is_error"):
        content = f"Error: {content}"  # chat has no flag for it: the model reads it instead
    return {
        "role": "tool",
        "tool_call_id": f.text(block.get("tool_use_id"), f"{where}.tool_use_id"),
        "content": content,
    }


def _tool(tool: object, i: int) -> dict:
    where = f"tools[{i}]"
    tool = f.obj(tool, where)
    if tool.get("type") not in (None, "custom"):
        raise f.refuse(
            f"{where}.type",
            f"server tools ({tool.get('type')!r}) are not supported: the engine runs no tools; define a custom tool.",
            "unsupported_value",
        )
    f.only_known(
        tool,
        frozenset({"type", "name", "description", "input_schema", "strict", HINT}),
        f"{where}.",
    )
    function = {
        "name": f.text(tool.get("name"), f"{where}.name"),
        "parameters": f.obj(tool.get("input_schema"), f"{where}.input_schema"),
    }
    if tool.get("description") is not None:
        function["description"] = f.text(tool["description"], f"{where}.description")
    if tool.get("strict") is not None:
        function["strict"] = f.flag(tool["strict"], f"{where}.strict")
    return {"type": "function", "function": function}


def _tool_choice(choice: dict) -> dict:
    kind = f.one_of(choice.get("type"), "tool_choice.type", ("auto", "any", "tool", "none"))
    f.only_known(choice, frozenset({"type", "name", "disable_parallel_tool_use"}), "tool_choice.")
    out: dict = {"tool_choice": {"auto": "auto", "any": "required", "none": "none"}.get(kind)}
    if kind == "tool":
        out["tool_choice"] = {
            "type": "function",
            "function": {"name": f.text(choice.get("name"), "tool_choice.name")},
        }
    if choice.get("disable_parallel_tool_use") is not None:
        out["parallel_tool_calls"] = not f.flag(
            choice["disable_parallel_tool_use"], "tool_choice.disable_parallel_tool_use"
        )
    return out


def message_body(request: dict, completion: dict, *, rid: str) -> dict:
    """The Message for an engine's chat completion of `request` (a body `messages_request`
    accepted); `rid` makes its id."""
    answer = answer_read(completion, rid)
    blocks: list[dict] = []
    text = answer.refusal if answer.refusal is not None else answer.text
    if text:
        blocks.append({"type": "text", "text": text})
    for call in answer.tool_calls:
        blocks.append(
            {
                "type": "tool_use",
                "id": call.id,
                "name": call.name,
                "input": tool_input(call.arguments),
            }
        )
    reason, sequence = stop_reason(answer.finish, answer.stopped_by, request)
    return {
        **message_object(request, rid),
        "content": blocks,
        "stop_reason": reason,
        "stop_sequence": sequence,
        "usage": usage_object(answer.usage),
    }


def message_object(request: dict, rid: str) -> dict:
    return {"id": f"msg_{rid}", "type": "message", "role": "assistant", "model": request["model"]}


def tool_input(arguments: str) -> dict:
    """A tool call's arguments as the object `input` must be. Arguments that are not a JSON
    object (an engine's slip) are kept whole under "arguments": the client sees what the
    model wrote rather than an empty call."""
    if not arguments.strip():
        return {}
    try:
        value = json.loads(arguments)
    except ValueError:
        value = None
    return value if isinstance(value, dict) else {"arguments": arguments}


# chat's finish_reason to the Messages API's stop_reason; "stop" is end_turn unless a stop
# sequence ended it.
STOP_REASONS = {
    "length": "max_tokens",
    "tool_calls": "tool_use",
    "function_call": "tool_use",
    "content_filter": "refusal",
}


def stop_reason(
    finish: str | None, stopped_by: str | None, request: dict
) -> tuple[str, str | None]:
    """(stop_reason, stop_sequence) for chat's finish_reason and the stop string that ended
    the answer, where the engine names it."""
    if finish in STOP_REASONS:
        return STOP_REASONS[finish], None
    if stopped_by is not None and stopped_by in (request.get("stop_sequences") or ()):
        return "stop_sequence", stopped_by
    return "end_turn", None


def usage_object(usage: Usage) -> dict:
    """Anthropic counts cache reads apart from input_tokens; chat counts them in it."""
    return {
        "input_tokens": usage.prompt - usage.cached,
        "output_tokens": usage.completion,
        "cache_read_input_tokens": usage.cached,
        "cache_creation_input_tokens": 0,
    }


class MessagesStream:
    """The Messages API's events for a streamed chat completion: `start()` first,
    `feed(chunk)` for each chunk as it arrives, `close()` when the engine's stream ends;
    each returns the events to send. Text and each tool call are content blocks, one after
    another (the API has no interleaved blocks: a tool call's arguments are passed on while
    it is the open block). The stop reason and the usage, which come in the engine's last
    chunks, go in message_delta."""

    def __init__(self, request: dict, *, rid: str) -> None:
        self.request, self.rid = request, rid
        self.reader = ChunkReader(rid)
        self.blocks = 0  # content blocks started
        self.open: str | int | None = None  # "text", a tool call's index, or None
        self.finish: tuple[str | None, str | None] = (None, None)
        self.usage = Usage()
        self.ended = False

    def start(self) -> list[dict]:
        message = {
            **message_object(self.request, self.rid),
            "content": [],
            "stop_reason": None,
            "stop_sequence": None,
            "usage": {"input_tokens": 0, "output_tokens": 0},
        }
        return [{"type": "message_start", "message": message}]

    def feed(self, chunk: dict) -> list[dict]:
        if self.ended:
            return []
        events: list[dict] = []
        for step in self.reader.read(chunk):
            match step:
                case Text(text) if self.finish[0] is None:
                    if self.open != "text":
                        events += self._begin("text", {"type": "text", "text": ""})
                    events.append(self._delta({"type": "text_delta", "text": text}))
                case ToolStart(index, call_id, name) if self.finish[0] is None:
                    events += self._begin(
                        index, {"type": "tool_use", "id": call_id, "name": name, "input": {}}
                    )
                case ToolArgs(index, fragment) if index == self.open:
                    events.append(
                        self._delta({"type": "input_json_delta", "partial_json": fragment})
                    )
                case Finish(reason, stopped_by):
                    events += self._end()
                    self.finish = (reason, stopped_by)
                case Counted(usage):
                    self.usage = usage
                case Failed(message, _):
                    self.ended = True
                    return events + [error_event(500, message)]
        return events

    def close(self) -> list[dict]:
        if self.ended:
            return []
        self.ended = True
        reason, sequence = stop_reason(*self.finish, self.request)
        return [
            *self._end(),
            {
                "type": "message_delta",
                "delta": {"stop_reason": reason, "stop_sequence": sequence},
                "usage": usage_object(self.usage),
            },
            {"type": "message_stop"},
        ]

    def _begin(self, key: str | int, block: dict) -> list[dict]:
        events = self._end()
        self.open = key
        self.blocks += 1
        return events + [
            {"type": "content_block_start", "index": self.blocks - 1, "content_block": block}
        ]

    def _delta(self, delta: dict) -> dict:
        return {"type": "content_block_delta", "index": self.blocks - 1, "delta": delta}

    def _end(self) -> list[dict]:
        if self.open is None:
            return []
        self.open = None
        return [{"type": "content_block_stop", "index": self.blocks - 1}]


# An HTTP status's error type in Anthropic's shape (the SDK's own list of them); a 413 is
# an invalid request there too.
ERROR_TYPES = {
    401: "authentication_error",
    402: "billing_error",
    403: "permission_error",
    404: "not_found_error",
    429: "rate_limit_error",
    500: "api_error",
    503: "overloaded_error",
    504: "timeout_error",
    529: "overloaded_error",
}


def error_event(status: int, message: str) -> dict:
    kind = ERROR_TYPES.get(status) or ("api_error" if status >= 500 else "invalid_request_error")
    return {"type": "error", "error": {"type": kind, "message": message}}


def anthropic_error(status: int, body: bytes | dict, rid: str | None = None) -> dict:
    """An OpenAI-shaped error (`{"error": {"message", ...}}`, as `Refused.body()` and the
    engines write it) in Anthropic's shape, its status kept (the SDKs retry by status);
    a body that is not one keeps its text as the message."""
    if isinstance(body, bytes | bytearray):
        text = body.decode("utf-8", "replace")
        try:
            body = json.loads(text)
        except ValueError:
            body = {"error": {"message": text.strip()}}
    error = body.get("error") if isinstance(body, dict) else None
    message = error.get("message") if isinstance(error, dict) else None
    if not isinstance(message, str) or not message:
        message = f"The request failed with HTTP status {status}."
    answer = error_event(status, message)
    if rid is not None:
        answer["request_id"] = rid
    return answer
