"""The Responses API over chat completions (llmgw.gateway.dialects.responses): bodies in,
chat bodies out, answers and streams back, each checked against the openai SDK's own types."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings, strategies as st
from openai._streaming import SSEDecoder
from openai._types import omit
from openai.lib.streaming.responses._responses import ResponseStreamState
from openai.types.responses import Response, ResponseStreamEvent
from pydantic import TypeAdapter

from llmgw.gateway.answers import Refused
from llmgw.gateway.dialects.responses import (
    ResponsesStream,
    engine_only,
    not_translatable,
    response_body,
    responses_request,
)
from llmgw.gateway.dialects.sse import sse
from tests.gateway.chat_answers import chunks, completion

EVENT = TypeAdapter(ResponseStreamEvent)
NOW = 1_765_000_000.0


def translate(**body) -> dict:
    return responses_request({"model": "smol", **body})


def test_a_string_input_is_one_user_message_after_the_instructions():
    chat = translate(input="Name a colour.", instructions="Answer in one word.")
    assert chat == {
        "model": "smol",
        "messages": [
            {"role": "system", "content": "Answer in one word."},
            {"role": "user", "content": "Name a colour."},
        ],
    }


def test_items_become_the_conversation_with_its_tool_calls_and_their_outputs():
    chat = translate(
        input=[
            {"role": "developer", "content": "Be brief."},
            {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Weather?"}]},
            {"type": "function_call", "call_id": "c1", "name": "weather", "arguments": '{"city":"Oslo"}'},
            {"type": "function_call", "call_id": "c2", "name": "weather", "arguments": '{"city":"Rome"}'},
            {"type": "function_call_output", "call_id": "c1", "output": "sunny"},
            {"type": "function_call_output", "call_id": "c2", "output": [{"type": "input_text", "text": "rain"}]},
            {"id": "msg_1", "type": "message", "role": "assistant", "status": "completed",
             "content": [{"type": "output_text", "text": "Oslo sunny, Rome rain.", "annotations": []}]},
        ]
    )  # fmt: skip

    def call(i, city):
        arguments = json.dumps({"city": city}, separators=(",", ":"))
        return {
            "id": i,
            "type": "function",
            "function": {"name": "weather", "arguments": arguments},
        }

    assert chat["messages"] == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Weather?"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [call("c1", "Oslo"), call("c2", "Rome")],
        },
        {"role": "tool", "tool_call_id": "c1", "content": "sunny"},
        {"role": "tool", "tool_call_id": "c2", "content": "rain"},
        {"role": "assistant", "content": "Oslo sunny, Rome rain."},
    ]


def test_an_image_by_url_is_passed_as_chat_takes_it():
    part = {"type": "input_image", "image_url": "data:image/png;base64,AAAA", "detail": "low"}
    chat = translate(
        input=[{"role": "user", "content": [{"type": "input_text", "text": "What?"}, part]}]
    )
    assert chat["messages"][0]["content"] == [
        {"type": "text", "text": "What?"},
        {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA", "detail": "low"}},
    ]


def test_tools_sampling_and_the_output_cap_are_chat_fields():
    tool = {"type": "function", "name": "weather", "description": "Now.", "parameters": {"type": "object"}, "strict": True}  # fmt: skip
    chat = translate(
        input="hi",
        tools=[tool],
        tool_choice={"type": "function", "name": "weather"},
        parallel_tool_calls=False,
        max_output_tokens=64,
        temperature=0.2,
        top_p=0.9,
        user="u-1",
    )
    assert chat["tools"] == [
        {
            "type": "function",
            "function": {
                "name": "weather",
                "description": "Now.",
                "parameters": {"type": "object"},
                "strict": True,
            },
        }
    ]
    assert chat["tool_choice"] == {"type": "function", "function": {"name": "weather"}}
    assert (chat["parallel_tool_calls"], chat["max_tokens"]) == (False, 64)
    assert (chat["temperature"], chat["top_p"], chat["user"]) == (0.2, 0.9, "u-1")
    assert translate(input="hi", tool_choice="required")["tool_choice"] == "required"


@pytest.mark.parametrize(
    ("fmt", "expected"),
    [
        ({"type": "text"}, None),
        ({"type": "json_object"}, {"type": "json_object"}),
        (
            {"type": "json_schema", "name": "colour", "schema": {"type": "object"}, "strict": True},
            {
                "type": "json_schema",
                "json_schema": {"name": "colour", "schema": {"type": "object"}, "strict": True},
            },
        ),
    ],
)
def test_text_format_is_the_response_format(fmt, expected):
    assert translate(input="hi", text={"format": fmt}).get("response_format") == expected


def test_a_stream_asks_the_engine_for_its_usage_and_null_means_no_stream():
    assert translate(input="hi", stream=True)["stream_options"] == {"include_usage": True}
    assert "stream" not in translate(
        input="hi", stream=None, store=False, previous_response_id=None
    )


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"input": "hi", "previous_response_id": "resp_1"}, "previous_response_id"),
        ({"input": "hi", "store": True}, "store"),
        ({"input": "hi", "conversation": "conv_1"}, "conversation"),
        ({"input": "hi", "background": True}, "background"),
        ({"input": "hi", "seed": 1}, "seed"),
        ({"input": "hi", "model": 7}, "model"),
        ({}, "input"),
        ({"input": []}, "input"),
        ({"input": 3}, "input"),
        ({"input": ["hi"]}, "input[0]"),
        ({"input": [{"type": "item_reference", "id": "msg_1"}]}, "input[0].type"),
        ({"input": [{"type": "web_search_call", "id": "ws"}]}, "input[0].type"),
        ({"input": [{"role": "tool", "content": "x"}]}, "input[0].role"),
        (
            {"input": [{"role": "user", "content": [{"type": "input_file", "file_id": "f"}]}]},
            "input[0].content[0].type",
        ),
        (
            {"input": [{"role": "user", "content": [{"type": "input_image", "file_id": "f"}]}]},
            "input[0].content[0].image_url",
        ),
        (
            {"input": [{"role": "user", "content": [{"type": "input_text", "text": 5}]}]},
            "input[0].content[0].text",
        ),
        (
            {"input": [{"type": "function_call", "name": "f", "arguments": "{}"}]},
            "input[0].call_id",
        ),
        (
            {"input": [{"type": "function_call_output", "call_id": "c", "output": 1}]},
            "input[0].output",
        ),
        ({"input": "hi", "instructions": ["x"]}, "instructions"),
        ({"input": "hi", "temperature": 3}, "temperature"),
        ({"input": "hi", "top_p": "high"}, "top_p"),
        ({"input": "hi", "max_output_tokens": 0}, "max_output_tokens"),
        ({"input": "hi", "max_output_tokens": True}, "max_output_tokens"),
        ({"input": "hi", "stream": "yes"}, "stream"),
        ({"input": "hi", "tools": [{"type": "web_search"}]}, "tools[0].type"),
        ({"input": "hi", "tools": [{"type": "function"}]}, "tools[0].name"),
        (
            {"input": "hi", "tools": [{"type": "function", "name": "f", "parameters": []}]},
            "tools[0].parameters",
        ),
        ({"input": "hi", "tool_choice": "always"}, "tool_choice"),
        ({"input": "hi", "tool_choice": {"type": "file_search"}}, "tool_choice.type"),
        ({"input": "hi", "text": {"format": {"type": "xml"}}}, "text.format.type"),
        (
            {"input": "hi", "text": {"format": {"type": "json_schema", "name": "x"}}},
            "text.format.schema",
        ),
        ({"input": "hi", "truncation": "sometimes"}, "truncation"),
        ({"input": "hi", "reasoning": "high"}, "reasoning"),
        ({"input": "hi", "top_logprobs": -1}, "top_logprobs"),
        ({"input": "hi", "max_tool_calls": 0}, "max_tool_calls"),
        ({"input": "hi", "metadata": "x"}, "metadata"),
    ],
)
def test_a_body_the_translation_cannot_honour_is_a_400_naming_its_field(body, param):
    with pytest.raises(Refused) as refused:
        responses_request({"model": "smol", **body})
    assert (refused.value.status, refused.value.param) == (400, param)
    assert f"'{param}'" in refused.value.message


def test_the_stateless_refusal_says_why_and_what_to_do_instead():
    with pytest.raises(Refused) as refused:
        translate(input="hi", previous_response_id="resp_1")
    assert "stateless" in refused.value.message and "'input'" in refused.value.message
    assert refused.value.code == "unsupported_parameter"


@pytest.mark.parametrize(
    ("extra", "asked"),
    [
        ({}, []),
        ({"reasoning": {}, "truncation": "disabled", "top_logprobs": 0}, []),
        ({"reasoning": {"effort": None, "summary": None}, "max_tool_calls": None}, []),
        ({"include": ["reasoning.encrypted_content"]}, []),  # there is none to include
        ({"reasoning": {"effort": "high"}}, ["reasoning"]),
        ({"truncation": "auto", "top_logprobs": 3}, ["truncation", "top_logprobs"]),
        ({"max_tool_calls": 2, "include": ["message.output_text.logprobs"]}, ["max_tool_calls", "include"]),
    ],
)  # fmt: skip
def test_fields_only_an_engine_serving_responses_honours_are_told_apart(extra, asked):
    body = {"model": "smol", "input": "hi", **extra}
    responses_request(body)  # accepted: the engine is not known yet
    assert engine_only(body) == asked
    refused = not_translatable(body, "llamacpp")
    assert (refused is None) == (not asked)


def test_the_refusal_names_the_field_the_engine_and_what_to_do():
    refused = not_translatable({"input": "hi", "reasoning": {"effort": "low"}}, "llamacpp")
    assert (refused.status, refused.param, refused.code) == (
        400,
        "reasoning",
        "unsupported_parameter",
    )
    assert refused.message == (
        "'reasoning': reasoning settings reach only an engine that serves the Responses API "
        "itself (vllm); this model's replica runs llamacpp, which is sent the chat completion "
        "the request translates to. Leave it out, or ask a model served by vllm."
    )


REQUEST = {
    "model": "smol",
    "input": "hi",
    "instructions": "Be brief.",
    "tools": [{"type": "function", "name": "weather", "parameters": {"type": "object"}}],
    "temperature": 0.5,
    "max_output_tokens": 100,
}


def test_an_answer_is_a_response_the_sdk_reads():
    body = response_body(REQUEST, completion("Hello there.", cached=4), rid="r1", now=NOW)
    response = Response.model_validate(body)
    assert (response.id, response.object, response.status, response.model) == (
        "resp_r1",
        "response",
        "completed",
        "smol",
    )
    assert response.created_at == int(NOW) and response.output_text == "Hello there."
    assert (response.instructions, response.temperature, response.max_output_tokens) == (
        "Be brief.",
        0.5,
        100,
    )
    assert response.tools[0].name == "weather"
    usage = response.usage
    assert (usage.input_tokens, usage.output_tokens, usage.total_tokens) == (12, 5, 17)
    assert usage.input_tokens_details.cached_tokens == 4


def test_tool_calls_are_function_call_items_after_the_text():
    answer = completion(
        "Let me look.", calls=(("c1", "weather", '{"city":"Oslo"}'),), finish="tool_calls"
    )
    response = Response.model_validate(response_body(REQUEST, answer, rid="r1", now=NOW))
    message, call = response.output
    assert message.type == "message" and message.content[0].text == "Let me look."
    assert (call.type, call.call_id, call.name, call.arguments) == (
        "function_call",
        "c1",
        "weather",
        '{"city":"Oslo"}',
    )
    assert response.status == "completed"


def test_an_answer_cut_by_the_cap_is_incomplete_and_says_why():
    response = Response.model_validate(
        response_body(REQUEST, completion(finish="length"), rid="r1", now=NOW)
    )
    assert response.status == "incomplete"
    assert response.incomplete_details.reason == "max_output_tokens"


def test_a_refusal_is_a_refusal_part():
    answer = completion(None)
    answer["choices"][0]["message"]["refusal"] = "I can't help with that."
    response = Response.model_validate(response_body(REQUEST, answer, rid="r1", now=NOW))
    assert response.output[0].content[0].type == "refusal"


@pytest.mark.parametrize(
    "answer",
    [{}, {"choices": "x"}, {"choices": [{"message": None}]}, completion(None, usage=(0, 0))],
)
def test_an_empty_or_malformed_answer_is_still_a_response(answer):
    response = Response.model_validate(response_body(REQUEST, answer, rid="r1", now=NOW))
    assert response.output_text == ""


def stream(request: dict, engine_chunks: list[dict]) -> list[dict]:
    translator = ResponsesStream(request, rid="r1", now=NOW)
    events = translator.start()
    for chunk in engine_chunks:
        events += translator.feed(chunk)
    return events + translator.close()


def replayed(events: list[dict]) -> Response:
    """The events through the openai SDK's own stream state, as `responses.stream()` reads
    them: each must be one the SDK knows and fit what came before, and the output the SDK
    builds from the deltas must be the final event's."""
    state = ResponseStreamState(input_tools=omit, text_format=omit)
    for event in events:
        state.handle_event(EVENT.validate_python(event))
        if event is events[-2]:
            built = state._ResponseStreamState__current_snapshot.output  # what the deltas made
    final = Response.model_validate(events[-1]["response"])
    # The SDK's snapshot keeps each item's status as it was added ("in_progress").
    assert _unstatused(built) == _unstatused(final.output)
    return final


def _unstatused(items) -> list[dict]:
    return [{**item.to_dict(), "status": None} for item in items]


def test_a_stream_is_the_responses_events_in_order_numbered():
    events = stream(REQUEST, chunks(["Hel", "lo"]))
    assert [e["type"] for e in events] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
        "response.output_text.delta",
        "response.output_text.delta",
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.completed",
    ]
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    response = replayed(events)
    assert response.output_text == "Hello" and response.usage.total_tokens == 17
    assert (
        events[0]["response"]["status"] == "in_progress" and events[0]["response"]["output"] == []
    )


def test_a_streamed_answer_ends_as_the_whole_answer_does():
    calls = (("c1", "weather", ['{"city"', ':"Oslo"}']), ("c2", "time", ["{}"]))
    events = stream(REQUEST, chunks(["Let me ", "look."], calls=calls, finish="tool_calls"))
    whole = completion(
        "Let me look.",
        calls=(("c1", "weather", '{"city":"Oslo"}'), ("c2", "time", "{}")),
        finish="tool_calls",
    )
    assert replayed(events) == Response.model_validate(
        response_body(REQUEST, whole, rid="r1", now=NOW)
    )
    kinds = [e["type"] for e in events]
    assert kinds.count("response.function_call_arguments.delta") == 3
    assert kinds.count("response.output_item.done") == 3


def test_a_stream_cut_by_the_cap_ends_incomplete():
    events = stream(REQUEST, chunks(["Hel"], finish="length"))
    assert events[-1]["type"] == "response.incomplete"
    assert replayed(events).incomplete_details.reason == "max_output_tokens"


def test_an_empty_stream_still_has_its_message():
    events = stream(REQUEST, chunks([], usage=None))
    response = replayed(events)
    assert response.output_text == "" and response.usage is None


def test_an_engine_error_mid_stream_fails_the_response_and_nothing_follows():
    translator = ResponsesStream(REQUEST, rid="r1", now=NOW)
    events = translator.start() + translator.feed(chunks(["Hel"])[1])
    cut = {
        "error": {
            "message": "The replica went away.",
            "type": "server_error",
            "code": "upstream_cut",
        }
    }
    events += translator.feed(cut)
    assert events[-1]["type"] == "response.failed"
    failed = EVENT.validate_python(events[-1]).response
    assert (failed.status, failed.error.message) == ("failed", "The replica went away.")
    assert translator.feed(chunks()[2]) == [] and translator.close() == []


def test_events_are_written_as_the_sdk_reads_them():
    event = stream(REQUEST, chunks(["é"]))[4]
    (decoded,) = list(SSEDecoder().iter_bytes(iter([sse(event)])))
    assert decoded.event == "response.output_text.delta" and decoded.json() == event


@settings(max_examples=60, deadline=None)
@given(st.lists(st.text(min_size=1, max_size=8), max_size=12))
def test_any_text_streamed_in_deltas_joins_to_the_whole_answers_text(pieces):
    events = stream(REQUEST, chunks(pieces))
    deltas = "".join(e["delta"] for e in events if e["type"] == "response.output_text.delta")
    done = [e["text"] for e in events if e["type"] == "response.output_text.done"]
    assert deltas == "".join(pieces) == done[0] == replayed(events).output_text


JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=6),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3)
    ),
    max_leaves=12,
)
FIELDS = st.sampled_from(
    ["input", "instructions", "tools", "tool_choice", "text", "temperature", "max_output_tokens", "stream", "store", "metadata", "include"]
)  # fmt: skip


@settings(max_examples=300, deadline=None)
@given(st.dictionaries(FIELDS, JSON, max_size=4), st.lists(st.dictionaries(st.sampled_from(["type", "role", "content", "call_id", "output", "name", "arguments"]), JSON, max_size=4), max_size=3))  # fmt: skip
def test_no_body_makes_the_translation_raise_anything_but_a_400(body, items):
    for candidate in (body, {**body, "input": items}):
        try:
            responses_request({"model": "smol", **candidate})
        except Refused as refused:
            assert refused.status == 400 and refused.param
