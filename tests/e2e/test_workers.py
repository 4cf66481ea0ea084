"""`llmgw serve --workers 2`: two processes serving one port, one cluster (issue 13, item 5).

An agent connected to one worker is told what a change made through the other caused, a
key's limit holds over requests the two answered, and a stop reaches both workers, which
stop gracefully."""

from __future__ import annotations

import http.client
import json
import signal
import socket
import time
from pathlib import Path

import httpx

from .harness import (
    SMALL,
    Cluster,
    client_ports,
    gateway_key,
    gateway_project,
    needs_production,
    serving_pid,
    wait_for,
)

pytestmark = needs_production


def _workers(parent: int) -> list[int]:
    """The worker processes of an `llmgw serve` (its children serving the port)."""
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            stat = (proc / "stat").read_text()
            cmdline = (proc / "cmdline").read_bytes()
        except OSError:
            continue
        if int(stat.rsplit(")", 1)[1].split()[1]) == parent and b"--worker-fd" in cmdline:
            found.append(int(proc.name))
    return sorted(found)


def _connection_to(cluster: Cluster, worker: int, workers: list[int]) -> http.client.HTTPConnection:
    """An HTTP connection the kernel gave to `worker` (opened until one is)."""
    for _ in range(200):
        conn = http.client.HTTPConnection("127.0.0.1", cluster.port, timeout=10)
        conn.connect()
        if serving_pid(cluster.port, conn.sock.getsockname()[1], workers) == worker:
            return conn
        conn.close()
    raise AssertionError(f"no connection reached worker {worker}")


def _holders(cluster: Cluster, opened: list[socket.socket], workers: list[int]) -> list[int] | None:
    """Which worker holds each of the `opened` connections, once every one is accepted."""
    held = [serving_pid(cluster.port, c.getsockname()[1], workers) for c in opened]
    return None if None in held else held


def test_two_workers_serve_one_cluster_and_stop_gracefully(tmp_path):
    cluster = Cluster(tmp_path, production=True)
    try:
        cluster.start_server("--workers", "2")
        parent = cluster.procs["serve"].pid
        workers = wait_for("two workers", lambda: w if len(w := _workers(parent)) == 2 else None)
        # Each worker listens on a socket of its own: the kernel spreads connections over
        # both (one shared socket gave one of two workers 43 of 64).
        opened = [socket.create_connection(("127.0.0.1", cluster.port)) for _ in range(32)]
        held = wait_for("the 32 connections accepted", lambda: _holders(cluster, opened, workers))
        for conn in opened:
            conn.close()
        assert {held.count(w) > 0 for w in workers} == {True}, held
        cluster.start_agent("cpu-a", "--memory-gb", "8", "--cpus", "4", port_range="32100-32199")
        agent = cluster.procs["agent-cpu-a"].pid
        wait_for("the node", lambda: cluster.client.get("/nodes/cpu-a").status_code == 200)
        [agent_port] = wait_for(
            "the agent's connection", lambda: client_ports(agent, cluster.port) or None
        )
        holder = serving_pid(cluster.port, agent_port, workers)
        other = next(w for w in workers if w != holder)
        assert holder in workers

        # A model added through the other worker starts on the agent the first one holds.
        conn = _connection_to(cluster, other, workers)
        headers = {"Authorization": f"Bearer {cluster.admin_token}"}
        conn.request("POST", "/api/v1/models", json.dumps(SMALL), headers)
        assert conn.getresponse().status == 201
        conn.close()
        wait_for("a ready replica", lambda: cluster.ready_replicas("small") or None, timeout=60)

        # A limit of 3 a minute holds over requests both workers answer.
        key = gateway_key(
            cluster, gateway_project(cluster, "acme"), "k", limits={"requests_per_minute": 3}
        )
        auth = {"Authorization": f"Bearer {key['secret']}", "Content-Type": "application/json"}
        ask = json.dumps({"model": "small", "messages": [{"role": "user", "content": "hi"}]})
        answered = {w: [] for w in workers}
        for w in [holder, other, holder, other, holder, other]:
            conn = _connection_to(cluster, w, workers)
            conn.request("POST", "/v1/chat/completions", ask, auth)
            answered[w].append(conn.getresponse().status)
            conn.close()
        statuses = sorted(s for got in answered.values() for s in got)
        assert statuses == [200, 200, 200, 429, 429, 429], answered
        assert all(answered[w] for w in workers)

        # Either worker's /metrics counts the requests both answered.
        for w in workers:
            conn = _connection_to(cluster, w, workers)
            conn.request("GET", "/metrics")
            text = conn.getresponse().read().decode()
            conn.close()
            assert 'llmgw_gateway_requests_total{code="200",model="small"} 3.0' in text, text
            assert 'llmgw_gateway_requests_total{code="429",model="small"} 3.0' in text, text
            assert 'llmgw_gateway_errors_total{model="small",reason="limit"} 3.0' in text, text

        # Forgotten through the other worker, the node's connection on the first is closed
        # and its agent joins again.
        conn = _connection_to(cluster, other, workers)
        conn.request("DELETE", "/api/v1/nodes/cpu-a", headers=headers)
        assert conn.getresponse().status == 200
        conn.close()
        wait_for(
            "the agent to join again",
            lambda: (
                httpx.get(f"{cluster.url}/api/v1/nodes/cpu-a", headers=headers).status_code == 200
                and client_ports(agent, cluster.port) not in ([], [agent_port])
            ),
            timeout=60,
        )

        # A stop reaches both workers: each stops gracefully, then the first process ends.
        serve = cluster.procs.pop("serve")
        serve.send_signal(signal.SIGTERM)
        assert serve.wait(timeout=60) == 0
        log = cluster.log("serve")
        assert log.count("llmgw serve: stopped after") == 2, log
        assert "asked again" not in log
        time.sleep(0.5)
        assert _workers(parent) == []
    finally:
        cluster.close()
