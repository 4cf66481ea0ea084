"""The clients teams use, through a real `llmgw serve` with an agent running sim engines: the
official `openai` SDK (sync and async), LangChain's `ChatOpenAI`, LiteLLM's `completion`,
LlamaIndex's `OpenAILike` and `instructor`. Each one's chat call, whole and streamed where the
client has it, comes back with the sim engine's words, and with the request's id
(`x-request-id`) and usage where the client shows them.

LlamaIndex's OpenAILike and instructor declare pins (openai<3; jiter<0.15) that cannot be
resolved beside the `openai` llmgw's tests use, so they are not dev dependencies
(pyproject.toml) and their tests are skipped where they are not installed; installed by hand,
both work with it. The sim engine writes words, never JSON: instructor is tested up to its
validation (docstring of its test).
"""

from __future__ import annotations

import asyncio
import copy
import itertools
import os
import re
from datetime import datetime

import openai
import pytest
from pydantic import BaseModel

from llmgw.simengine import SimConfig, chat_prompt, generate_words

from .harness import TALK, Cluster, gateway_key, gateway_project, wait_for

# LiteLLM fetches its price list from GitHub at import unless told to read its own copy.
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

MODEL = TALK
QUESTION = "What is the capital of France?"
ASK = [{"role": "user", "content": QUESTION}]
REQUEST_ID = re.compile(r"req_[0-9a-f]{24}")


def sim_text(messages: list[dict], n: int) -> str:
    """What a sim engine writes for a chat of these messages, `n` words."""
    return " ".join(itertools.islice(generate_words(chat_prompt({"messages": messages})), n))


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    """A control plane, one agent with simulated H100s, the model ready: (base URL, secret)."""
    cluster = Cluster(tmp_path_factory.mktemp("clients"), production=False)
    try:
        cluster.start_server()
        cluster.start_agent("gpu-a", "--simulate-gpus", "1xh100-80g", port_range="34100-34199")
        wait_for("a ready node", lambda: [n["state"] for n in cluster.get("/nodes")] == ["ready"])
        cluster.post("/models", MODEL)
        wait_for("a ready replica", lambda: cluster.ready_replicas("talk"))
        key = gateway_key(cluster, gateway_project(cluster, "clients"), "clients")
        yield f"{cluster.url}/v1", key["secret"]
    finally:
        cluster.close()


def test_openai_sync_whole_streamed_and_models(site):
    base, secret = site
    client = openai.OpenAI(base_url=base, api_key=secret, max_retries=0, timeout=30)
    answer = client.chat.completions.create(model="talk", messages=ASK, max_tokens=5)
    assert answer.choices[0].message.content == sim_text(ASK, 5)
    assert REQUEST_ID.fullmatch(answer._request_id)
    assert (answer.usage.prompt_tokens, answer.usage.completion_tokens) == (6, 5)

    stream = client.chat.completions.create(
        model="talk",
        messages=ASK,
        max_tokens=4,
        stream=True,
        stream_options={"include_usage": True},
    )
    assert REQUEST_ID.fullmatch(stream.response.headers["x-request-id"])
    chunks = list(stream)
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == sim_text(
        ASK, 4
    )
    assert chunks[-1].usage.completion_tokens == 4

    models = sorted(client.models.list(), key=lambda m: m.created)
    assert [m.id for m in models] == ["talk"]
    assert datetime.fromtimestamp(models[0].created).year >= 2024
    assert models[0].owned_by == "llmgw"


def test_openai_async_whole_and_streamed(site):
    base, secret = site

    async def ask() -> tuple:
        client = openai.AsyncOpenAI(base_url=base, api_key=secret, max_retries=0, timeout=30)
        answer = await client.chat.completions.create(model="talk", messages=ASK, max_tokens=3)
        stream = await client.chat.completions.create(
            model="talk", messages=ASK, max_tokens=2, stream=True
        )
        text = "".join([c.choices[0].delta.content or "" async for c in stream if c.choices])
        await client.close()
        return answer, stream.response.headers["x-request-id"], text

    answer, streamed_id, text = asyncio.run(ask())
    assert answer.choices[0].message.content == sim_text(ASK, 3)
    assert REQUEST_ID.fullmatch(answer._request_id)
    assert answer.usage.completion_tokens == 3
    assert REQUEST_ID.fullmatch(streamed_id)
    assert text == sim_text(ASK, 2)


def test_langchain_chat_openai(site):
    langchain_openai = pytest.importorskip("langchain_openai")
    base, secret = site
    llm = langchain_openai.ChatOpenAI(
        model="talk",
        base_url=base,
        api_key=secret,
        max_tokens=5,
        max_retries=0,
        timeout=30,
        include_response_headers=True,
        stream_usage=True,
    )
    message = llm.invoke(QUESTION)
    assert message.content == sim_text(ASK, 5)
    assert REQUEST_ID.fullmatch(message.response_metadata["headers"]["x-request-id"])
    assert message.usage_metadata["input_tokens"] == 6
    assert message.usage_metadata["output_tokens"] == 5

    chunks = list(llm.stream(QUESTION))
    assert "".join(c.content for c in chunks) == sim_text(ASK, 5)
    assert sum((c.usage_metadata or {}).get("output_tokens", 0) for c in chunks) == 5


def test_litellm_completion(site):
    litellm = pytest.importorskip("litellm")
    base, secret = site
    ask = {"model": "openai/talk", "api_base": base, "api_key": secret, "messages": ASK}
    answer = litellm.completion(**ask, max_tokens=5, num_retries=0, timeout=30)
    assert answer.choices[0].message.content == sim_text(ASK, 5)
    assert (answer.usage.prompt_tokens, answer.usage.completion_tokens) == (6, 5)
    headers = answer._hidden_params["additional_headers"]
    assert REQUEST_ID.fullmatch(headers["llm_provider-x-request-id"])

    chunks = list(
        litellm.completion(
            **ask, max_tokens=4, stream=True, stream_options={"include_usage": True}, timeout=30
        )
    )
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == sim_text(
        ASK, 4
    )
    assert [c.usage.completion_tokens for c in chunks if getattr(c, "usage", None)][-1] == 4


def test_llamaindex_openai_like(site):
    openai_like = pytest.importorskip("llama_index.llms.openai_like")
    from llama_index.core.llms import ChatMessage

    base, secret = site
    llm = openai_like.OpenAILike(
        model="talk",
        api_base=base,
        api_key=secret,
        is_chat_model=True,
        max_tokens=5,
        max_retries=0,
        timeout=30,
    )
    messages = [ChatMessage(role="user", content=QUESTION)]
    answer = llm.chat(messages)
    assert answer.message.content == sim_text(ASK, 5)
    assert answer.raw.usage.completion_tokens == 5
    assert REQUEST_ID.fullmatch(answer.raw._request_id)

    deltas = [r.delta for r in llm.stream_chat(messages)]
    assert "".join(d or "" for d in deltas) == sim_text(ASK, 5)


class City(BaseModel):
    name: str
    country: str


def test_instructor_sends_json_mode_and_validates_what_comes_back(site):
    """The sim engine writes words, never JSON, so no model can be extracted: what is tested
    is instructor's path through the gateway (its JSON-mode request answered, the engine's
    words handed to pydantic, the failure reported with the completion and its usage)."""
    instructor = pytest.importorskip("instructor")
    from instructor.core import InstructorRetryException

    base, secret = site
    client = instructor.from_openai(
        openai.OpenAI(base_url=base, api_key=secret, max_retries=0, timeout=30),
        mode=instructor.Mode.JSON,
    )
    sent: list[dict] = []  # each attempt's request, as it was sent (instructor grows one list)
    client.on("completion:kwargs", lambda **kwargs: sent.append(copy.deepcopy(kwargs)))
    with pytest.raises(InstructorRetryException) as failed:
        client.chat.completions.create(
            model="talk", messages=ASK, response_model=City, max_retries=1
        )
    assert [s["response_format"] for s in sent] == [{"type": "json_object"}] * 2
    # The retry told the engine pydantic's complaint about its first answer.
    assert "validation error for City" in sent[1]["messages"][-1]["content"]
    completion = failed.value.last_completion
    # No max_tokens (at that limit instructor gives up before validating): the sim's own.
    words = SimConfig().max_tokens
    assert completion.choices[0].message.content == sim_text(sent[-1]["messages"], words)
    assert completion.choices[0].finish_reason == "stop"
    assert REQUEST_ID.fullmatch(completion._request_id)
    assert failed.value.n_attempts == 2
    assert failed.value.total_usage.completion_tokens == words * 2
