"""The control plane end to end: real server, real agents, real sim engines, the official openai client."""

from __future__ import annotations

import os
import signal

import openai
import pytest

from llmgw.core.secrets import engine_key

from .harness import SECRET, listener_pid, wait_for

CHAT = {
    "name": "chat",
    "source": "org/chat-model",
    "profiles": [
        {
            "name": "tp4",
            "engine": "sim",
            "gpu_class": "h100-80g",
            "tp": 4,
            "args": ["--ttft-ms", "2", "--tokens-per-sec", "2000"],
            "startup_timeout": 60,
        }
    ],
    "scaling": {"min": 2},
}


def _port(endpoint: str) -> int:
    return int(endpoint.rsplit(":", 1)[1])


def _chat_on_two_gpu_nodes(cluster) -> list[dict]:
    """Two simulated 8 × h100-80g nodes, the chat model added over REST, its two replicas ready."""
    cluster.start_agent("gpu-a", "--simulate-gpus", "8xh100-80g", port_range="31000-31499")
    cluster.start_agent("gpu-b", "--simulate-gpus", "8xh100-80g", port_range="31500-31999")
    wait_for(
        "two ready nodes", lambda: [n["state"] for n in cluster.get("/nodes")] == ["ready", "ready"]
    )
    cluster.post("/models", CHAT)
    return wait_for(
        "two ready replicas",
        lambda: len(cluster.ready_replicas("chat")) == 2 and cluster.ready_replicas("chat"),
    )


def test_a_model_added_over_rest_runs_answers_with_its_key_and_survives_a_server_restart(cluster):
    ready = _chat_on_two_gpu_nodes(cluster)

    # Spread over the nodes, four GPUs each.
    assert sorted(r["shards"][0]["node"] for r in ready) == ["gpu-a", "gpu-b"]
    assert all(len(r["shards"][0]["gpu_indices"]) == 4 for r in ready)

    for replica in ready:
        client = openai.OpenAI(
            base_url=f"{replica['endpoint']}/v1", api_key=engine_key(SECRET, replica["id"])
        )
        answer = client.chat.completions.create(
            model="chat", messages=[{"role": "user", "content": "hello there"}], max_tokens=7
        )
        assert answer.usage.completion_tokens == 7
        assert answer.choices[0].message.content
        chunks = list(
            client.chat.completions.create(
                model="chat",
                messages=[{"role": "user", "content": "stream"}],
                max_tokens=3,
                stream=True,
            )
        )
        assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        other = openai.OpenAI(
            base_url=f"{replica['endpoint']}/v1", api_key=engine_key(SECRET, "another-replica")
        )
        with pytest.raises(openai.AuthenticationError):
            other.models.list()

    before = {r["id"]: (r["shards"][0]["id"], listener_pid(_port(r["endpoint"]))) for r in ready}
    assert all(pid for _, pid in before.values())

    cluster.stop("serve")
    cluster.start_server()
    wait_for(
        "the agents to register again",
        lambda: [n["state"] for n in cluster.get("/nodes")] == ["ready", "ready"],
    )
    # Give the reconciler time to settle and run passes: nothing may be started twice.
    wait_for(
        "passes after the settle period",
        lambda: cluster.post("/reconcile")["ran"] and not cluster.post("/reconcile")["settling"],
    )
    after = {
        r["id"]: (r["shards"][0]["id"], listener_pid(_port(r["endpoint"])))
        for r in cluster.ready_replicas("chat")
    }
    assert after == before
    assert len(cluster.get("/replicas", model="chat")) == 2


def test_a_killed_agents_node_goes_unreachable_then_lost_and_its_replica_moves(cluster):
    ready = _chat_on_two_gpu_nodes(cluster)
    on_a = next(r for r in ready if r["shards"][0]["node"] == "gpu-a")

    # The machine dies: its agent and its engine with it.
    engine = listener_pid(_port(on_a["endpoint"]))
    cluster.stop("agent-gpu-a", signal.SIGKILL)
    os.kill(engine, signal.SIGKILL)

    wait_for(
        "gpu-a unreachable",
        lambda: cluster.get("/nodes/gpu-a")["state"] in ("unreachable", "lost"),
        timeout=30,
    )
    wait_for("gpu-a lost", lambda: cluster.get("/nodes/gpu-a")["state"] == "lost", timeout=30)
    moved = wait_for(
        "a replacement on gpu-b",
        lambda: (
            len(r := cluster.ready_replicas("chat")) == 2
            and all(x["shards"][0]["node"] == "gpu-b" for x in r)
            and r
        ),
    )
    assert on_a["id"] not in {r["id"] for r in moved}
    model = cluster.get("/models/chat")
    assert model["failures"] == 0, "a lost node's replicas are not the model's failures"


def test_a_critical_model_takes_a_standard_replicas_room_on_real_agents(cluster):
    cluster.start_agent("gpu-a", "--simulate-gpus", "8xh100-80g", port_range="31000-31499")
    wait_for("a ready node", lambda: [n["state"] for n in cluster.get("/nodes")] == ["ready"])
    cluster.post("/models", CHAT)
    wait_for("chat filling the node", lambda: len(cluster.ready_replicas("chat")) == 2)
    vital = {**CHAT, "name": "vital", "class": "critical", "scaling": {"min": 0, "max": 0}}
    cluster.post("/models", vital)

    # The dry run names a victim and stops nothing.
    dry = wait_for(
        "a replica old enough to give way",
        lambda: (d := cluster.get("/models/vital/preemption"))["victims"] and d,
    )
    assert [v["model"] for v in dry["victims"]] == ["chat"]
    assert len(cluster.ready_replicas("chat")) == 2

    cluster.post("/models/vital/scale", {"min": 1})
    wait_for("vital ready", lambda: len(cluster.ready_replicas("vital")) == 1, timeout=60)
    chat = cluster.get("/models/chat")
    # Held only until vital had its replica: now it is simply short of room.
    assert (chat["ready"], chat["preempted"], chat["held_for"]) == (1, 1, "")
    assert chat["class"] == "standard"
    # The room went to the model it was freed for, and only one replica was stopped for it.
    assert len(cluster.get("/replicas", model="chat")) == 1
