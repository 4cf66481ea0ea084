"""How an answer's ids name the request they answer (issue 39, item 1): the gateway's own
request ids are `req_` and 24 hex digits (or the caller's own x-request-id); an answer it
writes in the Responses or the Messages API is `resp_…` or `msg_…` with the request's id
after it, less `req_`, as OpenAI and Anthropic write theirs. So the id a client quotes,
whichever it kept, finds the request's record (`tenancy.selectors.request_records_find`)."""

from __future__ import annotations

GENERATED = "req_"  # the gateway's own request ids (llmgw/gateway/answers.py request_id)
# A Response's id, and a message's (the Messages API's answer, a Response's message item).
ANSWER_PREFIXES = ("resp_", "msg_")


def answer_tail(request_id: str) -> str:
    """What follows `resp_` or `msg_` in the ids of the answer to `request_id`."""
    return request_id.removeprefix(GENERATED)


def requests_named(quoted: str) -> tuple[str, ...]:
    """The request ids `quoted` may name: itself, and, for an answer's id, the request id
    it was made from (`req_` and its tail when that tail is a generated one's, the tail
    itself when the caller chose the request's id); the caller's own id may look like an
    answer's, so itself is always among them."""
    for prefix in ANSWER_PREFIXES:
        if quoted.startswith(prefix) and len(quoted) > len(prefix):
            tail = quoted[len(prefix) :]
            return tuple(dict.fromkeys((quoted, GENERATED + tail, tail)))
    return (quoted,)
