"""Reading an engine's chat completion, whole (`answer_read`) or streamed (`ChunkReader`),
into the few parts the other APIs write back: the text, a refusal, the tool calls, why it
stopped and the token counts. An engine's answer is read defensively: a field missing or of
the wrong type reads as absent, never as an exception in the middle of an answer."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class Usage:
    prompt: int = 0
    completion: int = 0
    cached: int = 0  # of `prompt`, read from the engine's prefix cache
    reasoning: int = 0  # of `completion`


@dataclass(frozen=True)
class ToolCall:
    id: str
    name: str
    arguments: str  # JSON text, as the engine wrote it


@dataclass(frozen=True)
class Answer:
    text: str
    refusal: str | None
    tool_calls: tuple[ToolCall, ...]
    finish: str | None  # chat's finish_reason: stop, length, tool_calls, content_filter
    stopped_by: str | None  # the stop sequence that ended it, where the engine says (vLLM)
    usage: Usage
    model: str | None


def _count(value: object) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0


def _dict(value: object) -> dict:
    return value if isinstance(value, dict) else {}


def _str(value: object) -> str:
    return value if isinstance(value, str) else ""


def usage_read(usage: object) -> Usage:
    usage = _dict(usage)
    prompt = _count(usage.get("prompt_tokens"))
    completion = _count(usage.get("completion_tokens"))
    cached = _count(_dict(usage.get("prompt_tokens_details")).get("cached_tokens"))
    reasoning = _count(_dict(usage.get("completion_tokens_details")).get("reasoning_tokens"))
    return Usage(prompt, completion, min(cached, prompt), min(reasoning, completion))


def call_id(rid: str, index: int) -> str:
    """An id for a tool call the engine gave none: the client must quote one back."""
    return f"call_{rid}_{index}"


def _stopped_by(choice: dict) -> str | None:
    # vLLM names the stop string that ended the answer in `stop_reason` (an int is a token id).
    value = choice.get("stop_reason")
    return value if isinstance(value, str) else None


def answer_read(completion: dict, rid: str) -> Answer:
    """The first choice of a (non-streamed) chat completion."""
    choices = completion.get("choices")
    choice = _dict(choices[0]) if isinstance(choices, list) and choices else {}
    message = _dict(choice.get("message"))
    calls = message.get("tool_calls")
    tool_calls = tuple(
        ToolCall(
            _str(_dict(call).get("id")) or call_id(rid, i),
            _str(_dict(_dict(call).get("function")).get("name")),
            _str(_dict(_dict(call).get("function")).get("arguments")),
        )
        for i, call in enumerate(calls if isinstance(calls, list) else ())
    )
    refusal = message.get("refusal")
    return Answer(
        text=_str(message.get("content")),
        refusal=refusal if isinstance(refusal, str) and refusal else None,
        tool_calls=tool_calls,
        finish=choice.get("finish_reason")
        if isinstance(choice.get("finish_reason"), str)
        else None,
        stopped_by=_stopped_by(choice),
        usage=usage_read(completion.get("usage")),
        model=completion.get("model") if isinstance(completion.get("model"), str) else None,
    )


@dataclass(frozen=True)
class Text:
    text: str


@dataclass(frozen=True)
class ToolStart:
    index: int
    id: str
    name: str


@dataclass(frozen=True)
class ToolArgs:
    index: int
    fragment: str


@dataclass(frozen=True)
class Finish:
    reason: str
    stopped_by: str | None


@dataclass(frozen=True)
class Counted:
    usage: Usage


@dataclass(frozen=True)
class Failed:
    message: str
    code: str | None


Step = Text | ToolStart | ToolArgs | Finish | Counted | Failed


@dataclass
class ChunkReader:
    """Chat completion chunks in, in order; the steps each one says out. A tool call's
    first chunk (a new `index`) starts it; later ones add to its arguments."""

    rid: str
    started: set[int] = field(default_factory=set)

    def read(self, chunk: dict) -> list[Step]:
        if chunk.get("error") is not None:
            error = _dict(chunk["error"])
            message = _str(error.get("message")) or "The engine's stream failed."
            code = error.get("code")
            return [Failed(message, code if isinstance(code, str) else None)]
        steps: list[Step] = []
        choices = chunk.get("choices")
        choice = _dict(choices[0]) if isinstance(choices, list) and choices else {}
        delta = _dict(choice.get("delta"))
        content = _str(delta.get("content")) or _str(delta.get("refusal"))
        if content:
            steps.append(Text(content))
        calls = delta.get("tool_calls")
        for call in calls if isinstance(calls, list) else ():
            steps.extend(self._call(_dict(call)))
        reason = choice.get("finish_reason")
        if isinstance(reason, str):
            steps.append(Finish(reason, _stopped_by(choice)))
        if isinstance(chunk.get("usage"), dict):
            steps.append(Counted(usage_read(chunk["usage"])))
        return steps

    def _call(self, call: dict) -> list[Step]:
        index = call.get("index")
        if not isinstance(index, int) or isinstance(index, bool):
            index = max(self.started, default=0)
        function = _dict(call.get("function"))
        steps: list[Step] = []
        if index not in self.started:
            self.started.add(index)
            steps.append(
                ToolStart(
                    index,
                    _str(call.get("id")) or call_id(self.rid, index),
                    _str(function.get("name")),
                )
            )
        arguments = _str(function.get("arguments"))
        if arguments:
            steps.append(ToolArgs(index, arguments))
        return steps
