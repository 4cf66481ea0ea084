"""LoRA adapters end to end on a real vLLM: a real `llmgw serve`, a real agent running vLLM's
CPU build (`--enable-lora`, two adapter slots) of SmolLM2-135M-Instruct as a Hugging Face
folder, two PEFT adapters the tests write for it (tests/lora_files.py), owned by two teams,
and the official openai client at temperature 0 through the gateway.

Nothing is loaded ahead of time: each adapter's first request has the gateway ask the
replica to load it (the agent's `POST /v1/load_lora_adapter`, vLLM's dynamic loading) and
wait for it. Held to what the model says: each team's key reaches its own adapter and gets
404 for the other's; each adapter answers otherwise than the base and than the other, and
again the same; the base is still itself after them; one replica holds both; usage names
each adapter with the tokens its answers counted.

The vLLM is the one `llmgw engines build vllm` made, found on the agent's PATH (the
install itself is test_vllm_real.py's): without one the test skips, saying how to make
it, and in CI (CI=true), where .ci/run builds it, it fails instead. One replica, answers of
8 tokens: vLLM on two shared cores is slow.
"""

from __future__ import annotations

import contextlib
import os
import time

import openai
import pytest

from tests.lora_files import hf_dims, peft_adapter

from .harness import Cluster, gateway_key, wait_for
from .real_engines import in_ci
from .real_vllm import memory_short_of, smollm2_hf_folder, vllm_program

BASE = "smollm2"
SYSTEM = {"role": "system", "content": "You are a helpful assistant."}
ASK = [SYSTEM, {"role": "user", "content": "Tell me about the sea."}]
TOKENS = 8
# Starting eager on a loaded 2-core machine: minutes.
READY_S = 600.0
# SmolLM2 with vLLM's three processes (about 3.9 GB), and a margin.
NEED_GB = 5.0
# (adapter, team, seed of its weights). Rank 8 on q_proj and v_proj of every layer, at
# twice the default spread: enough to move SmolLM2's first greedy words away from the
# base's and from the other adapter's.
ADAPTERS = (("red-tone", "red", 1), ("blue-tone", "blue", 2))
SPREAD = 0.1


@pytest.fixture(scope="module")
def vllm_build(tmp_path_factory):
    """A folder holding only the cached build's `vllm`, for the agent's PATH."""
    program, why = vllm_program()
    why = why or memory_short_of(NEED_GB)
    if why:
        if in_ci():
            pytest.fail(f"CI must test adapters on a real vLLM, and cannot: {why}.")
        pytest.skip(why)
    folder = tmp_path_factory.mktemp("vllm-bin")
    (folder / "vllm").symlink_to(program)
    return program, folder


def base_model(source) -> dict:
    return {
        "name": BASE,
        "source": str(source),
        "scaling": {"min": 1},
        "profiles": [
            {
                "name": "cpu",
                "engine": "vllm",
                "min_memory_gb": 5,
                "cpu_cores": 1,
                "adapter_slots": 2,
                "args": ["--max-model-len", "1024"],
                "startup_timeout": int(READY_S),
            }
        ],
    }


@pytest.fixture(scope="module")
def site(tmp_path_factory, vllm_build):
    """A control plane with the base and both teams' adapters (local folders on the node),
    one CPU node whose agent finds vLLM on its PATH, the base's replica ready on it:
    (cluster, {team: key secret})."""
    program, bin_folder = vllm_build
    home = tmp_path_factory.mktemp("lora-vllm")
    folder = smollm2_hf_folder(program)
    cluster = Cluster(home, production=False)
    cluster.env["PATH"] = os.pathsep.join([str(bin_folder), cluster.env["PATH"]])
    # A heartbeat may be late by seconds while vLLM computes on a loaded 2-core machine
    # (the llama.cpp adapters test measured it): not a reason to take the node out.
    cluster.env["LLMGW_UNREACHABLE_SECONDS"] = "15"
    cluster.env["LLMGW_LOST_SECONDS"] = "60"
    # An adapter's first request waits for vLLM to load it, seconds on a busy CPU.
    cluster.env["LLMGW_ON_DEMAND_WAIT_SECONDS"] = "240"
    started = time.monotonic()
    try:
        cluster.start_server()
        cluster.post("/models", base_model(folder))
        org = cluster.post("/orgs", {"name": "Acme"})["id"]
        secrets = {}
        for name, team_name, seed in ADAPTERS:
            team = cluster.post("/teams", {"org": org, "name": team_name})["id"]
            project = cluster.post("/projects", {"team": team, "name": "app"})["id"]
            written = peft_adapter(
                home / name, dims=hf_dims(folder), seed=seed, std=SPREAD, base_name=BASE
            )
            cluster.post(
                "/adapters",
                {
                    "name": name,
                    "base": BASE,
                    "source": str(written),
                    "format": "peft",
                    "rank": 8,
                    "owner": f"team:{team}",
                },
            )
            secrets[team_name] = gateway_key(cluster, project, team_name)["secret"]
        cluster.start_agent("cpu-vllm", "--memory-gb", "8", "--cpus", "2", port_range="33400-33499")
        try:
            wait_for(
                "the base's vLLM replica to be ready",
                lambda: cluster.ready_replicas(BASE),
                timeout=READY_S,
                every=1.0,
            )
        except AssertionError:
            agent = cluster.log("agent-cpu-vllm")[-3000:]
            logs = sorted((home / "cpu-vllm" / "logs").glob("*"))
            tail = logs[-1].read_text(errors="replace")[-3000:] if logs else "(no engine log)"
            raise AssertionError(
                f"no ready replica; the agent's log ends:\n{agent}\nthe engine's log ends:\n{tail}"
            ) from None
        print(f"the vLLM replica was ready {time.monotonic() - started:.0f} s after the start")
        # The gateway reads the replica from its tables once they are refreshed after that
        # (a 503 "it is loading" until then): asked by a key of an org of its own, so that
        # the usage the test reads (Acme's) holds only the test's own requests.
        warm = cluster.post("/orgs", {"name": "Warm"})["id"]
        team = cluster.post("/teams", {"org": warm, "name": "warm"})["id"]
        project = cluster.post("/projects", {"team": team, "name": "app"})["id"]
        warm_key = gateway_key(cluster, project, "warm")["secret"]
        wait_for(
            "the gateway to answer for the base",
            lambda: _answered(cluster, warm_key),
            timeout=60,
            every=1.0,
        )
        yield cluster, secrets
    finally:
        cluster.close()


def _client(cluster: Cluster, secret: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{cluster.url}/v1", api_key=secret, max_retries=0, timeout=300)


def _answered(cluster: Cluster, secret: str) -> bool:
    """Whether the gateway has the base's replica: not a 503 "no ready replica"."""
    try:
        _ask(_client(cluster, secret), BASE)
    except openai.InternalServerError:
        return False
    return True


def _ask(client: openai.OpenAI, model: str):
    return client.chat.completions.create(
        model=model, messages=ASK, max_tokens=TOKENS, temperature=0
    )


def test_two_teams_adapters_loaded_into_one_vllm_through_the_gateway(site):
    cluster, secrets = site
    red, blue = _client(cluster, secrets["red"]), _client(cluster, secrets["blue"])
    assert all(not a["held_by"] for a in cluster.get("/adapters")), "loaded before asked"

    base = _ask(red, BASE)
    started = time.monotonic()
    red_answer = _ask(red, "red-tone")  # loaded on this request's demand
    print(
        f"vLLM CPU: red-tone's first request, its load included, {time.monotonic() - started:.1f} s"
    )
    blue_answer = _ask(blue, "blue-tone")
    base_again = _ask(blue, BASE)
    red_again = _ask(red, "red-tone")

    said = {
        "base": base.choices[0].message.content,
        "red": red_answer.choices[0].message.content,
        "blue": blue_answer.choices[0].message.content,
    }
    print(f"vLLM CPU answered at temperature 0: {said}")
    assert all(text and text.strip() for text in said.values()), said
    assert said["red"] != said["base"], said
    assert said["blue"] != said["base"], said
    assert said["red"] != said["blue"], said
    assert base_again.choices[0].message.content == said["base"], (base_again, said)
    assert red_again.choices[0].message.content == said["red"], (red_again, said)
    assert (base.model, red_answer.model, blue_answer.model) == (BASE, "red-tone", "blue-tone")

    # Each team's key reaches only its own adapter.
    with pytest.raises(openai.NotFoundError):
        _ask(red, "blue-tone")
    with pytest.raises(openai.NotFoundError):
        _ask(blue, "red-tone")
    listed = {m.id: getattr(m, "parent", None) for m in blue.models.list()}
    assert listed == {BASE: None, "blue-tone": BASE}

    # One replica holds both, as vLLM itself says (the agent's engine_load).
    [replica] = cluster.ready_replicas(BASE)
    wait_for(
        "both adapters reported held",
        lambda: all(a["held_by"] for a in cluster.get("/adapters")),
        timeout=30,
    )
    held = {a["name"]: a["held_by"] for a in cluster.get("/adapters")}
    assert held == {"red-tone": [replica["id"]], "blue-tone": [replica["id"]]}
    loaded = cluster.ctl("events", "--model", "red-tone")
    assert loaded.returncode == 0 and "adapter_loaded" in loaded.stdout, loaded

    # Usage names each adapter with the tokens its answers counted.
    expected = {
        "red-tone": _tokens(red_answer, red_again),
        "blue-tone": _tokens(blue_answer),
        BASE: _tokens(base, base_again),
    }

    def per_model() -> dict[str, tuple[int, int, int]]:
        rows = cluster.get("/usage", by="model", scope="org:Acme")["rows"]
        return {
            r["model"]: (r["requests"], r["prompt_tokens"], r["completion_tokens"]) for r in rows
        }

    with contextlib.suppress(AssertionError):
        wait_for("usage counted per adapter", lambda: per_model() == expected, timeout=20)
    assert per_model() == expected


def _tokens(*answers) -> tuple[int, int, int]:
    """(requests, prompt tokens, completion tokens) of these answers, as usage counts them."""
    return (
        len(answers),
        sum(a.usage.prompt_tokens for a in answers),
        sum(a.usage.completion_tokens for a in answers),
    )
