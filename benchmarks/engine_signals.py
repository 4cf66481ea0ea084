"""Routing by the engines' own queue against routing by in-flight counts, with two gateway
processes sharing the replicas (issue 36, item 4).

Everything is a real process on 127.0.0.1, stopped at the end: REPLICAS `llmgw
sim-engine`s (SLOTS requests at once each, more wait, with a prefix cache and a prefill
rate, publishing vLLM's series), and two gateway processes, each this file run with
`--gateway`. A gateway process holds the gateway's own routing state (`State`: its tables,
its in-flight counts) and picks each request's replica with
`State.pick`, the gateway's code, and streams it to the engine the way the gateway does,
counting it in flight meanwhile; each process is the load of its own clients too
(CLIENTS workers, back to back, a think time between), and measures the time to the
first token. What it does not do is the gateway's HTTP front, keys and limits: the same
for both routings.

The trace: every request shares a long system prompt (a chat application's) and asks a
question of its own, so prefix routing keeps them on the replicas that served the prompt,
up to the imbalance it allows: an imbalance each gateway judges by its own requests in
flight, so two gateways pile twice that on a holder. Two ways the gateways route, each
with the same trace, after a warm-up that is not measured:

- **inflight**: as before issue 36, by this gateway's requests in flight alone;
- **engines**: also by what the engines said (`scoring.replica_load`), read every
  READ_S seconds, as the gateway reads what the agents reported (each agent reads its
  engines' metrics every heartbeat).

Figures per routing: TTFT p50 and p95 (ms), the engines' largest queue seen, requests per
replica as the busiest over the mean. BENCH_SIGNALS_SECONDS, BENCH_SIGNALS_CLIENTS and
BENCH_SIGNALS_READ_S scale it. One JSON line per routing, then one comparing them.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests.e2e.harness import free_port, wait_for  # noqa: E402

REPLICAS = 4
SLOTS = 4
CLIENTS = int(os.environ.get("BENCH_SIGNALS_CLIENTS", 6))  # per gateway process
SECONDS = float(os.environ.get("BENCH_SIGNALS_SECONDS", 30))
WARM_S = 5.0
READ_S = float(os.environ.get("BENCH_SIGNALS_READ_S", 2))
DIRECT = int(os.environ.get("BENCH_SIGNALS_DIRECT", 4))  # another client's, on the first replica
MAX_TOKENS = 100
THINK_S = (0.0, 1.0)
SYSTEM_WORDS = 1500
QUESTION_WORDS = 60
SIM_ARGS = [
    "--slots", str(SLOTS), "--ttft-ms", "5", "--tokens-per-sec", "50",
    "--prefill-tokens-per-sec", "20000", "--prefix-cache-tokens", "16384",
    "--kv-cache-tokens", str(SLOTS * 2000),
]  # fmt: skip
MODEL = "chat"


def words(rng: random.Random, n: int) -> str:
    vocabulary = [
        "gpu",
        "node",
        "replica",
        "cache",
        "token",
        "prompt",
        "answer",
        "model",
        "fleet",
        "queue",
        "batch",
    ]
    return " ".join(rng.choice(vocabulary) for _ in range(n))


# A gateway process


async def gateway(args: argparse.Namespace) -> None:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "llmgw.settings")
    import django

    django.setup()
    import logging

    import httpx

    logging.getLogger("httpx").setLevel(logging.WARNING)

    from fleet.agent.engines import engine_load
    from fleet.domain.readings import Reading
    from llmgw.gateway.state import Request, State
    from llmgw.gateway.tables import Key, Tables, Upstream

    urls = json.loads(args.urls)
    state = State()
    ups = tuple(
        Upstream(f"r{i}", MODEL, url, "Bearer -", 1, routing="prefix") for i, url in enumerate(urls)
    )
    state.tables = Tables(upstreams={MODEL: ups})
    key = Key(1, "bench", "sk-", 1, ("project:1",), None, None, None)
    rng = random.Random(args.seed)
    system = words(random.Random(7), SYSTEM_WORDS)  # the same in both processes
    ttfts: list[float] = []
    served: dict[str, int] = {}
    queues: list[int] = []
    start = time.monotonic()
    measure_from, end = start + WARM_S, start + WARM_S + args.seconds

    async def read(client: httpx.AsyncClient) -> None:
        while time.monotonic() < end:
            readings = {}
            for up in ups:
                try:
                    text = (await client.get(f"{up.url}/metrics")).text
                except httpx.HTTPError:
                    continue
                said = engine_load("sim", text)
                queues.append(int(said.get("waiting", 0)))
                readings[up.replica_id] = Reading(
                    said.get("running"), said.get("waiting"), said.get("kv_cache")
                )
            if args.routing == "engines":
                state.readings_read(readings)
            await asyncio.sleep(READ_S)

    async def direct(client: httpx.AsyncClient) -> None:
        """Another client of the first replica's engine, which no gateway sees."""
        while time.monotonic() < end:
            body = {"model": MODEL, "messages": [{"role": "user", "content": words(rng, 200)}],
                    "max_tokens": MAX_TOKENS}  # fmt: skip
            await client.post(f"{ups[0].url}/v1/chat/completions", json=body)

    async def worker(client: httpx.AsyncClient) -> None:
        while time.monotonic() < end:
            body = {
                "model": MODEL,
                "messages": [
                    {"role": "system", "content": system},
                    {"role": "user", "content": words(rng, QUESTION_WORDS)},
                ],
                "max_tokens": MAX_TOKENS,
                "stream": True,
            }
            req = Request(key, "chat", "/v1/chat/completions", body, b"", True, False, 0.0)
            picked = state.pick(MODEL, set(), req)
            up = picked.up
            state.inflight[up.replica_id] = state.inflight.get(up.replica_id, 0) + 1
            sent = time.monotonic()
            first = None
            try:
                async with client.stream("POST", f"{up.url}/v1/chat/completions", json=body) as r:
                    async for line in r.aiter_lines():
                        if first is None and '"content": "' in line:
                            first = time.monotonic() - sent
            finally:
                state.inflight[up.replica_id] -= 1
            if sent >= measure_from and first is not None:
                ttfts.append(first * 1000)
                served[up.replica_id] = served.get(up.replica_id, 0) + 1
            await asyncio.sleep(rng.uniform(*THINK_S))

    limits = httpx.Limits(max_connections=CLIENTS + 8)
    async with httpx.AsyncClient(timeout=120, limits=limits) as client:
        await asyncio.gather(
            read(client),
            *(worker(client) for _ in range(args.clients)),
            *(direct(client) for _ in range(args.direct)),
        )
    print(json.dumps({"ttfts": ttfts, "served": served, "queues": queues}))


# The driver


def percentile(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(len(ordered) * p / 100))]


def run_routing(routing: str, urls: list[str], home: str) -> dict:
    env = {**os.environ, "LLMGW_HOME": home, "PYTHONPATH": str(REPO)}
    cmd = [sys.executable, __file__, "--gateway", "--routing", routing, "--urls", json.dumps(urls)]
    cmd += ["--seconds", str(SECONDS), "--clients", str(CLIENTS)]
    procs = [
        subprocess.Popen(
            [*cmd, "--seed", str(seed), "--direct", str(DIRECT if seed == 1 else 0)],
            env=env,
            stdout=subprocess.PIPE,
            text=True,
        )
        for seed in (1, 2)
    ]
    outs = [
        json.loads(p.communicate(timeout=SECONDS + 120)[0].strip().splitlines()[-1]) for p in procs
    ]
    ttfts = [t for o in outs for t in o["ttfts"]]
    served: dict[str, int] = {}
    for o in outs:
        for r, n in o["served"].items():
            served[r] = served.get(r, 0) + n
    counts = [served.get(f"r{i}", 0) for i in range(len(urls))]
    return {
        "bench": "engine_signals",
        "routing": routing,
        "requests": len(ttfts),
        "ttft_mean_ms": round(statistics.mean(ttfts), 1),
        "ttft_p50_ms": round(statistics.median(ttfts), 1),
        "ttft_p95_ms": round(percentile(ttfts, 95), 1),
        "engine_queue_max": max(q for o in outs for q in o["queues"]),
        "busiest_over_mean": round(max(counts) / statistics.mean(counts), 2),
        "per_replica": counts,
        "scale": {
            "replicas": len(urls),
            "slots": SLOTS,
            "gateway_processes": 2,
            "clients_per_gateway": CLIENTS,
            "direct_clients_on_first_replica": DIRECT,
            "tokens_per_sec_per_request": 50,
            "seconds": SECONDS,
            "read_every_s": READ_S,
            "max_tokens": MAX_TOKENS,
            "system_words": SYSTEM_WORDS,
        },
    }


def main() -> int:
    engines, urls = [], []
    home = tempfile.mkdtemp(prefix="llmgw-bench-signals-")
    try:
        for _ in range(REPLICAS):
            port = free_port()
            engines.append(
                subprocess.Popen(
                    [sys.executable, "-m", "llmgw", "sim-engine", "--port", str(port),
                     "--model", MODEL, *SIM_ARGS],
                    cwd=REPO,
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                )
            )  # fmt: skip
            urls.append(f"http://127.0.0.1:{port}")
        import httpx

        for url in urls:
            wait_for(f"{url} to answer", lambda u=url: httpx.get(f"{u}/health").status_code == 200)
        results = {}
        for routing in ("inflight", "engines"):
            results[routing] = run_routing(routing, urls, home)
            print(json.dumps(results[routing]), flush=True)
        a, b = results["inflight"], results["engines"]
        print(
            json.dumps(
                {
                    "bench": "engine_signals",
                    "ttft_mean_lower_by": round(1 - b["ttft_mean_ms"] / a["ttft_mean_ms"], 3),
                    "ttft_p50_lower_by": round(1 - b["ttft_p50_ms"] / a["ttft_p50_ms"], 3),
                    "ttft_p95_lower_by": round(1 - b["ttft_p95_ms"] / a["ttft_p95_ms"], 3),
                }
            )
        )
    finally:
        for p in engines:
            p.terminate()
        for p in engines:
            p.wait(timeout=10)
    return 0


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--gateway", action="store_true")
    parser.add_argument("--routing", choices=("inflight", "engines"))
    parser.add_argument("--urls")
    parser.add_argument("--seconds", type=float, default=SECONDS)
    parser.add_argument("--clients", type=int, default=CLIENTS)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--direct", type=int, default=0)
    args = parser.parse_args()
    if args.gateway:
        asyncio.run(gateway(args))
        sys.exit(0)
    sys.exit(main())
