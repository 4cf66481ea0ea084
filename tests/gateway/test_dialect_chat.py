"""Reading an engine's chat completion, whole and streamed, into the parts the other APIs
write back (llmgw.gateway.dialects.chat): an engine's slips read as absent, never raise."""

from __future__ import annotations

import pytest
from anthropic.lib.streaming._messages import accumulate_event
from anthropic.types import Message, RawMessageStreamEvent
from anthropic.types.beta_error_response import BetaErrorResponse
from hypothesis import given, settings, strategies as st
from openai._types import omit
from openai.lib.streaming.responses._responses import ResponseStreamState
from openai.types.responses import Response, ResponseStreamEvent
from pydantic import TypeAdapter

from llmgw.gateway.dialects.chat import (
    ChunkReader,
    Counted,
    Failed,
    Finish,
    Text,
    ToolArgs,
    ToolCall,
    ToolStart,
    Usage,
    answer_read,
    usage_read,
)
from llmgw.gateway.dialects.messages import MessagesStream, message_body
from llmgw.gateway.dialects.responses import ResponsesStream, response_body
from tests.gateway.chat_answers import completion

RESPONSE_EVENT = TypeAdapter(ResponseStreamEvent)
MESSAGE_EVENT = TypeAdapter(RawMessageStreamEvent)


def test_a_whole_answer_reads_into_its_parts():
    answer = answer_read(
        completion("Hi.", calls=(("c1", "f", "{}"),), finish="tool_calls", usage=(10, 3), cached=4),
        "r1",
    )
    assert (answer.text, answer.refusal, answer.finish, answer.model) == (
        "Hi.",
        None,
        "tool_calls",
        "smol",
    )
    assert answer.tool_calls == (ToolCall("c1", "f", "{}"),)
    assert answer.usage == Usage(prompt=10, completion=3, cached=4)


def test_a_tool_call_without_an_id_is_given_one_the_client_can_quote():
    answer = completion(None, calls=(("", "f", "{}"),))
    assert answer_read(answer, "r1").tool_calls[0].id == "call_r1_0"


@pytest.mark.parametrize(
    ("usage", "expected"),
    [
        (None, Usage()),
        ({"prompt_tokens": -1, "completion_tokens": "3"}, Usage()),
        ({"prompt_tokens": True, "completion_tokens": 2.5}, Usage()),
        ({"prompt_tokens": 5, "prompt_tokens_details": {"cached_tokens": 9}}, Usage(prompt=5, cached=5)),
        ({"completion_tokens": 4, "completion_tokens_details": {"reasoning_tokens": 3}}, Usage(completion=4, reasoning=3)),
    ],
)  # fmt: skip
def test_token_counts_an_engine_got_wrong_read_as_none(usage, expected):
    assert usage_read(usage) == expected


def delta(d: dict, finish: str | None = None) -> dict:
    return {"choices": [{"index": 0, "delta": d, "finish_reason": finish}]}


def test_chunks_read_into_steps_in_order():
    reader = ChunkReader("r1")
    steps = []
    for chunk in [
        delta({"role": "assistant", "content": ""}),
        delta({"content": "Hi"}),
        delta({"tool_calls": [{"index": 0, "function": {"name": "f", "arguments": '{"a"'}}]}),
        delta({"tool_calls": [{"index": 0, "function": {"arguments": ":1}"}}]}),
        delta({"tool_calls": [{"id": "c2", "index": 1, "function": {"name": "g"}}]}),
        delta({}, "tool_calls"),
        {"choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 2}},
        {"error": {"message": "Gone.", "code": "upstream_cut"}},
        {"error": "odd"},
        {"choices": [None]},
        {},
    ]:
        steps += reader.read(chunk)
    assert steps == [
        Text("Hi"),
        ToolStart(0, "call_r1_0", "f"),
        ToolArgs(0, '{"a"'),
        ToolArgs(0, ":1}"),
        ToolStart(1, "c2", "g"),
        Finish("tool_calls", None),
        Counted(Usage(prompt=3, completion=2)),
        Failed("Gone.", "upstream_cut"),
        Failed("The engine's stream failed.", None),
    ]


def test_vllms_stop_string_is_read_and_its_token_ids_are_not():
    assert answer_read(completion(stop_reason="END"), "r1").stopped_by == "END"
    assert answer_read(completion(stop_reason=2), "r1").stopped_by is None


JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=4),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner, max_size=3),
    max_leaves=10,
)  # fmt: skip
# Chat answers and chunks with their fields, each any JSON at all.
CHUNK_FIELDS = st.sampled_from(["choices", "usage", "error", "model", "delta", "message", "finish_reason", "tool_calls", "index", "content", "function"])  # fmt: skip
SHAPES = st.recursive(
    st.dictionaries(CHUNK_FIELDS, JSON, max_size=3),
    lambda inner: st.dictionaries(CHUNK_FIELDS, inner | st.lists(inner, max_size=2), max_size=3),
    max_leaves=8,
)


@settings(max_examples=200, deadline=None)
@given(SHAPES)
def test_no_answer_an_engine_writes_makes_either_translation_raise(answer):
    request = {"model": "smol", "max_tokens": 8, "messages": [], "input": "hi"}
    Response.model_validate(response_body(request, answer, rid="r1", now=1.0))
    Message.model_validate(message_body(request, answer, rid="r1"))


@settings(max_examples=200, deadline=None)
@given(st.lists(SHAPES, max_size=6))
def test_no_chunks_an_engine_writes_make_either_stream_raise_or_go_astray(engine_chunks):
    """Whatever the engine streams, each translator's events are ones the SDK's own stream
    state reads in order, or (Anthropic's) an error event that ends them."""
    request = {"model": "smol", "max_tokens": 8, "messages": [], "input": "hi"}
    state = ResponseStreamState(input_tools=omit, text_format=omit)
    for event in run(ResponsesStream(request, rid="r1", now=1.0), engine_chunks):
        state.handle_event(RESPONSE_EVENT.validate_python(event))
    snapshot, buffers = None, {}
    for event in run(MessagesStream(request, rid="r1"), engine_chunks):
        if event["type"] == "error":  # sent as an `event: error`, apart from the union
            BetaErrorResponse.model_validate(event)
            continue
        parsed = MESSAGE_EVENT.validate_python(event)
        snapshot = accumulate_event(event=parsed, current_snapshot=snapshot, json_bufs=buffers)


def run(translator, engine_chunks: list[dict]) -> list[dict]:
    events = translator.start()
    for chunk in engine_chunks:
        events += translator.feed(chunk)
    return events + translator.close()
