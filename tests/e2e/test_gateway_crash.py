"""A `llmgw serve` killed with streams in flight loses none of their usage: its journal is
settled by the next start (issue 35, item 5). Real server, agent and sim engine."""

from __future__ import annotations

import signal
import threading

import httpx

from .harness import gateway_key, gateway_project, wait_for

STREAMS = 20


def _journal_lines(cluster) -> list[str]:
    folder = cluster.home / "usage"
    return [line for f in folder.glob("*.journal") for line in f.read_text().splitlines()]


def test_usage_of_streams_cut_by_a_kill_is_settled_by_the_next_start(cluster):
    cluster.start_agent("cpu-a", "--memory-gb", "8", "--cpus", "4", port_range="33200-33299")
    profile = {
        "name": "cpu",
        "engine": "sim",
        "cpu_cores": 1,
        "min_memory_gb": 1,
        # 20 tokens a second: the streams are still running when the server is killed.
        "args": ["--ttft-ms", "5", "--tokens-per-sec", "20", "--slots", str(STREAMS)],
        "startup_timeout": 60,
    }
    cluster.post("/models", {"name": "slow", "source": "org/slow", "profiles": [profile]})
    wait_for("a ready replica", lambda: len(cluster.ready_replicas("slow")) == 1)
    key = gateway_key(cluster, gateway_project(cluster, "acme"), "main")

    received = [0] * STREAMS  # the events each caller read before the server went away
    begun = threading.Barrier(STREAMS + 1)

    def stream(i: int) -> None:
        body = {"model": "slow", "messages": [{"role": "user", "content": "count"}]}
        try:
            with httpx.stream(
                "POST",
                f"{cluster.url}/v1/chat/completions",
                json={**body, "max_tokens": 5000, "stream": True},
                headers={"Authorization": f"Bearer {key['secret']}"},
                timeout=60,
            ) as resp:
                for line in resp.iter_lines():
                    if line.startswith("data:"):
                        received[i] += 1
                        if received[i] == 1:
                            begun.wait(timeout=30)
        except httpx.HTTPError:
            pass  # the server was killed

    threads = [threading.Thread(target=stream, args=(i,)) for i in range(STREAMS)]
    for t in threads:
        t.start()
    begun.wait(timeout=30)
    # The journal has heard how far each stream got (it is told once a second).
    wait_for(
        "the journal to hear of every stream's progress",
        lambda: (
            len({ln.split("\t")[1] for ln in _journal_lines(cluster) if ln[:2] == "p\t"}) == STREAMS
        ),
        timeout=15,
    )
    cluster.stop("serve", signal.SIGKILL)
    for t in threads:
        t.join(timeout=30)
    streamed = sum(received)
    assert all(received) and streamed >= 2 * STREAMS

    cluster.start_server()

    def recorded() -> dict | None:
        rows = [r for r in cluster.get("/usage", by="key")["rows"] if r["key_id"] == key["id"]]
        return rows[0] if rows else None

    row = wait_for("the killed server's usage", recorded, timeout=15)
    # Every stream counted, as cut, with what it streamed: not nothing, and no more than its
    # callers read; its prompt estimated, and said to be.
    assert (row["requests"], row["errors"]) == (STREAMS, STREAMS)
    assert STREAMS <= row["completion_tokens"] <= streamed
    assert row["prompt_tokens"] > 0 and row["estimated_tokens"] == row["prompt_tokens"]
    # The dead process's journal is gone; the new process keeps its own.
    assert len(list((cluster.home / "usage").glob("*.journal"))) == 1
    assert "usage of a gateway process that died settled" in cluster.log("serve")
