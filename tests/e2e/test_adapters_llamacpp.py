"""LoRA adapters end to end on a real engine: a real `llmgw serve`, a real agent running a
real `llama-server` of the demo's base model (SmolLM2-135M-Instruct) with two adapter slots,
two LoRA GGUFs the tests write for it (tests/lora_files.py), owned by two teams, and the
official openai client at temperature 0 through the gateway.

Held to what the model says: each team's key reaches its own adapter and gets 404 for the
other's; each adapter answers otherwise than the base and than the other; the base asked
after an adapter answers exactly as it did before (the gateway names an adapter at 0 on a
base request, llmgw/gateway/adapters.py `_lora_named`: llama-server would otherwise reuse
the adapter's prompt cache); and usage names each adapter with the tokens its answers
counted.

llama-server holds its adapters from its start (docs/adapters.md), so the adapters are in
the catalog, each a GGUF path on the node, before the agent that starts the replica is.
The llama-server is the one `llmgw engines build llamacpp` made; without one the test
skips, saying how to make it, and in CI (CI=true) it fails instead. One replica, answers of
a few tokens: CI has two cores.
"""

from __future__ import annotations

import contextlib

import openai
import pytest

from tests.lora_files import lora_gguf

from .harness import Cluster, gateway_key, wait_for
from .real_engines import smollm2_gguf

BASE = "smollm2-135m"
SYSTEM = {"role": "system", "content": "You are a helpful assistant."}
ASK = [SYSTEM, {"role": "user", "content": "Tell me about the sea."}]
# Enough for each adapter to part from the base and from the other (measured: the first
# word differs already), few enough for two cores.
TOKENS = 12
READY_S = 180.0
# (adapter, team, seed of its weights)
ADAPTERS = (("red-tone", "red", 1), ("blue-tone", "blue", 2))


@pytest.fixture(scope="module")
def site(tmp_path_factory, llama_server_binary):
    """A control plane, the base and both teams' adapters in its catalog, then one CPU node
    whose agent starts the base's replica holding both: (cluster, {team: key secret})."""
    home = tmp_path_factory.mktemp("lora-llamacpp")
    weights = smollm2_gguf()
    cluster = Cluster(home, production=False)
    # The harness's 2 s before a silent node is taken out of routing is shorter than an
    # agent's heartbeat can be late while llama-server computes on a loaded 2-core machine
    # (measured: "node not heard from for 2 s" between answers, and the adapter's request
    # refused for want of a replica).
    cluster.env["LLMGW_UNREACHABLE_SECONDS"] = "15"
    cluster.env["LLMGW_LOST_SECONDS"] = "60"
    try:
        cluster.start_server()
        cluster.post(
            "/models",
            {
                "name": BASE,
                "source": str(weights),
                "scaling": {"min": 1},
                "profiles": [
                    {
                        "name": "cpu",
                        "engine": "llamacpp",
                        "min_memory_gb": 2,
                        # One thread: a core left for the control plane and the agent.
                        "cpu_cores": 1,
                        "adapter_slots": 2,
                        "args": ["--ctx-size", "1024"],
                        "startup_timeout": int(READY_S),
                    }
                ],
            },
        )
        org = cluster.post("/orgs", {"name": "Acme"})["id"]
        secrets = {}
        for name, team_name, seed in ADAPTERS:
            team = cluster.post("/teams", {"org": org, "name": team_name})["id"]
            project = cluster.post("/projects", {"team": team, "name": "app"})["id"]
            gguf = lora_gguf(weights, home / f"{name}.gguf", seed=seed)
            cluster.post(
                "/adapters",
                {
                    "name": name,
                    "base": BASE,
                    "source": str(gguf),
                    "format": "gguf",
                    "rank": 8,
                    "owner": f"team:{team}",
                },
            )
            secrets[team_name] = gateway_key(cluster, project, team_name)["secret"]
        cluster.start_agent(
            "cpu-lora",
            "--llama-server",
            str(llama_server_binary),
            "--memory-gb",
            "4",
            "--cpus",
            "2",
            port_range="33100-33199",
        )
        try:
            wait_for(
                "the base's replica to be ready",
                lambda: cluster.ready_replicas(BASE),
                timeout=READY_S,
                every=0.5,
            )
        except AssertionError:
            logs = sorted((home / "cpu-lora" / "logs").glob("*"))
            tail = logs[-1].read_text(errors="replace")[-3000:] if logs else "(no engine log)"
            raise AssertionError(f"no ready replica; the engine's log ends:\n{tail}") from None
        # The engine's word that it holds both, by index, reaches the gateway with the
        # agent's engine_load: the base's first request is then already named at 0.
        wait_for(
            "both adapters held by the replica",
            lambda: all(a["held_by"] for a in cluster.get("/adapters")),
            timeout=30,
        )
        yield cluster, secrets
    finally:
        cluster.close()


def _client(cluster: Cluster, secret: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{cluster.url}/v1", api_key=secret, max_retries=0, timeout=120)


def _ask(client: openai.OpenAI, model: str):
    return client.chat.completions.create(
        model=model, messages=ASK, max_tokens=TOKENS, temperature=0
    )


def test_two_teams_adapters_on_one_llama_server_through_the_gateway(site):
    cluster, secrets = site
    red, blue = _client(cluster, secrets["red"]), _client(cluster, secrets["blue"])

    base = _ask(red, BASE)
    red_answer = _ask(red, "red-tone")
    # Right after an adapter's request, on the same slot: the base's own words again.
    base_again = _ask(red, BASE)
    blue_answer = _ask(blue, "blue-tone")
    base_after_blue = _ask(blue, BASE)
    red_again = _ask(red, "red-tone")

    said = {
        "base": base.choices[0].message.content,
        "red": red_answer.choices[0].message.content,
        "blue": blue_answer.choices[0].message.content,
    }
    assert all(text and text.strip() for text in said.values()), said
    assert said["red"] != said["base"], said
    assert said["blue"] != said["base"], said
    assert said["red"] != said["blue"], said
    assert base_again.choices[0].message.content == said["base"], (base_again, said)
    assert base_after_blue.choices[0].message.content == said["base"], (base_after_blue, said)
    assert red_again.choices[0].message.content == said["red"], (red_again, said)
    # Each answer names what was asked, though llama-server names its base for an adapter.
    assert (base.model, red_answer.model, blue_answer.model) == (BASE, "red-tone", "blue-tone")

    # Each team's key reaches only its own adapter.
    with pytest.raises(openai.NotFoundError):
        _ask(red, "blue-tone")
    with pytest.raises(openai.NotFoundError):
        _ask(blue, "red-tone")
    listed = {m.id: getattr(m, "parent", None) for m in blue.models.list()}
    assert listed == {BASE: None, "blue-tone": BASE}

    # One replica holds both; llama-server numbers them in the catalog's order.
    [replica] = cluster.ready_replicas(BASE)
    held = {a["name"]: a["held_by"] for a in cluster.get("/adapters")}
    assert held == {"red-tone": [replica["id"]], "blue-tone": [replica["id"]]}

    # Usage names each adapter with the tokens its answers counted.
    expected = {
        "red-tone": _tokens(red_answer, red_again),
        "blue-tone": _tokens(blue_answer),
        BASE: _tokens(base, base_again, base_after_blue),
    }

    def per_model() -> dict[str, tuple[int, int, int]]:
        rows = cluster.get("/usage", by="model")["rows"]
        return {
            r["model"]: (r["requests"], r["prompt_tokens"], r["completion_tokens"]) for r in rows
        }

    with contextlib.suppress(AssertionError):
        wait_for("usage counted per adapter", lambda: per_model() == expected, timeout=20)
    assert per_model() == expected
    shown = cluster.ctl("usage", "--by", "model")
    assert shown.returncode == 0, shown.stderr
    assert "red-tone" in shown.stdout and "blue-tone" in shown.stdout, shown.stdout

    # Streamed too, each event names the adapter (counted after the figures above).
    with red.chat.completions.create(
        model="red-tone", messages=ASK, max_tokens=TOKENS, temperature=0, stream=True
    ) as stream:
        chunks = list(stream)
    assert {c.model for c in chunks} == {"red-tone"}
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == said["red"]


def _tokens(*answers) -> tuple[int, int, int]:
    """(requests, prompt tokens, completion tokens) of these answers, as usage counts them."""
    return (
        len(answers),
        sum(a.usage.prompt_tokens for a in answers),
        sum(a.usage.completion_tokens for a in answers),
    )
