"""The Responses and Messages APIs through a real engine that serves neither: llama-server
with SmolLM2-135M-Instruct (test_llamacpp.py's site: a real `llmgw serve`, a CPU node's
agent, the model fetched through the mirror), asked the capital of France with the official
`openai` and `anthropic` clients, whole and streamed. The gateway translates each to chat
completions and back; the answer must say Paris. Skipped without a llama-server, as
test_llamacpp.py is (failed in CI)."""

from __future__ import annotations

import anthropic
import openai

from . import test_llamacpp as llamacpp

# The site, its engine and its weights, as test_llamacpp.py makes them (its fixtures).
MODEL = llamacpp.MODEL
weights = llamacpp.weights  # llama_server_binary: tests/e2e/conftest.py
llamacpp_model, site = llamacpp.llamacpp_model, llamacpp.site

QUESTION = "What is the capital of France?"
# As test_llamacpp.py says: without a plain system message of its own, SmolLM2 answers
# this in French verse.
SYSTEM = "You are a helpful assistant."


def test_the_capital_of_france_through_the_responses_api(site):
    cluster, _, key = site
    client = openai.OpenAI(
        base_url=f"{cluster.url}/v1", api_key=key["secret"], max_retries=0, timeout=120
    )
    ask = {
        "model": MODEL,
        "input": QUESTION,
        "instructions": SYSTEM,
        "max_output_tokens": 32,
        "temperature": 0,
    }
    response = client.responses.create(**ask)
    assert "Paris" in response.output_text, response.output_text
    assert response.usage.input_tokens > 0 and 0 < response.usage.output_tokens <= 32

    events = list(client.responses.create(**ask, stream=True))
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert "Paris" in text, text
    assert events[-1].response.output_text == text


def test_the_capital_of_france_through_the_messages_api(site):
    cluster, _, key = site
    client = anthropic.Anthropic(
        base_url=cluster.url, api_key=key["secret"], max_retries=0, timeout=120
    )
    ask = {
        "model": MODEL,
        "system": SYSTEM,
        "messages": [{"role": "user", "content": QUESTION}],
        "max_tokens": 32,
        # This SDK no longer takes `temperature` as an argument; the API still does.
        "extra_body": {"temperature": 0},
    }
    message = client.messages.create(**ask)
    text = "".join(block.text for block in message.content if block.type == "text")
    assert "Paris" in text, text
    assert message.usage.output_tokens > 0

    with client.messages.stream(**ask) as stream:
        streamed = "".join(stream.text_stream)
    assert "Paris" in streamed, streamed
