"""Two `llmgw serve` processes, one cluster: the production shape (PostgreSQL, Redis, Celery)
behind a small TCP balancer on loopback, agents spread over both. One server is stopped under
load: its agents move to the other, the gateway keeps answering, usage is counted once and
nothing runs twice (issue 12, item 12)."""

from __future__ import annotations

import os
import signal
import sys
import threading
import time

import openai

from .balancer import Balancer
from .harness import (
    Cluster,
    free_port,
    gateway_key,
    gateway_project,
    needs_production,
    wait_for,
)

pytestmark = needs_production

CHAT = {
    "name": "chat",
    "source": "org/chat",
    "profiles": [
        {
            "name": "cpu",
            "engine": "sim",
            "cpu_cores": 1,
            "min_memory_gb": 1,
            "args": ["--ttft-ms", "2", "--tokens-per-sec", "2000", "--slots", "32"],
            "startup_timeout": 60,
        }
    ],
    "scaling": {"min": 2},
}


def _load(base_url: str, secret: str, stop: threading.Event, results: list) -> None:
    """About 50 requests a second through the official client (its own retries, as a caller
    has them), each result appended: the status, or the error's text."""
    client = openai.OpenAI(base_url=f"{base_url}/v1", api_key=secret, timeout=20)
    while not stop.is_set():
        began = time.monotonic()
        try:
            answer = client.chat.completions.create(
                model="chat", messages=[{"role": "user", "content": "hi"}], max_tokens=2
            )
            results.append(("ok", answer.usage.completion_tokens))
        except openai.APIError as exc:
            results.append(("error", str(exc)))
        time.sleep(max(0.0, 0.02 - (time.monotonic() - began)))


def test_one_of_two_servers_stops_under_load_and_nothing_is_lost_or_counted_twice(tmp_path):
    cluster = Cluster(tmp_path, production=True)
    balancer = None
    try:
        cluster.start_server()
        second = free_port()
        cluster._spawn("serve-2", [sys.executable, "-m", "llmgw", "serve", "--port", str(second)])
        balancer = Balancer([cluster.port, second])
        cluster.client.base_url = f"{balancer.url}/api/v1"  # the admin too, through it
        wait_for(
            "both servers",
            lambda: all(_answers(p) for p in (cluster.port, second)),
        )
        cluster.env["LLMGW_TOKEN"] = cluster.agent_token  # agents join by environment
        for node, ports in (("cpu-a", "36000-36099"), ("cpu-b", "36100-36199")):
            cluster._spawn(
                f"agent-{node}",
                [
                    sys.executable, "-m", "llmgw", "agent", "--server", balancer.url,
                    "--node-id", node, "--state-dir", str(tmp_path / node),
                    "--heartbeat-interval", "0.5", "--port-range", ports,
                    "--memory-gb", "8", "--cpus", "4",
                ],
            )  # fmt: skip
        cluster.post("/models", CHAT)
        ready = wait_for(
            "two ready replicas", lambda: len(cluster.ready_replicas("chat")) == 2 and
            cluster.ready_replicas("chat"), timeout=90,
        )  # fmt: skip
        before = sorted(r["id"] for r in ready)
        secret = gateway_key(cluster, gateway_project(cluster, "acme"), "main")["secret"]

        stop, results = threading.Event(), []
        load = threading.Thread(target=_load, args=(balancer.url, secret, stop, results))
        load.start()
        time.sleep(3)
        served_before = len(results)
        os.killpg(cluster.procs["serve"].pid, signal.SIGTERM)
        cluster.procs.pop("serve").wait(timeout=60)
        time.sleep(5)
        stop.set()
        load.join(timeout=30)

        lost = [r for r in results if r[0] != "ok"]
        assert not lost, lost[:3]
        assert len(results) > served_before + 100  # it kept serving after the stop
        # The agents moved to the server left, and the same two replicas serve.
        nodes = cluster.get("/nodes")
        assert [n["state"] for n in nodes] == ["ready", "ready"]
        assert sorted(r["id"] for r in cluster.ready_replicas("chat")) == before
        # Every answer is counted once, whichever server gave it.
        wait_for(
            "every request in usage",
            lambda: (
                sum(r["requests"] for r in cluster.get("/usage", by="key")["rows"]) == len(results)
            ),
            timeout=20,
        )
        print(f"two servers: {len(results)} requests, 0 lost, one server stopped mid-way")
    finally:
        if balancer is not None:
            balancer.close()
        cluster.close()


def _answers(port: int) -> bool:
    import httpx

    try:
        return httpx.get(f"http://127.0.0.1:{port}/api/v1/openapi.json", timeout=2).is_success
    except httpx.HTTPError:
        return False
