"""OpenAI's Responses API (`POST /v1/responses`), stateless, over chat completions:
`responses_request` turns its body into a chat completions body, `response_body` turns the
engine's chat completion into a Response object, and `ResponsesStream` turns the engine's
chunks into the Responses API's typed events.

Stateless: a body that asks the gateway to keep or recall a response (`store: true`,
`previous_response_id`, `conversation`, `background`, `prompt`) is refused with a sentence
that says so; the client sends the whole conversation in `input` instead.

Some fields have no place in a chat completion but an engine that serves the Responses API
itself (vLLM) honours them (ENGINE_ONLY): their shape is checked here, and the request
goes on; `not_translatable` refuses it, naming the field and the engine, once a replica
that would be sent the chat completion is chosen (dialect_serve)."""

from __future__ import annotations

from llmgw.gateway.answers import Refused
from llmgw.gateway.dialects import fields as f
from llmgw.gateway.dialects.chat import (
    Answer,
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
        "model", "input", "instructions", "tools", "tool_choice", "parallel_tool_calls",
        "max_output_tokens", "temperature", "top_p", "text", "stream", "stream_options",
        "user", "metadata", "store", "previous_response_id", "conversation", "background",
        "prompt", "include", "truncation", "reasoning", "safety_identifier",
        "prompt_cache_key", "service_tier", "top_logprobs", "max_tool_calls",
    }
)  # fmt: skip
# Fields that ask for state this gateway does not keep: refused unless null or false.
STATEFUL = ("previous_response_id", "conversation", "background", "prompt", "store")
STATELESS = (
    "this gateway's Responses API is stateless: it keeps no responses, so send the whole "
    "conversation in 'input' (with 'store' false or left out)."
)


def responses_request(body: dict) -> dict:
    """The chat completions body for a Responses API body; a 400 naming the field for one
    the translation cannot honour."""
    f.only_known(body, KNOWN)
    _stateless(body)
    _engine_fields(body)
    chat: dict = {"model": f.text(body.get("model"), "model"), "messages": _messages(body)}
    f.sampling(body, chat, temperature_max=2.0)
    if body.get("max_output_tokens") is not None:
        chat["max_tokens"] = f.whole(body["max_output_tokens"], "max_output_tokens", least=1)
    if body.get("tools") is not None:
        chat["tools"] = [_tool(t, i) for i, t in enumerate(f.array(body["tools"], "tools"))]
    if body.get("tool_choice") is not None:
        chat["tool_choice"] = _tool_choice(body["tool_choice"])
    if body.get("parallel_tool_calls") is not None:
        chat["parallel_tool_calls"] = f.flag(body["parallel_tool_calls"], "parallel_tool_calls")
    if body.get("text") is not None:
        response_format = _text_format(f.obj(body["text"], "text"))
        if response_format is not None:
            chat["response_format"] = response_format
    _hints(body, chat)
    if f.stream(body):
        chat["stream"] = True
        chat["stream_options"] = {"include_usage": True}  # response.completed carries usage
    return chat


def _stateless(body: dict) -> None:
    """Refuse what needs stored responses."""
    for name in STATEFUL:
        if body.get(name) not in (None, False):
            raise f.refuse(name, STATELESS, "unsupported_parameter")


def _engine_fields(body: dict) -> None:
    """Check the shape of the fields only an engine serving the API honours (ENGINE_ONLY);
    whether they may go on is told once the engine is known (`not_translatable`)."""
    if body.get("truncation") is not None:
        f.one_of(body["truncation"], "truncation", ("auto", "disabled"))
    if body.get("reasoning") is not None:
        f.obj(body["reasoning"], "reasoning")
    if body.get("top_logprobs") is not None:
        f.whole(body["top_logprobs"], "top_logprobs")
    if body.get("max_tool_calls") is not None:
        f.whole(body["max_tool_calls"], "max_tool_calls", least=1)


# The engines (catalog.domain.ENGINES) that serve the Responses API themselves.
SERVE_RESPONSES = frozenset({"vllm"})
# What each field asks for that a chat completion cannot give.
ENGINE_ONLY = {
    "reasoning": "reasoning settings",
    "truncation": "truncation 'auto'",
    "top_logprobs": "log probabilities",
    "max_tool_calls": "a cap on tool calls",
    "include": "log probabilities ('message.output_text.logprobs')",
}
LOGPROBS = "message.output_text.logprobs"


def engine_only(body: dict) -> list[str]:
    """The fields of `body` (as `responses_request` accepted it) that ask for something only
    an engine serving the Responses API itself gives: null, empty, 0 or "disabled" ask
    for nothing; `include` asks only by naming the output's log probabilities."""
    asked = []
    reasoning = body.get("reasoning")
    if isinstance(reasoning, dict) and any(v is not None for v in reasoning.values()):
        asked.append("reasoning")
    if body.get("truncation") == "auto":
        asked.append("truncation")
    for name in ("top_logprobs", "max_tool_calls"):
        if body.get(name):
            asked.append(name)
    if LOGPROBS in (body.get("include") or ()):
        asked.append("include")
    return asked


def not_translatable(body: dict, engine: str) -> Refused | None:
    """The 400 for a body sent as a chat completion to a replica running `engine` while it
    asks for what only an engine serving the Responses API gives; None when nothing of it
    would be lost."""
    asked = engine_only(body)
    if not asked:
        return None
    name, serving = asked[0], " or ".join(sorted(SERVE_RESPONSES))
    return f.refuse(
        name,
        f"{ENGINE_ONLY[name]} reach only an engine that serves the Responses API itself "
        f"({serving}); this model's replica runs {engine}, which is sent the chat completion "
        f"the request translates to. Leave it out, or ask a model served by {serving}.",
        "unsupported_parameter",
    )


def _hints(body: dict, chat: dict) -> None:
    """`user` becomes chat's; `metadata` (echoed in the Response), `include`,
    `stream_options` and the caching and tier hints are checked and left out: they ask for
    nothing a chat engine changes."""
    for name in ("user", "safety_identifier", "prompt_cache_key", "service_tier"):
        if body.get(name) is not None:
            f.text(body[name], name)
    if body.get("user") is not None:
        chat["user"] = body["user"]
    for name in ("metadata", "stream_options"):
        if body.get(name) is not None:
            f.obj(body[name], name)
    if body.get("include") is not None:
        for i, value in enumerate(f.array(body["include"], "include")):
            f.text(value, f"include[{i}]")


def _messages(body: dict) -> list[dict]:
    messages: list[dict] = []
    if body.get("instructions") is not None:
        messages.append({"role": "system", "content": f.text(body["instructions"], "instructions")})
    value = body.get("input")
    if value is None:
        raise f.refuse(
            "input", "is required: a string or an array of items.", "missing_required_parameter"
        )
    if isinstance(value, str):
        messages.append({"role": "user", "content": value})
        return messages
    for i, item in enumerate(f.array(value, "input", empty=False)):
        _item(f.obj(item, f"input[{i}]"), f"input[{i}]", messages)
    return messages


ITEM_KINDS = "message, function_call and function_call_output"


def _item(item: dict, where: str, messages: list[dict]) -> None:
    """One input item appended to `messages` as chat completions write it."""
    kind = item.get("type", "message")
    if kind == "message":
        messages.append(_message(item, where))
    elif kind == "function_call":
        call = _function_call(item, where)
        last = messages[-1] if messages else None
        # A response's text and its calls, or its parallel calls, are one assistant turn.
        if last is not None and last["role"] == "assistant":
            last.setdefault("tool_calls", []).append(call)
        else:
            messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
    elif kind == "function_call_output":
        messages.append(_function_output(item, where))
    elif kind == "reasoning":
        pass  # a replayed reasoning item: chat completions have no place for it
    elif kind == "item_reference":
        raise f.refuse(f"{where}.type", STATELESS, "unsupported_value")
    else:
        raise f.refuse(
            f"{where}.type",
            f"items of type {kind!r} are not supported; this gateway translates {ITEM_KINDS} items.",
            "unsupported_value",
        )


def _function_call(item: dict, where: str) -> dict:
    f.only_known(
        item, frozenset({"type", "call_id", "name", "arguments", "id", "status"}), f"{where}."
    )
    return {
        "id": f.text(item.get("call_id"), f"{where}.call_id"),
        "type": "function",
        "function": {
            "name": f.text(item.get("name"), f"{where}.name"),
            "arguments": f.text(item.get("arguments"), f"{where}.arguments"),
        },
    }


def _function_output(item: dict, where: str) -> dict:
    f.only_known(item, frozenset({"type", "call_id", "output", "id", "status"}), f"{where}.")
    output = item.get("output")
    if not isinstance(output, str):
        output = _joined(output, f"{where}.output")
    return {
        "role": "tool",
        "tool_call_id": f.text(item.get("call_id"), f"{where}.call_id"),
        "content": output,
    }


ROLES = ("user", "assistant", "system", "developer")


def _message(item: dict, where: str) -> dict:
    f.only_known(item, frozenset({"type", "role", "content", "id", "status", "phase"}), f"{where}.")
    role = f.one_of(item.get("role"), f"{where}.role", ROLES)
    role = "system" if role == "developer" else role  # not every engine's template knows it
    content = item.get("content")
    if isinstance(content, str):
        return {"role": role, "content": content}
    parts = [
        _part(f.obj(p, f"{where}.content[{j}]"), f"{where}.content[{j}]")
        for j, p in enumerate(f.array(content, f"{where}.content"))
    ]
    if role != "user" or all(p["type"] == "text" for p in parts):
        if any(p["type"] != "text" for p in parts):
            raise f.refuse(
                f"{where}.content",
                f"images are accepted only in user messages, not {role!r} ones.",
                "unsupported_value",
            )
        return {"role": role, "content": "\n".join(p["text"] for p in parts)}
    return {"role": role, "content": parts}


def _part(part: dict, where: str) -> dict:
    """One content part as chat completions write it: text (input_text, a replayed
    output_text or refusal) or an image by URL."""
    kind = part.get("type")
    if kind in ("input_text", "output_text"):
        return {"type": "text", "text": f.text(part.get("text"), f"{where}.text")}
    if kind == "refusal":
        return {"type": "text", "text": f.text(part.get("refusal"), f"{where}.refusal")}
    if kind == "input_image":
        if part.get("image_url") is None:
            raise f.refuse(
                f"{where}.image_url",
                "an image is accepted by URL (or data: URL) only; files are not stored here.",
                "unsupported_value",
            )
        image = {"url": f.text(part["image_url"], f"{where}.image_url")}
        if part.get("detail") is not None:
            image["detail"] = f.one_of(
                part["detail"], f"{where}.detail", ("low", "high", "auto", "original")
            )
        return {"type": "image_url", "image_url": image}
    raise f.refuse(
        f"{where}.type",
        f"content of type {kind!r} is not supported; use input_text or input_image.",
        "unsupported_value",
    )


def _joined(value: object, where: str) -> str:
    """A function call's output given as parts: their text, one part a line."""
    parts = [
        _part(f.obj(p, f"{where}[{j}]"), f"{where}[{j}]")
        for j, p in enumerate(f.array(value, where))
    ]
    if any(p["type"] != "text" for p in parts):
        raise f.refuse(where, "a function call's output must be text.", "unsupported_value")
    return "\n".join(p["text"] for p in parts)


def _tool(tool: object, i: int) -> dict:
    where = f"tools[{i}]"
    tool = f.obj(tool, where)
    if tool.get("type") != "function":
        raise f.refuse(
            f"{where}.type",
            "only function tools are supported (the engine runs no hosted tools).",
            "unsupported_value",
        )
    f.only_known(
        tool, frozenset({"type", "name", "description", "parameters", "strict"}), f"{where}."
    )
    function = {"name": f.text(tool.get("name"), f"{where}.name")}
    if tool.get("description") is not None:
        function["description"] = f.text(tool["description"], f"{where}.description")
    if tool.get("parameters") is not None:
        function["parameters"] = f.obj(tool["parameters"], f"{where}.parameters")
    if tool.get("strict") is not None:
        function["strict"] = f.flag(tool["strict"], f"{where}.strict")
    return {"type": "function", "function": function}


def _tool_choice(value: object) -> str | dict:
    if isinstance(value, str):
        return f.one_of(value, "tool_choice", ("none", "auto", "required"))
    value = f.obj(value, "tool_choice")
    if value.get("type") != "function":
        raise f.refuse(
            "tool_choice.type",
            "only 'function' (or none, auto, required) is supported.",
            "unsupported_value",
        )
    return {"type": "function", "function": {"name": f.text(value.get("name"), "tool_choice.name")}}


def _text_format(text: dict) -> dict | None:
    f.only_known(text, frozenset({"format", "verbosity"}), "text.")
    if text.get("verbosity") is not None:
        f.one_of(text["verbosity"], "text.verbosity", ("low", "medium", "high"))
    if text.get("format") is None:
        return None
    fmt = f.obj(text["format"], "text.format")
    kind = f.one_of(fmt.get("type"), "text.format.type", ("text", "json_object", "json_schema"))
    if kind == "text":
        return None
    if kind == "json_object":
        return {"type": "json_object"}
    f.only_known(
        fmt, frozenset({"type", "name", "schema", "strict", "description"}), "text.format."
    )
    schema = {
        "name": f.text(fmt.get("name"), "text.format.name"),
        "schema": f.obj(fmt.get("schema"), "text.format.schema"),
    }
    if fmt.get("strict") is not None:
        schema["strict"] = f.flag(fmt["strict"], "text.format.strict")
    if fmt.get("description") is not None:
        schema["description"] = f.text(fmt["description"], "text.format.description")
    return {"type": "json_schema", "json_schema": schema}


def response_body(request: dict, completion: dict, *, rid: str, now: float) -> dict:
    """The Response object for an engine's chat completion of `request` (a body
    `responses_request` accepted); `rid` makes its ids, `now` its times."""
    answer = answer_read(completion, rid)
    output = [item for item in (_message_item(answer, rid),) if item] + [
        _call_item(rid, i, call.id, call.name, call.arguments)
        for i, call in enumerate(answer.tool_calls)
    ]
    if not output:
        output = [_message_item(answer, rid, empty=True)]
    return response_object(
        request, rid=rid, now=now, output=output, finish=answer.finish, usage=answer.usage
    )


def _message_item(answer: Answer, rid: str, *, empty: bool = False) -> dict | None:
    if answer.refusal is not None:
        part = {"type": "refusal", "refusal": answer.refusal}
    elif answer.text or empty:
        part = text_part(answer.text)
    else:
        return None
    return message_item(rid, [part], "completed")


def text_part(text: str) -> dict:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}


def message_item(rid: str, content: list[dict], status: str) -> dict:
    return {
        "id": f"msg_{rid}",
        "type": "message",
        "role": "assistant",
        "status": status,
        "content": content,
    }


def _call_item(
    rid: str, index: int, call_id: str, name: str, arguments: str, status: str = "completed"
) -> dict:
    return {
        "id": f"fc_{rid}_{index}",
        "type": "function_call",
        "call_id": call_id,
        "name": name,
        "arguments": arguments,
        "status": status,
    }


# Why an answer stopped short, as the Responses API says it: chat's finish_reason to the
# Response's incomplete_details.reason.
INCOMPLETE = {"length": "max_output_tokens", "content_filter": "content_filter"}


def response_object(
    request: dict,
    *,
    rid: str,
    now: float,
    output: list[dict],
    finish: str | None,
    usage: Usage | None,
    status: str | None = None,
    error: dict | None = None,
) -> dict:
    """A Response: what the request asked for echoed, with the output, a status (completed,
    or incomplete with its reason, unless `status` says otherwise) and the usage."""
    incomplete = INCOMPLETE.get(finish or "")
    if status is None:
        status = "incomplete" if incomplete else "completed"
    tool_choice = request.get("tool_choice")
    return {
        "id": f"resp_{rid}",
        "object": "response",
        "created_at": int(now),
        "status": status,
        "completed_at": int(now) if status == "completed" else None,
        "error": error,
        "incomplete_details": {"reason": incomplete} if status == "incomplete" else None,
        "instructions": request.get("instructions"),
        "max_output_tokens": request.get("max_output_tokens"),
        "metadata": request.get("metadata") or {},
        "model": request["model"],
        "output": output,
        "parallel_tool_calls": request.get("parallel_tool_calls", True) is not False,
        "previous_response_id": None,
        "store": False,
        "temperature": request.get("temperature"),
        "text": {"format": (request.get("text") or {}).get("format") or {"type": "text"}},
        "tool_choice": "auto" if tool_choice is None else tool_choice,
        "tools": request.get("tools") or [],
        "top_p": request.get("top_p"),
        "truncation": "disabled",
        "usage": None if usage is None else usage_object(usage),
        "user": request.get("user"),
    }


def usage_object(usage: Usage) -> dict:
    return {
        "input_tokens": usage.prompt,
        "input_tokens_details": {"cached_tokens": usage.cached, "cache_write_tokens": 0},
        "output_tokens": usage.completion,
        "output_tokens_details": {"reasoning_tokens": usage.reasoning},
        "total_tokens": usage.prompt + usage.completion,
    }


def chat_usage(usage: dict) -> dict:
    """An engine's usage in chat completions' names, which the accounting reads: a
    Response's (`input_tokens`, `output_tokens`, its cached tokens), from an engine that
    served the Responses API itself, renamed; a chat completion's as it is."""
    if "prompt_tokens" in usage or "input_tokens" not in usage:
        return usage
    prompt, completion = usage.get("input_tokens"), usage.get("output_tokens")
    chat = {"prompt_tokens": prompt, "completion_tokens": completion}
    if isinstance(prompt, int) and isinstance(completion, int):
        chat["total_tokens"] = prompt + completion
    details = usage.get("input_tokens_details")
    if isinstance(details, dict) and details.get("cached_tokens") is not None:
        chat["prompt_tokens_details"] = {"cached_tokens": details["cached_tokens"]}
    return chat


class ResponsesStream:
    """The Responses API's typed events for a streamed chat completion: `start()` first,
    `feed(chunk)` for each chunk as it arrives, `close()` when the engine's stream ends.
    Each returns the events to send, numbered by `sequence_number`. Text becomes one message
    item; each tool call a function_call item; the final event (response.completed, or
    .incomplete, or .failed for an engine's error) carries the whole Response and its usage,
    which comes in the engine's last chunk."""

    def __init__(self, request: dict, *, rid: str, now: float) -> None:
        self.request, self.rid, self.now = request, rid, now
        self.reader = ChunkReader(rid)
        self.sequence = 0
        self.output: list[dict] = []  # every item so far, in output order
        self.open: dict[object, int] = {}  # "text" or a tool call's index -> output index
        self.finish: str | None = None
        self.usage: Usage | None = None
        self.ended = False

    def _event(self, kind: str, **fields) -> dict:
        event = {"type": kind, "sequence_number": self.sequence, **fields}
        self.sequence += 1
        return event

    def _response(self, status: str | None = None, error: dict | None = None) -> dict:
        return response_object(
            self.request,
            rid=self.rid,
            now=self.now,
            output=[_copy(item) for item in self.output],
            finish=self.finish,
            usage=self.usage,
            status=status,
            error=error,
        )

    def start(self) -> list[dict]:
        response = self._response("in_progress")
        return [
            self._event("response.created", response=response),
            self._event("response.in_progress", response=response),
        ]

    def feed(self, chunk: dict) -> list[dict]:
        if self.ended:
            return []
        events: list[dict] = []
        for step in self.reader.read(chunk):
            match step:
                case Text(text) if self.finish is None:
                    events += self._text(text)
                case ToolStart(index, call_id, name) if self.finish is None:
                    events += self._close_all()
                    events += self._add(
                        index, _call_item(self.rid, index, call_id, name, "", "in_progress")
                    )
                case ToolArgs(index, fragment) if index in self.open:
                    at = self.open[index]
                    self.output[at]["arguments"] += fragment
                    events.append(
                        self._event(
                            "response.function_call_arguments.delta",
                            item_id=self.output[at]["id"],
                            output_index=at,
                            delta=fragment,
                        )
                    )
                case Finish(reason, _):
                    events += self._close_all()
                    self.finish = reason
                case Counted(usage):
                    self.usage = usage
                case Failed(message, _):
                    self.ended = True
                    error = {"code": "server_error", "message": message}
                    return events + [
                        self._event("response.failed", response=self._response("failed", error))
                    ]
        return events

    def close(self) -> list[dict]:
        """The closing events: what is open closed, then the whole Response."""
        if self.ended:
            return []
        self.ended = True
        events = self._close_all()
        if not self.output:
            events += self._text("")
            events += self._close_all()
        response = self._response()
        kind = "response.incomplete" if response["status"] == "incomplete" else "response.completed"
        return events + [self._event(kind, response=response)]

    def _add(self, key: object, item: dict) -> list[dict]:
        self.open[key] = len(self.output)
        self.output.append(item)
        return [
            self._event("response.output_item.added", output_index=self.open[key], item=_copy(item))
        ]

    def _text(self, text: str) -> list[dict]:
        events: list[dict] = []
        if "text" not in self.open:
            events += self._add("text", message_item(self.rid, [], "in_progress"))
            item = self.output[self.open["text"]]
            item["content"].append(text_part(""))
            events.append(
                self._event(
                    "response.content_part.added",
                    item_id=item["id"],
                    output_index=self.open["text"],
                    content_index=0,
                    part=text_part(""),
                )
            )
        at = self.open["text"]
        item = self.output[at]
        item["content"][0]["text"] += text
        if text:
            events.append(
                self._event(
                    "response.output_text.delta",
                    item_id=item["id"],
                    output_index=at,
                    content_index=0,
                    delta=text,
                    logprobs=[],
                )
            )
        return events

    def _close_all(self) -> list[dict]:
        events: list[dict] = []
        for key, at in self.open.items():
            item = self.output[at]
            if key == "text":
                part = item["content"][0]
                events.append(
                    self._event(
                        "response.output_text.done",
                        item_id=item["id"],
                        output_index=at,
                        content_index=0,
                        text=part["text"],
                        logprobs=[],
                    )
                )
                events.append(
                    self._event(
                        "response.content_part.done",
                        item_id=item["id"],
                        output_index=at,
                        content_index=0,
                        part=dict(part),
                    )
                )
            else:
                events.append(
                    self._event(
                        "response.function_call_arguments.done",
                        item_id=item["id"],
                        output_index=at,
                        arguments=item["arguments"],
                    )
                )
            item["status"] = "completed"
            events.append(
                self._event("response.output_item.done", output_index=at, item=_copy(item))
            )
        self.open.clear()
        return events


def _copy(item: dict) -> dict:
    """An item as it stands now, so a later delta does not change an event already made."""
    copied = dict(item)
    if "content" in copied:
        copied["content"] = [dict(p) for p in copied["content"]]
    return copied
