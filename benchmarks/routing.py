"""Prefix-aware routing against routing by load and in turn, on a multi-turn trace.

Everything is a real process on 127.0.0.1, in a temporary LLMGW_HOME, stopped at the end:
an embedded `llmgw serve` and one `llmgw agent` (a CPU node); with DATABASE_URL and
REDIS_URL set, two `llmgw serve` processes on two ports sharing them (and the Celery
workers production runs), each conversation's turns sent through one and the other in
turn, so no gateway process sees every turn of any conversation. Two setups, one after the
other:

- **sim**: a model with 4 replicas of `llmgw sim-engine` modelling a prefix cache
  (`--prefix-cache-tokens`, LRU of 16-token blocks) and prefill time
  (`--prefill-tokens-per-sec`): a prompt's time to first token is its uncached tokens
  over that rate, as on an engine with automatic prefix caching;
- **llamacpp**: a model with 2 replicas of a real `llama-server` (Gemma 3 270M Q4_K_M on
  the CPU, one thread each, two slots, its own prompt cache), when one is built
  (`llmgw engines build llamacpp`); else one line saying so.

The trace, for each routing in turn (`prefix`, `least_loaded`, `round_robin`, set on the
model's profile over REST: routing restarts nothing, so the same replicas serve all
three), after a warm-up that is not measured: SESSIONS conversations, CONCURRENCY at
once, each of TURNS turns sharing one long system prompt; each turn repeats the
conversation so far (the earlier questions and the engine's answers) and asks a new
question, 0.5 to 1.5 s after the last answer (the person reading and writing), streamed
through the gateway with the official `openai` client. Each routing gets a system prompt
and questions of its own, of the same lengths, so what one left in the engines' caches
does not help the next. With two gateways, prefix routing is also run through the first
alone (`prefix_one_gateway`), the share cached to compare with. The sim engines' caches hold about 6 of the 16 conversations
going on at once; each llama-server has 2 slots for the 4 going on at once.

Figures per setup and routing: time to first token p50 and p95 (the client's, to the
first content chunk), the share of prompt tokens the engines found cached (their
`usage.prompt_tokens_details.cached_tokens`), requests per replica (the
`X-Llmgw-Replica` header) as the busiest over the mean; and prefix's TTFT p50 as a share
lower than least_loaded's, round_robin's and each router's. Aim (issue 16): ≥ 30 % lower than
least_loaded, no replica above 1.5 × the mean; through two gateways (issue 39) the same,
and the share cached within 5 % of one gateway's.

The Rust routers (issue 41): on the sim setup, the same trace through vLLM's `vllm-router`
and SGLang's `sglang-router` (`smg launch`) with their `cache_aware` policy, each from
PyPI in a venv of its own (benchmarks/peers.py), started on loopback in front of 4 sim
engines with the same arguments as llmgw's replicas. Those engines are started here, not
by the agent, because a router passes the caller's one key on to every engine and each of
llmgw's replicas takes a key of its own. Requests per engine come from the engines' own
counters. A router that cannot be installed, or is left out (BENCH_VLLM_ROUTER=0,
BENCH_SGLANG_ROUTER=0), is a line saying so.

BENCH_ROUTING_SESSIONS, BENCH_ROUTING_TURNS, BENCH_ROUTING_CONCURRENCY scale the sim
trace; BENCH_ROUTING_SIM=0 leaves the sim engines out, BENCH_ROUTING_LLAMACPP=0 the real
ones; BENCH_ROUTING_GATEWAYS=1 runs one gateway even where two could run.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks.peers import ROUTERS, Procs, start_router  # noqa: E402
from tests.e2e.harness import (  # noqa: E402
    Cluster,
    engine_gauge,
    free_port,
    gateway_key,
    gateway_project,
    wait_for,
)
from tests.e2e.real_engines import gemma_gguf, llama_server  # noqa: E402

ROUTINGS = ("prefix", "least_loaded", "round_robin")
SIM = {
    "replicas": 4,
    "sessions": int(os.environ.get("BENCH_ROUTING_SESSIONS", 48)),
    "turns": int(os.environ.get("BENCH_ROUTING_TURNS", 4)),
    "concurrency": int(os.environ.get("BENCH_ROUTING_CONCURRENCY", 16)),
    "system_words": 1000,
    "question_words": 200,
    "max_tokens": 100,
    "think_s": (0.5, 1.5),
}
# A GPU's order of prefill, decode slowed to what 2 cores of sim engines keep up with, and
# a cache holding about 6 conversations of the 16 going on at once: each replica holds its
# share of them when they stay put, and not all of them when they are scattered.
SIM_ARGS = [
    "--prefill-tokens-per-sec", "10000", "--prefix-cache-tokens", "8192",
    "--ttft-ms", "5", "--tokens-per-sec", "400", "--slots", "4",
]  # fmt: skip
LLAMACPP = {
    "replicas": 2,
    "sessions": 8,
    "turns": 3,
    "concurrency": 4,
    "system_words": 300,
    "question_words": 80,
    "max_tokens": 32,
    "think_s": (0.5, 1.5),
}
WORDS = [
    "cluster",
    "node",
    "replica",
    "engine",
    "token",
    "cache",
    "prompt",
    "memory",
    "tensor",
    "kernel",
    "rack",
    "power",
    "budget",
    "fabric",
    "switch",
    "queue",
    "batch",
    "latency",
    "throughput",
    "schedule",
    "placement",
    "weight",
    "model",
    "shard",
    "slot",
    "context",
    "window",
    "prefix",
    "block",
    "hash",
    "route",
    "load",
    "balance",
    "gateway",
    "tenant",
    "quota",
]


def _emit(setup: str, figure: str, value, unit: str, scale: dict, **extra) -> None:
    line = {"bench": "routing", "setup": setup, "figure": figure, "value": value, "unit": unit}
    print(json.dumps({**line, **extra, "scale": scale}), flush=True)


def _load1() -> float:
    return round(os.getloadavg()[0], 2)


def _text(rng: random.Random, words: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(words))


async def _turn(client, model: str, messages: list[dict], max_tokens: int) -> dict:
    """One streamed turn: the client's time to first content, the usage, who served it."""
    started = time.perf_counter()
    first = None
    parts: list[str] = []
    usage = None
    raw = await client.chat.completions.with_raw_response.create(
        model=model,
        messages=messages,
        max_tokens=max_tokens,
        stream=True,
        stream_options={"include_usage": True},
        extra_body={"ignore_eos": True},
    )
    replica = raw.headers.get("x-llmgw-replica", "")
    async for chunk in raw.parse():
        if chunk.choices and chunk.choices[0].delta.content:
            if first is None:
                first = time.perf_counter() - started
            parts.append(chunk.choices[0].delta.content)
        if chunk.usage is not None:
            usage = chunk.usage
    details = getattr(usage, "prompt_tokens_details", None)
    cached = (getattr(details, "cached_tokens", None) or 0) if details else 0
    return {
        "ttft": first if first is not None else time.perf_counter() - started,
        "answer": "".join(parts),
        "prompt": usage.prompt_tokens if usage else 0,
        "cached": cached,
        "replica": replica,
    }


async def _trace(urls: list[str], secret: str, model: str, shape: dict, seed: int) -> list[dict]:
    """The conversations, conversation i's turn t through gateway (i + t) % len(urls)."""
    from openai import AsyncOpenAI

    rng = random.Random(seed)
    system = _text(rng, shape["system_words"])
    sessions = [
        [_text(rng, shape["question_words"]) for _ in range(shape["turns"])]
        for _ in range(shape["sessions"])
    ]
    pace = random.Random(seed + 100)
    results: list[dict] = []
    gate = asyncio.Semaphore(shape["concurrency"])
    clients = [
        AsyncOpenAI(base_url=f"{url}/v1", api_key=secret, max_retries=0, timeout=300)
        for url in urls
    ]

    async def conversation(i: int, questions: list[str]) -> None:
        async with gate:
            messages = [{"role": "system", "content": system}]
            for turn, q in enumerate(questions):
                if turn:  # the person reads the answer and writes the next question
                    await asyncio.sleep(pace.uniform(*shape["think_s"]))
                messages.append({"role": "user", "content": q})
                client = clients[(i + turn) % len(clients)]
                done = await _turn(client, model, messages, shape["max_tokens"])
                messages.append({"role": "assistant", "content": done["answer"]})
                results.append({**done, "turn": turn})

    try:
        await asyncio.gather(*(conversation(i, q) for i, q in enumerate(sessions)))
    finally:
        for client in clients:
            await client.close()
    return results


def _routing_set(cluster: Cluster, model: dict, routing: str) -> None:
    """The model's profile routed by `routing`, and the gateway's tables showing it."""
    body = {**model, "profiles": [{**model["profiles"][0], "routing": routing}]}
    r = cluster.client.put(f"/models/{model['name']}", json=body)
    assert r.status_code == 200, f"PUT /models/{model['name']}: {r.status_code} {r.text}"
    time.sleep(3)  # the gateway reads its tables every second; a catalog change rebuilds them


def _figures(setup: str, results: dict[str, list[dict]], scale: dict,
             served_by: dict[str, dict[str, int]] | None = None) -> None:  # fmt: skip
    """Each routing's figures, and prefix's TTFT p50 against every other's; `served_by`
    gives the requests per replica where the answers do not name it (the routers')."""
    p50 = {}
    for routing, rs in results.items():
        ttft = sorted(r["ttft"] * 1000 for r in rs)
        p50[routing] = statistics.median(ttft)
        p95 = ttft[min(len(ttft) - 1, int(len(ttft) * 0.95))]
        prompt = sum(r["prompt"] for r in rs)
        served: dict[str, int] = {}
        for r in rs:
            served[r["replica"]] = served.get(r["replica"], 0) + 1
        served = (served_by or {}).get(routing, served)
        mean = len(rs) / scale["replicas"]
        of = {"routing": routing, "requests": len(rs)}
        _emit(setup, "ttft_p50", round(p50[routing], 1), "ms", scale, **of)
        _emit(setup, "ttft_p95", round(p95, 1), "ms", scale, **of)
        share = sum(r["cached"] for r in rs) / prompt if prompt else None
        _emit(setup, "prompt_tokens_cached", round(share, 3) if share is not None else None,
              "share", scale, **of)  # fmt: skip
        _emit(setup, "busiest_replica_over_mean", round(max(served.values()) / mean, 2),
              "ratio", scale, **of, served=dict(sorted(served.items())))  # fmt: skip
    for other in (r for r in results if r not in ("prefix", "prefix_one_gateway")):
        _emit(setup, f"prefix_ttft_p50_lower_than_{other}",
              round(1 - p50["prefix"] / p50[other], 3), "share", scale)  # fmt: skip
    if "prefix_one_gateway" in results:
        share = {r: sum(x["cached"] for x in results[r]) / max(sum(x["prompt"] for x in results[r]), 1)
                 for r in ("prefix", "prefix_one_gateway")}  # fmt: skip
        _emit(setup, "prefix_cached_share_below_one_gateways",
              round(1 - share["prefix"] / share["prefix_one_gateway"], 3), "share", scale)  # fmt: skip


def _run(
    cluster: Cluster,
    urls: list[str],
    setup: str,
    model: dict,
    shape: dict,
    extra_scale: dict,
    routers: Callable[[dict], tuple[dict, dict]] | None = None,
) -> None:
    cluster.post("/models", model)
    wait_for(
        f"{shape['replicas']} replicas of {model['name']}",
        lambda: len(cluster.ready_replicas(model["name"])) == shape["replicas"],
        timeout=600,
        every=0.5,
    )
    project = gateway_project(cluster, f"bench-{setup}")
    secret = gateway_key(cluster, project, "routing")["secret"]
    wait_for(
        "every gateway to know the key",
        lambda: all(
            httpx.get(f"{u}/v1/models", headers={"Authorization": f"Bearer {secret}"}).status_code
            == 200
            for u in urls
        ),
        timeout=20,
    )
    scale = {**shape, **extra_scale, "gateways": len(urls), "load1_before": _load1(),
             "cpus": len(os.sched_getaffinity(0))}  # fmt: skip
    # A warm-up, not measured: the engines' first requests and the client's first
    # connections would otherwise slow whichever routing goes first.
    warm = {**shape, "sessions": shape["concurrency"], "turns": 1}
    asyncio.run(_trace(urls, secret, model["name"], warm, 99))
    runs = [(routing, routing, urls) for routing in ROUTINGS]
    if len(urls) > 1:
        runs.append(("prefix_one_gateway", "prefix", urls[:1]))
    results = {}
    for i, (name, routing, through) in enumerate(runs):
        _routing_set(cluster, model, routing)
        results[name] = asyncio.run(_trace(through, secret, model["name"], shape, i))
    served_by: dict[str, dict[str, int]] = {}
    if routers is not None:
        theirs, served_by = routers(shape)
        results.update(theirs)
    scale["load1_after"] = _load1()
    _figures(setup, results, scale, served_by)


def _sim(cluster: Cluster, urls: list[str]) -> None:
    sim = {
        "name": "routing-sim", "source": "hf://bench/routing", "scaling": {"min": SIM["replicas"]},
        "profiles": [{"name": "cpu", "engine": "sim", "cpu_cores": 1, "min_memory_gb": 1,
                      "args": SIM_ARGS}],
    }  # fmt: skip

    def routers(shape: dict) -> tuple[dict, dict]:
        return _routers(cluster.home, sim["name"], shape)

    theirs = ", ".join(f"{r.name} {r.version}" for r in ROUTERS)
    extra = {"sim_args": " ".join(SIM_ARGS),
             "routers": f"{theirs}: cache_aware, each before {SIM['replicas']} sim engines of its own"}  # fmt: skip
    _run(cluster, urls, "sim", sim, SIM, extra, routers)
    cluster.client.delete("/models/routing-sim")


def _routers(home: Path, model: str, shape: dict) -> tuple[dict, dict]:
    """The trace through each Rust router's `cache_aware` policy in front of replicas of
    its own: as many sim engines as llmgw's, with the same arguments, started here with
    one key (the routers pass the caller's key on, and each of llmgw's replicas takes a key
    of its own). Each router's warm-up and prompts are its own, as each routing's are. The
    results by router, and the requests each engine served, from the engines' counters."""
    procs = Procs(home)
    key = "sk-routers-" + os.urandom(12).hex()
    results: dict[str, list[dict]] = {}
    served_by: dict[str, dict[str, int]] = {}
    try:
        engines = _engines(procs, model, key, shape["replicas"])
        for i, router in enumerate(ROUTERS):
            name = f"{router.name}_cache_aware"
            peer, why = start_router(procs.spawn, home, router, engines, key, model)
            if peer is None:
                print(json.dumps({"bench": "routing", "setup": "sim", "routing": name,
                                  "skipped": why}), flush=True)  # fmt: skip
                continue
            url = f"http://127.0.0.1:{peer.port}"
            warm = {**shape, "sessions": shape["concurrency"], "turns": 1}
            asyncio.run(_trace([url], key, model, warm, 199 + i))
            before = [engine_gauge(e, "requests_total") for e in engines]
            results[name] = asyncio.run(_trace([url], key, model, shape, 10 + i))
            after = [engine_gauge(e, "requests_total") for e in engines]
            served_by[name] = {
                e: int(a - b) for e, a, b in zip(engines, after, before, strict=True)
            }
    finally:
        procs.stop()
    return results, served_by


def _engines(procs: Procs, model: str, key: str, count: int) -> list[str]:
    """`count` sim engines serving `model` with SIM_ARGS and `key`, once each answers."""
    env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "REDIS_URL")}
    env["LLMGW_ENGINE_API_KEY"] = key
    urls = []
    for n in range(count):
        port = free_port()
        cmd = [sys.executable, "-m", "llmgw", "sim-engine", "--port", str(port), "--model", model,
               "--threads", "1", *SIM_ARGS]  # fmt: skip
        procs.spawn(f"router-engine-{n}", cmd, env)
        urls.append(f"http://127.0.0.1:{port}")
    for url in urls:
        wait_for(
            f"the sim engine at {url}", lambda u=url: httpx.get(f"{u}/health").status_code == 200
        )
    return urls


def _second_gateway(cluster: Cluster) -> str:
    """Another `llmgw serve` on a port of its own, sharing the first's database and Redis:
    another server, with nothing in memory in common. Its URL."""
    port = free_port()
    cmd = [sys.executable, "-m", "llmgw", "serve", "--port", str(port)]
    proc = cluster._spawn("serve-2", cmd)
    url = f"http://127.0.0.1:{port}"
    wait_for(
        "the second llmgw serve to answer",
        lambda: proc.poll() is None and httpx.get(f"{url}/api/v1/openapi.json"),
    )
    return url


def main() -> int:
    home = Path(tempfile.mkdtemp(prefix="llmgw-bench-routing-"))
    shared = bool(os.environ.get("DATABASE_URL") and os.environ.get("REDIS_URL"))
    two = shared and os.environ.get("BENCH_ROUTING_GATEWAYS", "2") != "1"
    cluster = Cluster(home, production=two)
    try:
        cluster.start_server()
        urls = [cluster.url, _second_gateway(cluster)] if two else [cluster.url]
        cluster.start_agent("cpu-sim", "--cpus", "8", "--memory-gb", "32", port_range="35000-35099")
        wait_for("the node", lambda: [n["state"] for n in cluster.get("/nodes")] == ["ready"])
        if os.environ.get("BENCH_ROUTING_SIM", "1") != "0":
            _sim(cluster, urls)
        binary, why = llama_server()
        if os.environ.get("BENCH_ROUTING_LLAMACPP", "1") == "0" or binary is None:
            skipped = why or "BENCH_ROUTING_LLAMACPP=0"
            print(json.dumps({"bench": "routing", "setup": "llamacpp", "skipped": skipped}))
            return 0
        cluster.start_agent(
            "cpu-real", "--llama-server", str(binary), "--cpus", "2", "--memory-gb", "8",
            "--labels", "engine=llamacpp", port_range="35100-35199",
        )  # fmt: skip
        wait_for("the llama.cpp node", lambda: len(cluster.get("/nodes")) == 2)
        real = {
            "name": "routing-gemma", "source": str(gemma_gguf()),
            "scaling": {"min": LLAMACPP["replicas"]},
            "profiles": [{"name": "cpu", "engine": "llamacpp", "cpu_cores": 1, "min_memory_gb": 2,
                          "node_selector": {"engine": "llamacpp"}, "startup_timeout": 300,
                          "args": ["--ctx-size", "8192", "--parallel", "2", "--threads", "1"]}],
        }  # fmt: skip
        _run(cluster, urls, "llamacpp", real, LLAMACPP, {"model": "gemma-3-270m Q4_K_M"})
    except httpx.HTTPError as exc:
        print(json.dumps({"bench": "routing", "failed": str(exc)}), flush=True)
        return 1
    finally:
        cluster.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
