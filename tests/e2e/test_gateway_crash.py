"""A `llmgw serve` killed with streams in flight loses none of their usage: its journal is
settled by the next start (issue 35, item 5). Real server, agent and sim engine."""

from __future__ import annotations

import contextlib
import os
import signal
import threading
from pathlib import Path

import httpx

from .harness import _pids, gateway_key, gateway_project, wait_for

STREAMS = 20


def _streams_told(cluster) -> int:
    """The requests whose progress some journal holds: ids are each process's own (every
    worker of `--workers N` keeps a journal), so counted per journal."""
    folder = cluster.home / "usage"
    return len(
        {
            (f.name, line.split("\t")[1])
            for f in folder.glob("*.journal")
            for line in f.read_text().splitlines()
            if line[:2] == "p\t"
        }
    )


def _kill_serving(cluster) -> None:
    """`kill -9` of `llmgw serve` and of every worker it started (production runs one per
    core, in sessions of their own), at once: no process is left to stop gracefully."""
    proc = cluster.procs.pop("serve")
    workers = [p for p in _pids() if _parent(p) == proc.pid]
    for pid in [proc.pid, *workers]:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    proc.wait(timeout=10)
    wait_for("the workers to be gone", lambda: not any(_alive(p) for p in workers), timeout=10)


def _parent(pid: int) -> int | None:
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return None
    return next(
        (int(line.split()[1]) for line in status.splitlines() if line.startswith("PPid:")), None
    )


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


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
        lambda: _streams_told(cluster) == STREAMS,
        timeout=15,
    )
    dead = {f.name for f in (cluster.home / "usage").glob("*.journal")}
    _kill_serving(cluster)
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
    # The dead processes' journals are gone; the new serving processes keep their own.
    now = {f.name for f in (cluster.home / "usage").glob("*.journal")}
    assert now and not now & dead
    assert "usage of a gateway process that died settled" in cluster.log("serve")
