"""Heartbeats one `llmgw serve` process handles per second, over real websockets, 8-GPU payloads.

Starts an embedded `llmgw serve` in a temporary LLMGW_HOME, registers AGENTS
simulated nodes with 8 GPUs each, then has every agent send heartbeats back to
back for SECONDS. Handling is measured with probes: every PROBE_EVERY
heartbeats an agent repeats the last seq, which the server answers with an
error frame only after it has handled everything before it on that
connection, so the time from a heartbeat to that answer is an upper bound on
its handling time, queueing included. The client runs on the same 2 cores.
"""

from __future__ import annotations

import asyncio
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time

import httpx
import websockets

AGENTS = int(os.environ.get("BENCH_AGENTS", 50))
SECONDS = float(os.environ.get("BENCH_SECONDS", 10))
PROBE_EVERY = 20


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _heartbeat(seq: int) -> str:
    gpus = [
        {"index": i, "temp_c": 61.0 + i, "memory_temp_c": 70.0, "power_w": 412.5, "power_limit_w": 700.0,
         "throttle": [], "utilization": 87.0, "memory_used_mb": 71234}
        for i in range(8)
    ]  # fmt: skip
    return json.dumps(
        {"type": "heartbeat", "seq": seq, "memory_total_mb": 2_063_000, "cpu_count": 192,
         "load": {"cpu_percent": 23.5, "load1": 11.2, "load5": 10.9, "load15": 10.1,
                  "memory_used_bytes": 412_000_000_000, "memory_available_bytes": 1_600_000_000_000,
                  "cpu_temp_c": 58.0, "cpu_power_w": 310.0, "inlet_temp_c": 24.0, "gpus": gpus},
         "shards": [{"shard_id": "chat-abc123-0", "state": "ready"}]}
    )  # fmt: skip


async def _agent(url: str, token: str, n: int, stop_at: float, latencies: list[float]) -> int:
    register = {
        "type": "register", "node_id": f"bench-{n:05d}", "hostname": f"bench-{n}", "mgmt_addr": "127.0.0.1",
        "memory_total_mb": 2_063_000, "cpu_count": 192, "engines": {"sim": "1"}, "engines_probed": True,
        "gpus": [{"index": i, "uuid": f"GPU-{n}-{i}", "name": "NVIDIA H100 80GB HBM3", "memory_total_mb": 81559}
                 for i in range(8)],
    }  # fmt: skip
    async with websockets.connect(
        url, additional_headers={"Authorization": f"Bearer {token}"}, max_queue=None
    ) as ws:
        await ws.send(json.dumps(register))
        assert json.loads(await ws.recv())["type"] == "registered"
        seq, handled = 0, 0
        while time.monotonic() < stop_at:
            for _ in range(PROBE_EVERY):
                seq += 1
                await ws.send(_heartbeat(seq))
            sent = time.perf_counter()
            await ws.send(
                _heartbeat(seq)
            )  # repeats the seq: answered once all before it are handled
            reply = json.loads(await ws.recv())
            assert reply["type"] == "error", reply
            latencies.append(time.perf_counter() - sent)
            handled += PROBE_EVERY
        return handled


async def _drive(url: str, token: str) -> tuple[int, float, list[float]]:
    latencies: list[float] = []
    start = time.monotonic()
    counts = await asyncio.gather(
        *(_agent(url, token, n, start + SECONDS + 2, latencies) for n in range(AGENTS))
    )
    return sum(counts), time.monotonic() - start, latencies


def main() -> None:
    home = tempfile.mkdtemp(prefix="llmgw-bench-hb-")
    env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "REDIS_URL")}
    env["LLMGW_HOME"] = home
    llmgw = [sys.executable, "-m", "llmgw"]
    subprocess.run([*llmgw, "migrate"], env=env, check=True, capture_output=True)
    token = subprocess.run([*llmgw, "createtoken", "--agent", "bench"], env=env, check=True, capture_output=True,
                           text=True).stdout.strip().splitlines()[-1]  # fmt: skip
    port = _free_port()
    serve = [*llmgw, "serve", "--port", str(port)]
    if os.environ.get("BENCH_PROFILE"):
        serve = [
            sys.executable,
            "-m",
            "cProfile",
            "-o",
            os.environ["BENCH_PROFILE"],
            "-m",
            "llmgw",
            *serve[3:],
        ]
    log = open(os.path.join(home, "serve.log"), "wb")  # noqa: SIM115 - the server writes it until the end
    server = subprocess.Popen(serve, env=env, stdout=subprocess.DEVNULL, stderr=log)
    try:
        for _ in range(300):
            if server.poll() is not None:
                sys.exit(f"llmgw serve exited; see {home}/serve.log")
            try:
                httpx.get(f"http://127.0.0.1:{port}/api/v1/openapi.json", timeout=1)
                break
            except httpx.HTTPError:
                time.sleep(0.2)
        handled, elapsed, latencies = asyncio.run(_drive(f"ws://127.0.0.1:{port}/ws/agent/", token))
    finally:
        server.terminate()
        server.wait(timeout=20)
    latencies.sort()
    p = lambda q: round(latencies[min(len(latencies) - 1, int(q * len(latencies)))] * 1000, 1)  # noqa: E731
    scale = {"agents": AGENTS, "gpus_per_heartbeat": 8, "seconds": round(elapsed, 1), "cores": os.cpu_count(),
             "client_on_same_machine": True}  # fmt: skip
    print(json.dumps({"figure": "heartbeats_per_second", "value": round(handled / elapsed),
                      "per_core": round(handled / elapsed / (os.cpu_count() or 1)), "aim_per_core": 2500,
                      "scale": scale}), flush=True)  # fmt: skip
    print(json.dumps({"figure": "heartbeat_handling_ms", "p50": p(0.5), "p99": p(0.99), "aim_p99": 100,
                      "median_of_probes": round(statistics.median(latencies) * 1000, 1), "scale": scale}), flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
