"""The Responses and Messages APIs end to end: the official `openai` client's
`responses.create` (whole and streamed) and the `anthropic` client's `messages.create` and
`messages.stream` against a real `llmgw serve`, with an agent running sim engines. What the
sim engine wrote comes back in each API's shape, and the usage is counted per key as a chat
request's is (GET /usage). The same through a real llama-server: test_dialects_llamacpp.py.
"""

from __future__ import annotations

import itertools

import anthropic
import openai
import pytest

from llmgw.simengine import chat_prompt, generate_words

from .conftest import MODES
from .harness import TALK, Cluster, gateway_key, gateway_project, wait_for

MODEL = TALK
QUESTION = "What is the capital of France?"
SYSTEM = "Be brief."


def sim_text(*contents: str, n: int) -> str:
    """What a sim engine writes for a chat of these messages' contents, `n` words."""
    prompt = chat_prompt({"messages": [{"role": "user", "content": c} for c in contents]})
    return " ".join(itertools.islice(generate_words(prompt), n))


@pytest.fixture(scope="module", params=MODES)
def site(request, tmp_path_factory):
    """A control plane, one agent with simulated H100s, the model ready: (cluster, key)."""
    cluster = Cluster(
        tmp_path_factory.mktemp(f"dialects-{request.param}"),
        production=request.param == "production",
    )
    try:
        cluster.start_server()
        cluster.start_agent("gpu-a", "--simulate-gpus", "2xh100-80g", port_range="34000-34099")
        wait_for("a ready node", lambda: [n["state"] for n in cluster.get("/nodes")] == ["ready"])
        cluster.post("/models", MODEL)
        wait_for("a ready replica", lambda: cluster.ready_replicas("talk"))
        key = gateway_key(cluster, gateway_project(cluster, "dialects"), "dialects")
        yield cluster, key
    finally:
        cluster.close()


def test_both_apis_answer_with_the_engines_words_and_count_their_usage(site):
    cluster, key = site
    gpt = openai.OpenAI(
        base_url=f"{cluster.url}/v1", api_key=key["secret"], max_retries=0, timeout=30
    )
    claude = anthropic.Anthropic(
        base_url=cluster.url, api_key=key["secret"], max_retries=0, timeout=30
    )
    response = gpt.responses.create(
        model="talk", input=QUESTION, instructions=SYSTEM, max_output_tokens=5
    )
    assert response.output_text == sim_text(SYSTEM, QUESTION, n=5)
    assert response.usage.output_tokens == 5

    events = list(
        gpt.responses.create(model="talk", input=QUESTION, max_output_tokens=4, stream=True)
    )
    assert events[0].type == "response.created"
    deltas = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert deltas == sim_text(QUESTION, n=4) == events[-1].response.output_text
    assert events[-1].response.usage.output_tokens == 4

    ask = {"model": "talk", "messages": [{"role": "user", "content": QUESTION}]}
    message = claude.messages.create(**ask, max_tokens=6, system=SYSTEM)
    assert message.content[0].text == sim_text(SYSTEM, QUESTION, n=6)
    assert message.usage.output_tokens == 6

    with claude.messages.stream(**ask, max_tokens=3) as stream:
        text = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert text == sim_text(QUESTION, n=3) == final.content[0].text
    assert final.usage.output_tokens == 3

    prompt = (
        response.usage.input_tokens
        + events[-1].response.usage.input_tokens
        # Anthropic counts what the engine's prefix cache read apart from input_tokens.
        + message.usage.input_tokens
        + message.usage.cache_read_input_tokens
        + final.usage.input_tokens
        + final.usage.cache_read_input_tokens
    )

    def recorded() -> list[int] | None:
        rows = [r for r in cluster.get("/usage", by="key")["rows"] if r["key_id"] == key["id"]]
        if not rows or rows[0]["requests"] != 4:
            return None
        return [rows[0][f] for f in ("requests", "errors", "prompt_tokens", "completion_tokens")]

    assert wait_for("the usage to be written", recorded, timeout=15) == [4, 0, prompt, 18]


def test_the_gateways_refusals_come_in_each_apis_shape(site):
    cluster, key = site
    claude = anthropic.Anthropic(base_url=cluster.url, api_key="llmgw_key_wrong", max_retries=0)
    with pytest.raises(anthropic.AuthenticationError) as refused:
        claude.messages.create(
            model="talk", max_tokens=2, messages=[{"role": "user", "content": "hi"}]
        )
    assert refused.value.body["error"]["type"] == "authentication_error"
    gpt = openai.OpenAI(base_url=f"{cluster.url}/v1", api_key=key["secret"], max_retries=0)
    with pytest.raises(openai.BadRequestError) as refused:
        gpt.responses.create(model="talk", input="hi", previous_response_id="resp_1")
    assert "stateless" in refused.value.message
