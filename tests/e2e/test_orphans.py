"""An agent killed with SIGKILL leaves its engine running; the next run adopts it (issue 12,
item 7). Real `llmgw serve`, real `llmgw agent`s on a simulated GPU node, a real sim engine.

The same engine (same pid) serves on after the restart: it is adopted, not replaced, and no
second engine is started on the node's only GPU.
"""

from __future__ import annotations

import json
import signal

import httpx

from fleet.agent.ledger import proc_stat

from .harness import gateway_key, gateway_project, listener_pid, wait_for

MODEL = {
    "name": "chat",
    "source": "hf://acme/chat",
    "profiles": [
        {"name": "gpu", "engine": "sim", "gpu_class": "h100-80g", "args": ["--ttft-ms", "1"]}
    ],
}
FLAGS = ("--simulate-gpus", "1xh100-80g")
PORTS = "33400-33499"


def _alive(pid: int) -> bool:
    return proc_stat(pid) is not None  # a zombie waiting for init to reap it is gone


def _ask(cluster, secret: str) -> dict | None:
    r = httpx.post(
        f"{cluster.url}/v1/chat/completions",
        headers={"Authorization": f"Bearer {secret}"},
        json={"model": "chat", "max_tokens": 3, "messages": [{"role": "user", "content": "hi"}]},
        timeout=30,
    )
    return r.json() if r.status_code == 200 else None


def _port(endpoint: str) -> int:
    return int(endpoint.rsplit(":", 1)[1])


def test_a_killed_agents_engine_is_adopted_by_the_next_run_and_serves_on(cluster):
    cluster.start_agent("gpu-a", *FLAGS, port_range=PORTS)
    wait_for("a ready node", lambda: [n["state"] for n in cluster.get("/nodes")] == ["ready"])
    cluster.post("/models", MODEL)
    [replica] = wait_for("a ready replica", lambda: cluster.ready_replicas("chat"))
    key = gateway_key(cluster, gateway_project(cluster, "acme"), "main")
    assert _ask(cluster, key["secret"]) is not None
    port = _port(replica["endpoint"])
    engine = listener_pid(port)
    assert engine is not None
    ledger = cluster.home / "gpu-a" / "shards"
    [entry] = [json.loads(p.read_text()) for p in ledger.iterdir()]
    assert (entry["pid"], entry["port"]) == (engine, port)

    cluster.stop("agent-gpu-a", signal.SIGKILL)
    assert _alive(engine), "the engine went with its agent"

    cluster.start_agent("gpu-a", *FLAGS, port_range=PORTS)
    wait_for(
        "the node to be ready again",
        lambda: [n["state"] for n in cluster.get("/nodes")] == ["ready"],
    )
    wait_for(
        "the restarted agent to adopt the engine",
        lambda: "adopted 1 engines from an earlier run" in cluster.log("agent-gpu-a"),
    )
    after = wait_for("the replica ready again", lambda: cluster.ready_replicas("chat"))
    assert [r["id"] for r in after] == [replica["id"]]
    assert after[0]["endpoint"] == replica["endpoint"]
    assert after[0]["shards"][0]["gpu_indices"] == [0]
    # The same engine, and the only one: nothing else was placed on the node's one GPU.
    assert listener_pid(port) == engine
    assert [r["id"] for r in cluster.get("/replicas", model="chat")] == [replica["id"]]
    assert len(list(ledger.iterdir())) == 1
    answer = wait_for("the gateway to serve through it", lambda: _ask(cluster, key["secret"]))
    assert answer["usage"]["completion_tokens"] > 0
    assert ": started " not in cluster.log("agent-gpu-a").split("adopted 1 engines")[1]

    # Stopped as its own, with the rest of the node when the agent stops.
    cluster.stop("agent-gpu-a")
    wait_for("the adopted engine to stop with its agent", lambda: not _alive(engine), timeout=30)
    assert list(ledger.iterdir()) == []
