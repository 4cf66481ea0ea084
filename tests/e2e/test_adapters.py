"""LoRA adapters end to end: a real `llmgw serve`, a real agent running a sim engine with two
adapter slots, and the openai client. Two teams' adapters on one base replica: each team's
key reaches only its own, the first request to each loads it on the replica and waits, each
answer differs from the base's, and usage is counted per adapter (docs/adapters.md)."""

from __future__ import annotations

import openai
import pytest

from .harness import gateway_key, wait_for

# The agent's half (fleet/agent/adapters.py: load_adapter, adapter_status, the engines'
# adapters in engine_load) is its own helper's; without it there is nothing to load with.
pytest.importorskip("fleet.agent.adapters")

BASE = {
    "name": "base",
    "source": "org/base-model",
    "profiles": [
        {
            "name": "cpu",
            "engine": "sim",
            "cpu_cores": 1,
            "min_memory_gb": 1,
            "adapter_slots": 2,
            "args": ["--ttft-ms", "5", "--tokens-per-sec", "500"],
            "startup_timeout": 60,
        }
    ],
    "scaling": {"min": 1},
}
ASK = [{"role": "user", "content": "write me a short line"}]


def _team(cluster, org: int, name: str) -> int:
    team = cluster.post("/teams", {"org": org, "name": name})
    project = cluster.post("/projects", {"team": team["id"], "name": "app"})
    return team["id"], project["id"]


def _answer(client: openai.OpenAI, model: str) -> str:
    reply = client.chat.completions.create(model=model, messages=ASK, max_tokens=6, temperature=0)
    return reply.choices[0].message.content


def test_two_teams_adapters_on_one_base_replica(cluster, tmp_path):
    cluster.start_agent("cpu-a", "--cpus", "4", "--memory-gb", "8", port_range="32500-32999")
    wait_for("a ready node", lambda: [n["state"] for n in cluster.get("/nodes")] == ["ready"])
    cluster.post("/models", BASE)
    org = cluster.post("/orgs", {"name": "Acme"})["id"]
    (red_team, red_project), (blue_team, blue_project) = (
        _team(cluster, org, "red"),
        _team(cluster, org, "blue"),
    )
    for name, team in (("red-tone", red_team), ("blue-tone", blue_team)):
        folder = tmp_path / name
        folder.mkdir()
        (folder / "adapter_config.json").write_text('{"r": 8}')
        cluster.post(
            "/adapters",
            {
                "name": name,
                "base": "base",
                "source": str(folder),
                "format": "peft",
                "rank": 8,
                "owner": f"team:{team}",
            },
        )
    wait_for("a ready replica of the base", lambda: cluster.ready_replicas("base"), timeout=60)
    red_key = gateway_key(cluster, red_project, "red")["secret"]
    blue_key = gateway_key(cluster, blue_project, "blue")["secret"]
    red = openai.OpenAI(base_url=f"{cluster.url}/v1", api_key=red_key, max_retries=3)
    blue = openai.OpenAI(base_url=f"{cluster.url}/v1", api_key=blue_key, max_retries=3)

    base_said = _answer(red, "base")
    red_said = _answer(red, "red-tone")  # loaded on the replica, then answered
    blue_said = _answer(blue, "blue-tone")
    assert len({base_said, red_said, blue_said}) == 3, (base_said, red_said, blue_said)
    assert _answer(red, "red-tone") == red_said  # held now, the same answer at temperature 0

    with pytest.raises(openai.NotFoundError):
        _answer(red, "blue-tone")
    with pytest.raises(openai.NotFoundError):
        _answer(blue, "red-tone")
    listed = {m.id: getattr(m, "parent", None) for m in red.models.list()}
    assert listed == {"base": None, "red-tone": "base"}

    held = wait_for(
        "both adapters held by the one replica",
        lambda: (a := cluster.get("/adapters")) and all(x["held_by"] for x in a) and a,
        timeout=20,
    )
    assert {a["name"]: len(a["held_by"]) for a in held} == {"red-tone": 1, "blue-tone": 1}
    replica = cluster.ready_replicas("base")[0]["id"]
    assert {a["held_by"][0] for a in held} == {replica}
    shown = cluster.ctl("replicas", "--model", "base")
    assert "blue-tone, red-tone" in shown.stdout or "red-tone, blue-tone" in shown.stdout

    def per_model() -> dict[str, int]:
        rows = cluster.get("/usage", by="model")["rows"]
        return {r["model"]: r["requests"] for r in rows}

    usage = wait_for(
        "usage counted per adapter",
        lambda: (u := per_model()).keys() >= {"base", "red-tone", "blue-tone"} and u,
        timeout=20,
    )
    # Two answered of red's own (the refused ones reach no adapter), one of blue's.
    assert (usage["red-tone"], usage["blue-tone"]) == (2, 1)
