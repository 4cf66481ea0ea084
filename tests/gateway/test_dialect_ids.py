"""An answer in the Responses or the Messages API is named by its request's id (issue 39,
item 1): `resp_…` and `msg_…` carry the x-request-id the caller was told, whole and
streamed, and either id finds the request's record."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone
from hypothesis import given, strategies as st

from llmgw.core.ids import GENERATED, answer_tail, requests_named
from tenancy.selectors import request_records_find
from tests.gateway.test_dialect_serve import QUESTION, add, anthropic_client, openai_client, secret

__all__ = ["secret"]  # a fixture

SANE = st.from_regex(r"[A-Za-z0-9._:-]{1,128}", fullmatch=True)
GENERATED_IDS = st.from_regex(r"req_[0-9a-f]{24}", fullmatch=True)


@given(request_id=SANE | GENERATED_IDS, prefix=st.sampled_from(("resp_", "msg_")))
def test_an_answers_id_names_its_request(request_id, prefix):
    assert request_id in requests_named(prefix + answer_tail(request_id))


@given(quoted=SANE)
def test_any_id_quoted_names_itself_first(quoted):
    assert requests_named(quoted)[0] == quoted


def test_a_generated_ids_answers_are_written_as_openai_and_anthropic_write_theirs():
    assert answer_tail("req_0123456789abcdef01234567") == "0123456789abcdef01234567"
    assert answer_tail("trace.42") == "trace.42"
    assert requests_named("resp_ab") == ("resp_ab", "req_ab", "ab")
    assert requests_named("resp_") == ("resp_",)
    assert requests_named("req_ab") == ("req_ab",)
    assert GENERATED == "req_"


pytestmark_db = pytest.mark.django_db(transaction=True)


def found(quoted: str) -> list[str]:
    now = timezone.now() + timedelta(seconds=1)
    records = request_records_find(request_id=quoted, keep_hours=1, now=now)["records"]
    return [r["request_id"] for r in records]


@pytestmark_db
async def test_a_responses_id_is_its_requests_and_finds_its_record(world, gateway, secret):
    client = openai_client(gateway, secret)
    raw = await client.responses.with_raw_response.create(
        model="llama", input=QUESTION, max_output_tokens=2
    )
    response, rid = raw.parse(), raw.headers["x-request-id"]
    assert rid.startswith("req_") and response.id == f"resp_{rid[4:]}"
    assert response.output[0].id == f"msg_{rid[4:]}"
    mine = await client.responses.create(
        model="llama", input=QUESTION, max_output_tokens=2, extra_headers={"x-request-id": "t.1"}
    )
    assert mine.id == "resp_t.1"
    await gateway.runtime._flush()
    assert await add(found, response.id) == [rid]
    assert await add(found, mine.id) == ["t.1"]


@pytestmark_db
async def test_a_streamed_responses_events_carry_the_requests_id(world, gateway, secret):
    client = openai_client(gateway, secret)
    stream = await client.responses.create(
        model="llama",
        input=QUESTION,
        max_output_tokens=2,
        stream=True,
        extra_headers={"x-request-id": "s-9"},
    )
    events = [event async for event in stream]
    assert {e.response.id for e in events if hasattr(e, "response")} == {"resp_s-9"}


@pytestmark_db
async def test_a_messages_id_is_its_requests_whole_and_streamed(world, gateway, secret):
    client = anthropic_client(gateway, secret)
    asked = {"model": "llama", "max_tokens": 2, "messages": [{"role": "user", "content": "hi"}]}
    raw = await client.messages.with_raw_response.create(**asked)
    message, rid = await raw.parse(), raw.headers["x-request-id"]
    assert message.id == f"msg_{rid[4:]}"
    async with client.messages.stream(**asked, extra_headers={"x-request-id": "m:2"}) as stream:
        final = await stream.get_final_message()
    assert final.id == "msg_m:2"
    await gateway.runtime._flush()
    assert await add(found, message.id) == [rid]
    assert await add(found, final.id) == ["m:2"]
