"""What a request used, however it ended: the engine's figures, or counted and estimated
ones for a request cut before they came."""

from __future__ import annotations

import pytest

from llmgw.gateway.accounting import tokens_used
from llmgw.gateway.state import Request
from llmgw.gateway.tables import Key

KEY = Key(7, "ci", "llmgw_key_Ab12", 3, ("project:3",), None, None, None)


def request(*, stream: bool = False, events: int = 0, abandoned: bool = False) -> Request:
    req = Request(KEY, "chat", "/v1/chat/completions", {}, b"", stream, False, 0.0)
    req.estimate, req.reserved = 25, 125  # a prompt of about 25 tokens, 100 asked for
    req.events, req.abandoned = events, abandoned
    return req


ENGINE = {
    "prompt_tokens": 20,
    "completion_tokens": 30,
    "prompt_tokens_details": {"cached_tokens": 8},
}


@pytest.mark.parametrize(
    ("req", "usage", "used"),
    [
        # (prompt, completion, cached, estimated)
        (request(), ENGINE, (20, 30, 8, 0)),  # the engine's figures, whenever they came
        (request(stream=True, events=12, abandoned=True), ENGINE, (20, 30, 8, 0)),
        # A stream cut before its usage: an event a token, the prompt estimated.
        (request(stream=True, events=12), None, (25, 12, 0, 25)),
        (request(stream=True, events=12, abandoned=True), None, (25, 12, 0, 25)),
        # Cut before its first event: the engine read the prompt and wrote nothing passed on.
        (request(stream=True, abandoned=True), None, (25, 0, 0, 25)),
        # A whole answer cut before it came: what it reserved, all estimated.
        (request(abandoned=True), None, (25, 100, 0, 125)),
        # Refused before an engine, or refused by one: nothing used.
        (request(), None, (0, 0, 0, 0)),
        # Figures that are not counts are none.
        (request(), {"prompt_tokens": -1, "completion_tokens": "7"}, (0, 0, 0, 0)),
    ],
)
def test_a_requests_tokens_come_from_the_engine_or_from_what_was_passed_on_and_reserved(
    req, usage, used
):
    assert tokens_used(req, usage) == used
