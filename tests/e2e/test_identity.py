"""A node is who it says it is, with real processes: a real server and agent, an impostor
holding the join token, and `ctl node forget` (issue 12, item 1)."""

from __future__ import annotations

import asyncio
import json
import stat

import httpx
import openai
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed

from llmgw.core.secrets import engine_key

from .harness import SECRET, SMALL, Cluster, wait_for


def _agent_url(cluster) -> str:
    return cluster.url.replace("http://", "ws://") + "/ws/agent/"


async def _impostor(cluster, node_id: str) -> tuple[dict, int]:
    """Register as `node_id` with the join token, as a script holding it would."""
    url = _agent_url(cluster)
    headers = {"Authorization": f"Bearer {cluster.agent_token}"}
    async with connect(url, additional_headers=headers) as ws:
        await ws.send(json.dumps({"type": "register", "node_id": node_id, "mgmt_addr": "6.6.6.6"}))
        answer = json.loads(await ws.recv())
        try:
            await ws.recv()
        except ConnectionClosed as closed:
            return answer, closed.rcvd.code
    raise AssertionError("the impostor's connection was not closed")


def _chat(replica: dict) -> int:
    client = openai.OpenAI(
        base_url=f"{replica['endpoint']}/v1", api_key=engine_key(SECRET, replica["id"])
    )
    answer = client.chat.completions.create(
        model="small", messages=[{"role": "user", "content": "hi"}], max_tokens=3
    )
    return answer.usage.completion_tokens


def test_a_join_token_cannot_take_a_running_node_and_a_forgotten_node_joins_anew(cluster):
    cluster.start_agent("cpu-a", "--memory-gb", "8", "--cpus", "4", port_range="32000-32099")
    cluster.post("/models", SMALL)
    [replica] = wait_for(
        "a ready replica", lambda: cluster.ready_replicas("small") or None, timeout=60
    )
    kept = cluster.home / "cpu-a" / "node-token"
    first = kept.read_text()
    assert first.startswith("llmgw_node_")
    assert stat.S_IMODE(kept.stat().st_mode) == 0o600
    before = cluster.get("/nodes/cpu-a")

    answer, code = asyncio.run(_impostor(cluster, "cpu-a"))

    assert code == 4403
    assert answer["type"] == "error" and "cpu-a has its own credential" in answer["detail"]
    after = cluster.get("/nodes/cpu-a")
    assert (after["state"], after["mgmt_addr"]) == ("ready", before["mgmt_addr"])
    assert [r["id"] for r in cluster.ready_replicas("small")] == [replica["id"]]
    assert _chat(replica) == 3
    scraped = httpx_get(f"{cluster.url}/metrics")
    assert 'llmgw_agent_refused_total{reason="node_has_credential"} 1.0' in scraped

    # Forgotten, the node's engine is stopped and its agent joins again as a new node.
    forgot = cluster.ctl("node", "forget", "cpu-a")
    assert forgot.returncode == 0, forgot.stderr
    assert "credential is revoked" in forgot.stdout
    wait_for(
        "the agent to join again with a new credential",
        lambda: kept.exists() and kept.read_text() != first and _rejoined(cluster),
        timeout=60,
    )
    again = wait_for(
        "a new ready replica",
        lambda: [r for r in cluster.ready_replicas("small") if r["id"] != replica["id"]] or None,
        timeout=60,
    )
    assert _chat(again[0]) == 3


async def _flood_then_connect_again(cluster) -> tuple[int, str]:
    """Register, send frames far over the budget until closed, and connect again at once
    with the node's own credential: the close that answers, code and reason."""
    url = _agent_url(cluster)
    join = {"Authorization": f"Bearer {cluster.agent_token}"}
    async with connect(url, additional_headers=join) as ws:
        await ws.send(
            json.dumps({"type": "register", "node_id": "flood-a", "mgmt_addr": "10.0.0.9"})
        )
        token = json.loads(await ws.recv())["node_token"]
        try:
            for seq in range(1, 200):
                await ws.send(json.dumps({"type": "heartbeat", "seq": seq}))
            await ws.recv()
        except ConnectionClosed as closed:
            assert closed.rcvd.code == 4429
    async with connect(url, additional_headers={"Authorization": f"Bearer {token}"}) as again:
        try:
            await again.recv()
        except ConnectionClosed as closed:
            return closed.rcvd.code, closed.rcvd.reason
    raise AssertionError("the flooding node's new connection was not closed")


def test_an_agent_is_told_why_its_connection_was_closed(tmp_path):
    cluster = Cluster(tmp_path, production=False)
    cluster.env["LLMGW_AGENT_FRAMES_PER_SECOND"] = "1"
    try:
        cluster.start_server()
        # The reason reaches the agent through daphne, which used to send the code alone.
        code, reason = asyncio.run(_flood_then_connect_again(cluster))
        assert (code, reason) == (4429, "too many frames; wait before connecting")
    finally:
        cluster.close()


def _rejoined(cluster) -> bool:
    nodes = cluster.client.get("/nodes/cpu-a")
    return nodes.status_code == 200 and nodes.json()["state"] == "ready"


def httpx_get(url: str) -> str:
    return httpx.get(url, timeout=10).text
