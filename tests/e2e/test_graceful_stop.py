"""`llmgw serve` stops gracefully: requests in flight finish, or end with an error event once
LLMGW_SHUTDOWN_GRACE_SECONDS runs out; usage is written; agents are told to reconnect
(issue 12, item 8). Real server, agent and sim engine; the official openai client."""

from __future__ import annotations

import re
import signal
import threading
import time

import openai

from .harness import gateway_key, gateway_project, wait_for

STREAMS = 20


def _slow_chat(cluster, tokens_per_sec: int) -> str:
    """A node, a model whose streams take a while, and a key for it; the key's secret."""
    cluster.start_agent("cpu-a", "--memory-gb", "8", "--cpus", "4", port_range="33100-33199")
    cluster.post(
        "/models",
        {
            "name": "slow",
            "source": "org/slow",
            "profiles": [
                {
                    "name": "cpu",
                    "engine": "sim",
                    "cpu_cores": 1,
                    "min_memory_gb": 1,
                    "args": ["--ttft-ms", "5", "--tokens-per-sec", str(tokens_per_sec)]
                    + ["--slots", str(STREAMS)],
                    "startup_timeout": 60,
                }
            ],
        },
    )
    wait_for("a ready replica", lambda: len(cluster.ready_replicas("slow")) == 1, timeout=60)
    return gateway_key(cluster, gateway_project(cluster, "acme"), "main")["secret"]


def _streams(cluster, secret: str, max_tokens: int) -> tuple[list, list[threading.Thread]]:
    """STREAMS streamed chats in threads; each appends ("ok", tokens) or ("error", text)."""
    client = openai.OpenAI(base_url=f"{cluster.url}/v1", api_key=secret, max_retries=0)
    results: list = []
    started = threading.Barrier(STREAMS + 1)

    def one() -> None:
        try:
            stream = client.chat.completions.create(
                model="slow",
                messages=[{"role": "user", "content": "count"}],
                max_tokens=max_tokens,
                stream=True,
                stream_options={"include_usage": True},
            )
            first = True
            usage = None
            for chunk in stream:
                if first:
                    started.wait(timeout=30)
                    first = False
                usage = chunk.usage or usage
            results.append(("ok", usage.completion_tokens if usage else None))
        except openai.APIError as exc:
            results.append(("error", str(exc)))

    threads = [threading.Thread(target=one) for _ in range(STREAMS)]
    for t in threads:
        t.start()
    started.wait(timeout=30)  # every stream has its first token
    return results, threads


def _stopped(log: str) -> tuple[int, int, int]:
    """(finished, of, cut) over the stop lines of every worker the server ran (production
    runs one per core, each saying its own)."""
    lines = re.findall(r"(\d+) of (\d+) requests in flight finished, (\d+) cut", log)
    assert lines, log
    return tuple(sum(int(line[i]) for line in lines) for i in range(3))


def _term(cluster) -> float:
    """SIGTERM the server and wait for it to exit by itself; how long that took."""
    proc = cluster.procs.pop("serve")
    began = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    proc.wait(timeout=60)
    return time.monotonic() - began


def test_requests_in_flight_finish_and_are_counted_when_the_server_stops(cluster):
    secret = _slow_chat(cluster, tokens_per_sec=20)
    results, threads = _streams(cluster, secret, max_tokens=40)  # about 2 s each

    took = _term(cluster)
    for t in threads:
        t.join(timeout=30)

    assert results == [("ok", 40)] * STREAMS
    assert took < 25
    log = cluster.log("serve")
    assert _stopped(log) == (STREAMS, STREAMS, 0), log
    # The agent was told to connect again (going away), not dropped.
    assert "closed the connection (1001 llmgw serve is stopping)" in cluster.log("agent-cpu-a")
    cluster.start_server()
    rows = wait_for("usage", lambda: cluster.get("/usage", by="key")["rows"] or None)
    assert [(r["requests"], r["completion_tokens"]) for r in rows] == [(STREAMS, 40 * STREAMS)]


def test_streams_past_the_grace_end_with_an_error_event_and_their_usage_is_written(cluster):
    cluster.stop("serve")
    cluster.env["LLMGW_SHUTDOWN_GRACE_SECONDS"] = "1"
    cluster.start_server()
    secret = _slow_chat(cluster, tokens_per_sec=5)
    results, threads = _streams(cluster, secret, max_tokens=200)  # 40 s each

    took = _term(cluster)
    for t in threads:
        t.join(timeout=30)

    assert len(results) == STREAMS
    assert all(kind == "error" and "server stopped before the stream ended" in text
               for kind, text in results), results  # fmt: skip
    assert took < 15
    assert _stopped(cluster.log("serve")) == (0, STREAMS, STREAMS)
    cluster.start_server()
    rows = wait_for("usage", lambda: cluster.get("/usage", by="key")["rows"] or None)
    assert sum(r["requests"] for r in rows) == STREAMS
