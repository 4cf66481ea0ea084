"""No ghost replicas, end to end: a machine that dies while `llmgw serve` is down is not
routed to once the restarted server has not heard from it for the unreachable window."""

from __future__ import annotations

import os
import signal
import time

from .harness import listener_pid, wait_for
from .test_cluster import _chat_on_two_gpu_nodes, _port

UNREACHABLE_S = 2.0  # the harness's LLMGW_UNREACHABLE_SECONDS


def test_a_node_that_died_while_the_server_was_down_and_its_replica_stop_being_ready(cluster):
    ready = _chat_on_two_gpu_nodes(cluster)
    on_a = next(r for r in ready if r["shards"][0]["node"] == "gpu-a")
    on_b = next(r for r in ready if r["shards"][0]["node"] == "gpu-b")
    engine = listener_pid(_port(on_a["endpoint"]))

    cluster.stop("serve")
    # The machine dies meanwhile: its agent and its engine with it.
    cluster.stop("agent-gpu-a", signal.SIGKILL)
    os.kill(engine, signal.SIGKILL)
    cluster.start_server()
    up = time.monotonic()

    def ghost_gone():
        node = cluster.get("/nodes/gpu-a")["state"]
        mine = [r for r in cluster.get("/replicas", model="chat") if r["id"] == on_a["id"]]
        return node != "ready" and (not mine or mine[0]["unhealthy_since"]) and (node, mine)

    node, mine = wait_for("gpu-a and its replica to stop counting as ready", ghost_gone)
    took = time.monotonic() - up
    print(
        f"ghost gone {took:.1f} s after llmgw serve answered (unreachable window {UNREACHABLE_S:g} s)"
    )
    assert node in ("unreachable", "lost")
    # The node that came back is confirmed and routed to.
    wait_for("gpu-b ready again", lambda: cluster.get("/nodes/gpu-b")["state"] == "ready")
    wait_for(
        "gpu-b's replica routed",
        lambda: any(
            r["id"] == on_b["id"] and r["state"] == "ready" and not r["unhealthy_since"]
            for r in cluster.get("/replicas", model="chat")
        ),
    )
