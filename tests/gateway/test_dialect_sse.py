"""Reading an engine's chat stream into chunks, however its bytes are cut
(llmgw.gateway.dialects.sse)."""

from __future__ import annotations

import json

from hypothesis import given, settings, strategies as st

from llmgw.gateway.dialects.sse import ChatEvents
from tests.gateway.chat_answers import chunks

ENGINE = chunks(["Hel", "lo ", "wörld"])


def written(newline: bytes = b"\n") -> bytes:
    events = [b"data: " + json.dumps(c).encode() for c in ENGINE] + [b"data: [DONE]"]
    return b"".join(e + newline * 2 for e in events)


def test_the_chunks_come_out_as_the_engine_wrote_them_and_done_is_seen():
    reader = ChatEvents()
    assert reader.feed(written()) == ENGINE and reader.done


def test_crlf_comments_and_what_is_not_json_are_read_as_clients_read_them():
    reader = ChatEvents()
    data = b": keep-alive\r\n\r\n" + written(b"\r\n") + b"data: not json\r\n\r\n"
    assert reader.feed(data) == ENGINE


def test_an_error_event_is_a_chunk_with_its_error():
    cut = (
        b'data: {"error": {"message": "Gone.", "type": "server_error", "code": "upstream_cut"}}\n\n'
    )
    (chunk,) = ChatEvents().feed(cut)
    assert chunk["error"]["code"] == "upstream_cut"


@settings(max_examples=100, deadline=None)
@given(
    st.sampled_from([b"\n", b"\r\n", b"\r"]),
    st.lists(st.integers(min_value=0, max_value=len(written(b"\r\n"))), max_size=10),
)
def test_however_the_bytes_are_cut_the_same_chunks_come_out(newline, cuts):
    data, reader, out, at = written(newline), ChatEvents(), [], 0
    for cut in [*sorted(min(c, len(data)) for c in cuts), len(data)]:
        out += reader.feed(data[at:cut])
        at = cut
    assert out == ENGINE and reader.done and reader.rest == b""
