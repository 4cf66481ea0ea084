"""The openai and anthropic SDKs themselves against the translations, over an in-memory
transport that does what the endpoints will (translate the body, answer from a canned
engine, translate back): the bodies the SDKs really send are accepted, and what comes back
is read by their own parsers, whole and streamed, errors included."""

from __future__ import annotations

import json

import anthropic
import httpx
import httpx2
import openai
import pytest
from pydantic import BaseModel

from llmgw.gateway.answers import Refused
from llmgw.gateway.dialects.messages import (
    MessagesStream,
    anthropic_error,
    message_body,
    messages_request,
)
from llmgw.gateway.dialects.responses import ResponsesStream, response_body, responses_request
from llmgw.gateway.dialects.sse import sse
from tests.gateway.chat_answers import chunks, completion

SSE = {"content-type": "text/event-stream"}
JSON = {"content-type": "application/json"}
CALL = (("c1", "weather", '{"city":"Oslo"}'),)
STREAMED_CALL = (("c1", "weather", ['{"city"', ':"Oslo"}']),)


class Engine:
    """Answers /v1/responses and /v1/messages as the gateway will for an engine that serves
    only chat completions; keeps the chat bodies the translations made."""

    def __init__(self, text: str = "Hello there.", calls=(), streamed_calls=()) -> None:
        self.text, self.calls, self.streamed_calls = text, calls, streamed_calls
        self.finish = "tool_calls" if calls else "stop"
        self.sent: list[dict] = []

    def __call__(self, path: str, content: bytes) -> tuple[int, bytes, dict]:
        """(status, body, headers) for a request's path and body."""
        body = json.loads(content)
        anthropic_api = path == "/v1/messages"
        try:
            chat = (messages_request if anthropic_api else responses_request)(body)
        except Refused as refused:
            error = (
                anthropic_error(refused.status, refused.body())
                if anthropic_api
                else json.loads(refused.body())
            )
            return refused.status, json.dumps(error).encode(), JSON
        self.sent.append(chat)
        if chat.get("stream"):
            stream = (
                MessagesStream(body, rid="r1")
                if anthropic_api
                else ResponsesStream(body, rid="r1", now=1.0)
            )
            pieces = [self.text[:3], self.text[3:]]
            events = stream.start()
            for chunk in chunks(pieces, calls=self.streamed_calls, finish=self.finish):
                events += stream.feed(chunk)
            events += stream.close()
            return 200, b"".join(sse(e) for e in events), SSE
        answer = completion(self.text, calls=self.calls, finish=self.finish)
        if anthropic_api:
            return 200, json.dumps(message_body(body, answer, rid="r1")).encode(), JSON
        return 200, json.dumps(response_body(body, answer, rid="r1", now=1.0)).encode(), JSON


def openai_client(engine: Engine) -> openai.OpenAI:
    def handle(request: httpx.Request) -> httpx.Response:
        status, content, headers = engine(request.url.path, request.content)
        return httpx.Response(status, content=content, headers=headers)

    http = httpx.Client(transport=httpx.MockTransport(handle))
    return openai.OpenAI(api_key="k", base_url="http://gw/v1", http_client=http, max_retries=0)


def anthropic_client(engine: Engine) -> anthropic.Anthropic:
    # This anthropic SDK speaks httpx2, which takes the same transports as httpx.
    def handle(request: httpx2.Request) -> httpx2.Response:
        status, content, headers = engine(request.url.path, request.content)
        return httpx2.Response(status, content=content, headers=headers)

    http = httpx2.Client(transport=httpx2.MockTransport(handle))
    return anthropic.Anthropic(api_key="k", base_url="http://gw", http_client=http, max_retries=0)


WEATHER = {"type": "function", "name": "weather", "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}  # fmt: skip


def test_openais_responses_create_reads_the_answer():
    engine = Engine()
    response = openai_client(engine).responses.create(
        model="smol", input="Hi", instructions="Be brief.", max_output_tokens=32, temperature=0.1
    )
    assert response.output_text == "Hello there." and response.usage.total_tokens == 17
    assert engine.sent[0]["messages"][0] == {"role": "system", "content": "Be brief."}


def test_openais_responses_stream_reads_the_events_into_the_answer():
    engine = Engine(streamed_calls=STREAMED_CALL, calls=CALL)
    client = openai_client(engine)
    with client.responses.stream(model="smol", input="Weather in Oslo?", tools=[WEATHER]) as stream:
        deltas = [e.delta for e in stream if e.type == "response.output_text.delta"]
        final = stream.get_final_response()
    assert "".join(deltas) == final.output_text == "Hello there."
    assert final.output[1].arguments == '{"city":"Oslo"}'


def test_openais_streamed_create_yields_typed_events():
    events = list(openai_client(Engine()).responses.create(model="smol", input="Hi", stream=True))
    assert events[0].type == "response.created" and events[-1].type == "response.completed"


def test_openais_client_reads_a_refusal_as_a_bad_request():
    with pytest.raises(openai.BadRequestError) as error:
        openai_client(Engine()).responses.create(
            model="smol", input="Hi", previous_response_id="resp_1"
        )
    assert "stateless" in error.value.message and error.value.param == "previous_response_id"


def test_anthropics_messages_create_reads_the_answer():
    engine = Engine(calls=CALL)
    message = anthropic_client(engine).messages.create(
        model="smol",
        max_tokens=32,
        system="Be brief.",
        messages=[{"role": "user", "content": "Weather in Oslo?"}],
        tools=[{"name": "weather", "input_schema": {"type": "object"}}],
    )
    assert message.content[1].input == {"city": "Oslo"} and message.stop_reason == "tool_use"
    assert engine.sent[0]["tools"][0]["function"]["name"] == "weather"


def test_anthropics_messages_stream_reads_the_events_into_the_answer():
    engine = Engine(streamed_calls=STREAMED_CALL, calls=CALL)
    client = anthropic_client(engine)
    with client.messages.stream(
        model="smol", max_tokens=32, messages=[{"role": "user", "content": "Weather?"}]
    ) as stream:
        text = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert text == final.content[0].text == "Hello there."
    assert final.content[1].input == {"city": "Oslo"} and final.usage.output_tokens == 5


def test_anthropics_client_reads_a_refusal_in_its_own_shape():
    with pytest.raises(anthropic.BadRequestError) as error:
        anthropic_client(Engine()).messages.create(
            model="smol", max_tokens=32, messages=[{"role": "system", "content": "x"}]
        )
    assert error.value.body["error"]["type"] == "invalid_request_error"
    assert "'messages[0].role'" in error.value.message


def test_openais_responses_parse_asks_for_its_schema_and_reads_the_object():
    class Colour(BaseModel):
        name: str

    engine = Engine(text='{"name": "red"}')
    response = openai_client(engine).responses.parse(
        model="smol", input="A colour?", text_format=Colour
    )
    assert response.output_parsed == Colour(name="red")
    sent = engine.sent[0]["response_format"]
    assert sent["type"] == "json_schema" and sent["json_schema"]["name"] == "Colour"
    assert sent["json_schema"]["strict"] is True
