"""Anthropic's Messages API over chat completions (llmgw.gateway.dialects.messages): bodies
in, chat bodies out, answers, streams and errors back, each checked against the anthropic
SDK's own types and stream accumulator."""

from __future__ import annotations

import json

import pytest
from anthropic.lib.streaming._messages import accumulate_event
from anthropic.types import Message, RawMessageStreamEvent
from anthropic.types.beta_error_response import BetaErrorResponse
from hypothesis import given, settings, strategies as st
from pydantic import TypeAdapter

from llmgw.gateway.answers import Refused, bad_request, no_key, unknown_model
from llmgw.gateway.dialects.messages import (
    MessagesStream,
    anthropic_error,
    message_body,
    messages_request,
)
from tests.gateway.chat_answers import chunks, completion

EVENT = TypeAdapter(RawMessageStreamEvent)


def translate(**body) -> dict:
    return messages_request({"model": "smol", "max_tokens": 64, **body})


def test_the_system_and_a_string_message_are_chat_messages():
    chat = translate(system="Be brief.", messages=[{"role": "user", "content": "Hi"}])
    assert chat == {
        "model": "smol",
        "max_tokens": 64,
        "messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}],
    }


def test_content_blocks_become_the_conversation_with_its_tool_calls_and_results():
    cache = {"type": "ephemeral"}
    chat = translate(
        system=[{"type": "text", "text": "Be brief.", "cache_control": cache}, {"type": "text", "text": "Use tools."}],
        messages=[
            {"role": "user", "content": [{"type": "text", "text": "Weather in Oslo?", "cache_control": cache}]},
            {"role": "assistant", "content": [
                {"type": "thinking", "thinking": "...", "signature": "s"},
                {"type": "text", "text": "Looking."},
                {"type": "tool_use", "id": "t1", "name": "weather", "input": {"city": "Oslo"}},
                {"type": "tool_use", "id": "t2", "name": "time", "input": {}},
            ]},
            {"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": "t1", "content": "sunny"},
                {"type": "tool_result", "tool_use_id": "t2", "content": [{"type": "text", "text": "down"}], "is_error": True},
                {"type": "text", "text": "And tomorrow?"},
            ]},
        ],
    )  # fmt: skip

    def call(i, name, args):
        return {"id": i, "type": "function", "function": {"name": name, "arguments": args}}

    assert chat["messages"] == [
        {"role": "system", "content": "Be brief.\nUse tools."},
        {"role": "user", "content": "Weather in Oslo?"},
        {
            "role": "assistant",
            "content": "Looking.",
            "tool_calls": [
                call("t1", "weather", json.dumps({"city": "Oslo"})),
                call("t2", "time", "{}"),
            ],
        },
        {"role": "tool", "tool_call_id": "t1", "content": "sunny"},
        {"role": "tool", "tool_call_id": "t2", "content": "Error: down"},
        {"role": "user", "content": "And tomorrow?"},
    ]


def test_an_image_is_passed_as_chat_takes_it():
    image = {
        "type": "image",
        "source": {"type": "base64", "media_type": "image/png", "data": "AAAA"},
    }
    chat = translate(
        messages=[{"role": "user", "content": [image, {"type": "text", "text": "What?"}]}]
    )
    assert chat["messages"][0]["content"] == [
        {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}},
        {"type": "text", "text": "What?"},
    ]


def test_sampling_stops_tools_and_their_choice_are_chat_fields():
    tool = {"name": "weather", "description": "Now.", "input_schema": {"type": "object"}, "cache_control": {"type": "ephemeral"}}  # fmt: skip
    chat = translate(
        messages=[{"role": "user", "content": "Hi"}],
        temperature=0.3,
        top_p=0.8,
        top_k=40,
        stop_sequences=["END"],
        tools=[tool],
        tool_choice={"type": "tool", "name": "weather", "disable_parallel_tool_use": True},
        metadata={"user_id": "u-1"},
        thinking={"type": "enabled", "budget_tokens": 1024},
    )
    assert chat["tools"] == [
        {
            "type": "function",
            "function": {
                "name": "weather",
                "parameters": {"type": "object"},
                "description": "Now.",
            },
        }
    ]
    assert chat["tool_choice"] == {"type": "function", "function": {"name": "weather"}}
    assert (chat["parallel_tool_calls"], chat["stop"], chat["user"]) == (False, ["END"], "u-1")
    assert (chat["temperature"], chat["top_p"], chat["top_k"]) == (0.3, 0.8, 40)


@pytest.mark.parametrize(
    ("choice", "expected"), [("auto", "auto"), ("any", "required"), ("none", "none")]
)
def test_tool_choice_types_are_chats(choice, expected):
    chat = translate(messages=[{"role": "user", "content": "Hi"}], tool_choice={"type": choice})
    assert chat["tool_choice"] == expected


def test_a_json_schema_output_is_the_response_format():
    fmt = {"type": "json_schema", "schema": {"type": "object"}}
    chat = translate(messages=[{"role": "user", "content": "Hi"}], output_config={"format": fmt})
    assert chat["response_format"] == {"type": "json_schema", "json_schema": {"name": "output", "schema": {"type": "object"}}}  # fmt: skip


def test_a_stream_asks_the_engine_for_its_usage():
    chat = translate(messages=[{"role": "user", "content": "Hi"}], stream=True)
    assert (chat["stream"], chat["stream_options"]) == (True, {"include_usage": True})


HI = [{"role": "user", "content": "Hi"}]


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"max_tokens": None, "messages": HI}, "max_tokens"),
        ({"max_tokens": 0, "messages": HI}, "max_tokens"),
        ({"max_tokens": "9", "messages": HI}, "max_tokens"),
        ({"messages": []}, "messages"),
        ({"messages": "Hi"}, "messages"),
        ({}, "messages"),
        ({"messages": HI, "model": None}, "model"),
        ({"messages": HI, "n": 2}, "n"),
        ({"messages": [{"role": "system", "content": "x"}]}, "messages[0].role"),
        ({"messages": [{"role": "user", "content": 5}]}, "messages[0].content"),
        ({"messages": [{"role": "user", "content": "x", "name": "y"}]}, "messages[0].name"),
        (
            {"messages": [{"role": "user", "content": [{"type": "document", "source": {}}]}]},
            "messages[0].content[0].type",
        ),
        (
            {
                "messages": [
                    {
                        "role": "user",
                        "content": [{"type": "image", "source": {"type": "file", "file_id": "f"}}],
                    }
                ]
            },
            "messages[0].content[0].source.type",
        ),
        (
            {"messages": [{"role": "user", "content": [{"type": "text"}]}]},
            "messages[0].content[0].text",
        ),
        (
            {"messages": [{"role": "user", "content": [{"type": "tool_result", "content": "x"}]}]},
            "messages[0].content[0].tool_use_id",
        ),
        (
            {
                "messages": [
                    {
                        "role": "user",
                        "content": [
                            {
                                "type": "tool_result",
                                "tool_use_id": "t",
                                "content": [{"type": "image"}],
                            }
                        ],
                    }
                ]
            },
            "messages[0].content[0].content[0].type",
        ),
        (
            {
                "messages": [
                    {
                        "role": "assistant",
                        "content": [{"type": "tool_use", "id": "t", "name": "f", "input": "x"}],
                    }
                ]
            },
            "messages[0].content[0].input",
        ),
        (
            {"messages": [{"role": "assistant", "content": [{"type": "image", "source": {}}]}]},
            "messages[0].content[0].type",
        ),
        ({"messages": HI, "system": [{"type": "image"}]}, "system[0].type"),
        ({"messages": HI, "system": 3}, "system"),
        ({"messages": HI, "temperature": 1.5}, "temperature"),
        ({"messages": HI, "top_k": -1}, "top_k"),
        ({"messages": HI, "stop_sequences": "END"}, "stop_sequences"),
        ({"messages": HI, "stop_sequences": [1]}, "stop_sequences[0]"),
        ({"messages": HI, "stream": 1}, "stream"),
        (
            {"messages": HI, "tools": [{"type": "web_search_20250305", "name": "web_search"}]},
            "tools[0].type",
        ),
        ({"messages": HI, "tools": [{"name": "f"}]}, "tools[0].input_schema"),
        ({"messages": HI, "tool_choice": {"type": "required"}}, "tool_choice.type"),
        ({"messages": HI, "tool_choice": {"type": "tool"}}, "tool_choice.name"),
        ({"messages": HI, "metadata": {"user_id": 5}}, "metadata.user_id"),
        ({"messages": HI, "thinking": {"type": "sometimes"}}, "thinking.type"),
        (
            {"messages": HI, "output_config": {"format": {"type": "json_schema"}}},
            "output_config.format.schema",
        ),
    ],
)
def test_a_body_the_translation_cannot_honour_is_a_400_naming_its_field(body, param):
    with pytest.raises(Refused) as refused:
        messages_request({"model": "smol", "max_tokens": 64, **body})
    assert (refused.value.status, refused.value.param) == (400, param)
    assert f"'{param}'" in refused.value.message


REQUEST = {"model": "smol", "max_tokens": 64, "messages": HI, "stop_sequences": ["END"]}


def test_an_answer_is_a_message_the_sdk_reads():
    message = Message.model_validate(
        message_body(REQUEST, completion("Hello there.", cached=4), rid="r1")
    )
    assert (message.id, message.type, message.role, message.model) == (
        "msg_r1",
        "message",
        "assistant",
        "smol",
    )
    assert [b.text for b in message.content] == ["Hello there."]
    assert (message.stop_reason, message.stop_sequence) == ("end_turn", None)
    usage = message.usage
    assert (usage.input_tokens, usage.cache_read_input_tokens, usage.output_tokens) == (8, 4, 5)


def test_tool_calls_are_tool_use_blocks_after_the_text():
    answer = completion("Looking.", calls=(("c1", "weather", '{"city":"Oslo"}'), ("c2", "f", "not json")), finish="tool_calls")  # fmt: skip
    message = Message.model_validate(message_body(REQUEST, answer, rid="r1"))
    text, call, slip = message.content
    assert (text.text, message.stop_reason) == ("Looking.", "tool_use")
    assert (call.id, call.name, call.input) == ("c1", "weather", {"city": "Oslo"})
    assert slip.input == {"arguments": "not json"}


@pytest.mark.parametrize(
    ("finish", "choice", "expected"),
    [
        ("length", {}, ("max_tokens", None)),
        ("content_filter", {}, ("refusal", None)),
        ("stop", {"stop_reason": "END"}, ("stop_sequence", "END")),
        ("stop", {"stop_reason": 2}, ("end_turn", None)),  # vLLM's EOS token id
        ("stop", {"stop_reason": "OTHER"}, ("end_turn", None)),
    ],
)
def test_why_an_answer_stopped_is_the_messages_stop_reason(finish, choice, expected):
    body = message_body(REQUEST, completion(finish=finish, **choice), rid="r1")
    assert (body["stop_reason"], body["stop_sequence"]) == expected


@pytest.mark.parametrize("answer", [{}, {"choices": [None]}, completion(None, usage=(0, 0))])
def test_an_empty_or_malformed_answer_is_still_a_message(answer):
    assert Message.model_validate(message_body(REQUEST, answer, rid="r1")).content == []


def stream(request: dict, engine_chunks: list[dict]) -> list[dict]:
    translator = MessagesStream(request, rid="r1")
    events = translator.start()
    for chunk in engine_chunks:
        events += translator.feed(chunk)
    return events + translator.close()


def accumulated(events: list[dict]) -> Message:
    """The events through the anthropic SDK's own accumulator, as `messages.stream()` reads
    them into its final message."""
    snapshot, buffers = None, {}
    for event in events:
        parsed = EVENT.validate_python(event)
        snapshot = accumulate_event(event=parsed, current_snapshot=snapshot, json_bufs=buffers)
    return Message.model_validate(snapshot.model_dump())


def test_a_stream_is_the_messages_events_in_order():
    events = stream(REQUEST, chunks(["Hel", "lo"]))
    assert [e["type"] for e in events] == [
        "message_start",
        "content_block_start",
        "content_block_delta",
        "content_block_delta",
        "content_block_stop",
        "message_delta",
        "message_stop",
    ]
    message = accumulated(events)
    assert message.content[0].text == "Hello" and message.stop_reason == "end_turn"
    assert (message.usage.input_tokens, message.usage.output_tokens) == (12, 5)


def test_a_streamed_answer_ends_as_the_whole_answer_does():
    calls = (("c1", "weather", ['{"city"', ':"Oslo"}']), ("c2", "time", []))
    events = stream(REQUEST, chunks(["Look", "ing."], calls=calls, finish="tool_calls"))
    whole = completion("Looking.", calls=(("c1", "weather", '{"city":"Oslo"}'), ("c2", "time", "")), finish="tool_calls")  # fmt: skip
    assert accumulated(events) == Message.model_validate(message_body(REQUEST, whole, rid="r1"))
    deltas = [e["delta"]["type"] for e in events if e["type"] == "content_block_delta"]
    assert deltas == ["text_delta", "text_delta", "input_json_delta", "input_json_delta"]


def test_an_engine_error_mid_stream_is_an_error_event_and_nothing_follows():
    translator = MessagesStream(REQUEST, rid="r1")
    events = translator.start() + translator.feed(chunks(["Hel"])[1])
    events += translator.feed(
        {"error": {"message": "The replica went away.", "code": "upstream_cut"}}
    )
    assert events[-1] == {
        "type": "error",
        "error": {"type": "api_error", "message": "The replica went away."},
    }
    assert translator.feed(chunks()[2]) == [] and translator.close() == []


@settings(max_examples=60, deadline=None)
@given(st.lists(st.text(min_size=1, max_size=8), max_size=12))
def test_any_text_streamed_in_deltas_joins_to_the_whole_answers_text(pieces):
    events = stream(REQUEST, chunks(pieces))
    deltas = "".join(e["delta"]["text"] for e in events if e["type"] == "content_block_delta")
    content = accumulated(events).content
    assert deltas == "".join(pieces) == "".join(b.text for b in content)


@pytest.mark.parametrize(
    ("refused", "kind"),
    [
        (bad_request("'messages' must not be empty."), "invalid_request_error"),
        (no_key(), "authentication_error"),
        (unknown_model("gpt-9"), "not_found_error"),
    ],
)
def test_the_gateways_refusals_keep_their_words_in_anthropics_shape(refused, kind):
    body = anthropic_error(refused.status, refused.body(), rid="req-1")
    error = BetaErrorResponse.model_validate(body)
    assert (error.type, error.error.type, error.error.message) == ("error", kind, refused.message)
    assert error.request_id == "req-1"


@pytest.mark.parametrize(
    ("status", "body", "kind"),
    [
        (
            429,
            {"error": {"message": "Slow down.", "type": "requests", "code": "rate_limit_exceeded"}},
            "rate_limit_error",
        ),
        (503, {"error": {"message": "Loading.", "code": "model_loading"}}, "overloaded_error"),
        (504, b'{"error": {"message": "Too slow."}}', "timeout_error"),
        (502, b"<html>Bad gateway</html>", "api_error"),
        (413, b"", "invalid_request_error"),
        (422, {"detail": "no"}, "invalid_request_error"),
    ],
)
def test_any_error_is_anthropics_shape_with_a_type_for_its_status(status, body, kind):
    error = BetaErrorResponse.model_validate(anthropic_error(status, body))
    assert error.error.type == kind and error.error.message


def test_an_engines_words_are_kept_when_its_error_is_not_json():
    assert (
        anthropic_error(502, b"<html>Bad gateway</html>\n")["error"]["message"]
        == "<html>Bad gateway</html>"
    )


JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=6),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3)
    ),
    max_leaves=12,
)
FIELDS = st.sampled_from(
    ["system", "tools", "tool_choice", "stop_sequences", "temperature", "top_k", "stream", "metadata", "thinking", "output_config"]
)  # fmt: skip
BLOCK_FIELDS = st.sampled_from(["type", "text", "id", "name", "input", "tool_use_id", "content", "source", "is_error"])  # fmt: skip


@settings(max_examples=300, deadline=None)
@given(
    st.dictionaries(FIELDS, JSON, max_size=4),
    st.sampled_from(["user", "assistant"]),
    st.lists(st.dictionaries(BLOCK_FIELDS, JSON | st.sampled_from(["text", "tool_use", "tool_result", "image"]), max_size=4), max_size=3),
)  # fmt: skip
def test_no_body_makes_the_translation_raise_anything_but_a_400(body, role, blocks):
    messages = [{"role": role, "content": blocks}]
    try:
        messages_request({"model": "smol", "max_tokens": 8, "messages": messages, **body})
    except Refused as refused:
        assert refused.status == 400 and refused.param
