"""`streaming.split_events` over a stream cut anywhere: the bytes passed on are the engine's
own, every event whole, the usage-only event the gateway asked for left out, and the usage
figures exact, however the chunks fall."""

from __future__ import annotations

import json

from hypothesis import given, strategies as st

from llmgw.gateway.streaming import model_named, split_events
from llmgw.gateway.upstream import with_refusal

ENDS = st.sampled_from(["\n\n", "\r\n\r\n", "\r\r"])
TEXT = st.text(st.characters(codec="utf-8", exclude_characters="\r\n"), max_size=12)


@st.composite
def streams(draw):
    """A chat stream's events as an engine asked for usage writes them (each chunk
    `"usage": null`, then the usage-only event, then [DONE]), one line end for all."""
    end = draw(ENDS)
    words = draw(st.lists(TEXT, max_size=8))
    usage = {"prompt_tokens": draw(st.integers(0, 9999)), "completion_tokens": len(words)}
    chunks = [
        {"choices": [{"delta": {"content": w}}], "usage": None, "spaced": draw(st.booleans())}
        for w in words
    ]
    events = [
        "data: " + json.dumps(c, separators=(",", ":") if not c.pop("spaced") else None) + end
        for c in chunks
    ]
    usage_event = "data: " + json.dumps({"choices": [], "usage": usage}) + end
    done = "data: [DONE]" + end
    return events, usage_event, done, usage


def relayed(data: bytes, cuts: list[int], drop: bool) -> tuple[bytes, dict | None, bool]:
    """What the relay passes on for `data` arriving cut at `cuts`, the usage it finds, and
    whether every piece passed on ended at an event's end."""
    out, rest, usage, whole = [], b"", None, True
    at = 0
    for cut in [*sorted(set(cuts)), len(data)]:
        chunk, at = data[at:cut], cut
        if not chunk:
            continue
        passed, rest, found = split_events(rest + chunk, drop)
        usage = found if found is not None else usage
        if passed:
            whole = whole and passed.endswith((b"\n\n", b"\r\r", b"\r\n\r\n"))
            out.append(passed)
    return b"".join(out) + rest, usage, whole and not rest


@given(streams(), st.lists(st.integers(0, 2000), max_size=6), st.booleans())
def test_a_stream_passes_as_it_came_with_its_usage_found_however_it_is_cut(s, cuts, drop):
    events, usage_event, done, usage = s
    data = "".join([*events, usage_event, done]).encode()
    out, found, whole = relayed(data, [c % (len(data) + 1) for c in cuts], drop)
    expected = "".join([*events, *([] if drop else [usage_event]), done]).encode()
    assert out == expected
    assert found == usage
    assert whole


def test_text_about_usage_inside_a_token_is_no_usage():
    event = (
        b'data: {"choices":[{"delta":{"content":"\\"usage\\": {\\"a\\": 1}"}}],"usage":null}\n\n'
    )
    assert split_events(event, drop_usage=True) == (event, b"", None)


def test_a_responses_api_stream_gives_its_completed_usage_as_chat_figures():
    event = (
        b'data: {"type":"response.completed","response":{"usage":'
        b'{"input_tokens":3,"output_tokens":5,"total_tokens":8}}}\n\n'
    )
    out, rest, usage = split_events(event, drop_usage=True)
    assert (out, rest) == (event, b"")
    assert usage["prompt_tokens"] == 3 and usage["completion_tokens"] == 5


MESSAGES = st.fixed_dictionaries(
    {"role": st.just("assistant"), "content": st.one_of(st.none(), TEXT)},
    optional={"tool_calls": st.just([{"id": "c", "function": {"arguments": '{"message": {}}'}}])},
)


@given(st.lists(st.one_of(MESSAGES, st.builds(dict)), min_size=1, max_size=4), st.booleans())
def test_a_refusal_added_to_the_bytes_is_the_one_the_json_would_have(messages, spaced):
    answer = {
        "id": "x",
        "object": "chat.completion",
        "choices": [{"index": i, "message": m} for i, m in enumerate(messages)],
    }
    data = json.dumps(answer, separators=None if spaced else (",", ":")).encode()
    for choice in answer["choices"]:
        choice["message"].setdefault("refusal", None)
    assert json.loads(with_refusal(data)) == answer


@given(
    name=st.from_regex(r"[a-z0-9][a-z0-9._-]{0,20}", fullmatch=True),
    said=st.text(max_size=40),
    spaced=st.booleans(),
)
def test_an_answer_renamed_in_its_bytes_is_the_one_the_json_would_have(name, said, spaced):
    # The engine's own name, and content that talks of "model" in its text: only the member
    # is renamed.
    answer = {
        "id": "c1",
        "model": "smollm2-135m",
        "choices": [{"message": {"content": f'"model":"{said}" {said}'}}],
    }
    raw = json.dumps(answer, separators=None if spaced else (",", ":")).encode()
    assert json.loads(model_named(raw, name, count=1)) == {**answer, "model": name}
    events = b"".join(b"data: " + raw + b"\n\n" for _ in range(3)) + b"data: [DONE]\n\n"
    renamed = model_named(events, name)
    assert renamed.count(json.dumps(name).encode()) >= 3
    for line in renamed.split(b"\n\n")[:3]:
        assert json.loads(line[len(b"data: ") :])["model"] == name
