"""LoRA adapters on the sim engine, end to end (issue 43): how long the first request to an
adapter not yet loaded waits, and what N adapters on one base replica serve against N
models of a replica each.

A real `llmgw serve` (embedded) and one real agent running sim engines; requests through
the gateway with httpx. The sim engine answers at a set pace (TOKENS_PER_SEC per request,
SLOTS requests at once), so the throughput figures say how the gateway and the replica
share the work, not what a GPU computes: N adapters share one replica's SLOTS, N models
have SLOTS each. The agent's half (fleet/agent/adapters.py) must be there; without it one
line says so. BENCH_ADAPTERS (N, 4) and BENCH_ADAPTERS_SECONDS (15) scale it. One JSON line
per figure.

BENCH_ADAPTERS_ENGINE=llamacpp measures a real llama-server (the one `llmgw engines build
llamacpp` made) with the demo's base, SmolLM2-135M-Instruct, and N (default 2) LoRA GGUFs
written by tests/lora_files.py, one thread per replica: llama-server holds its adapters
from its start, so the first figure is each adapter's first answer against its next; the
second, N adapters on one llama-server against N llama-servers of the base, each its own
model.
"""

from __future__ import annotations

import concurrent.futures
import importlib.util
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

from tests.e2e.harness import Cluster, gateway_key, gateway_project, wait_for  # noqa: E402

ENGINE = os.environ.get("BENCH_ADAPTERS_ENGINE", "sim")
LLAMA = ENGINE == "llamacpp"
N = int(os.environ.get("BENCH_ADAPTERS", 2 if LLAMA else 4))
SECONDS = float(os.environ.get("BENCH_ADAPTERS_SECONDS", 15))
SLOTS = 4
TOKENS_PER_SEC = 200
MAX_TOKENS = 16 if LLAMA else 32
CLIENTS = 2 * SLOTS  # more than one replica's slots: the shared replica is the bound


def profile(slots: int) -> dict:
    if LLAMA:
        return {
            "name": "cpu",
            "engine": "llamacpp",
            "cpu_cores": 1,
            "min_memory_gb": 1,
            "adapter_slots": slots,
            "args": ["--ctx-size", "2048"],
            "startup_timeout": 180,
        }
    return {
        "name": "cpu",
        "engine": "sim",
        "cpu_cores": 1,
        "min_memory_gb": 0.25,
        "adapter_slots": slots,
        "args": ["--ttft-ms", "20", "--tokens-per-sec", str(TOKENS_PER_SEC), "--slots", str(SLOTS)],
        "startup_timeout": 60,
    }


def ask(c: httpx.Client, secret: str, model: str) -> tuple[int, float, int]:
    started = time.perf_counter()
    r = c.post(
        "/v1/chat/completions",
        json={
            "model": model,
            "messages": [{"role": "user", "content": "Tell me about the sea."}],
            "temperature": 0,
            "max_tokens": MAX_TOKENS,
        },
        headers={"Authorization": f"Bearer {secret}"},
        timeout=120,
    )
    tokens = r.json()["usage"]["completion_tokens"] if r.status_code == 200 else 0
    return r.status_code, time.perf_counter() - started, tokens


def load(cluster: Cluster, secret: str, models: list[str]) -> dict:
    """CLIENTS workers back to back for SECONDS, each on the models in turn."""
    deadline = time.monotonic() + SECONDS

    def worker(i: int) -> tuple[int, int, list[float]]:
        done = tokens = 0
        took = []
        with httpx.Client(base_url=cluster.url) as c:
            k = i
            while time.monotonic() < deadline:
                status, s, t = ask(c, secret, models[k % len(models)])
                k += 1
                if status == 200:
                    done, tokens = done + 1, tokens + t
                    took.append(s)
        return done, tokens, took

    with concurrent.futures.ThreadPoolExecutor(CLIENTS) as pool:
        results = list(pool.map(worker, range(CLIENTS)))
    took = sorted(s for _, _, t in results for s in t)
    return {
        "requests": sum(r[0] for r in results),
        "tok_per_s": round(sum(r[1] for r in results) / SECONDS, 1),
        "p50_ms": round(statistics.median(took) * 1000, 1) if took else None,
    }


def main() -> int:
    if importlib.util.find_spec("fleet.agent.adapters") is None:
        print(json.dumps({"bench": "adapters", "skipped": "the agent's adapters half is not here"}))
        return 0
    if LLAMA:
        from tests.e2e.real_engines import llama_server, smollm2_gguf

        binary, why = llama_server()
        if binary is None:
            print(json.dumps({"bench": "adapters", "engine": ENGINE, "skipped": why}))
            return 0
    with tempfile.TemporaryDirectory() as home:
        cluster = Cluster(Path(home), production=False)
        # An agent's heartbeat can be seconds late while engines compute on a loaded host.
        cluster.env["LLMGW_UNREACHABLE_SECONDS"] = "15"
        cluster.env["LLMGW_LOST_SECONDS"] = "60"
        try:
            cluster.start_server()
            project = gateway_project(cluster, "bench")
            team = cluster.get("/teams")[0]["id"]
            source = str(smollm2_gguf()) if LLAMA else "org/base"
            cluster.post("/models", {"name": "base", "source": source, "profiles": [profile(N)]})
            names = [f"tone-{i}" for i in range(N)]
            for i, name in enumerate(names):
                cluster.post("/adapters", _adapter(Path(home), name, i, source, team))
            for i in range(N):
                solo = source if LLAMA else f"org/solo-{i}"
                cluster.post(
                    "/models", {"name": f"solo-{i}", "source": solo, "profiles": [profile(0)]}
                )
            # llama-server holds its adapters from its start: the agent comes once they are in.
            flags = ["--cpus", "16", "--memory-gb", "64"]
            if LLAMA:
                flags = ["--llama-server", str(binary), "--cpus", str(N + 1), "--memory-gb", "16"]
            cluster.start_agent("cpu-a", *flags, port_range="33000-33499")
            wait_for("a ready node", lambda: cluster.get("/nodes"), timeout=60)
            wait_for(
                "every replica ready",
                lambda: all(
                    cluster.ready_replicas(m) for m in ["base", *[f"solo-{i}" for i in range(N)]]
                ),
                timeout=240,
            )
            if LLAMA:
                wait_for(
                    "the adapters held",
                    lambda: all(a["held_by"] for a in cluster.get("/adapters")),
                    timeout=30,
                )
            secret = gateway_key(cluster, project, "bench")["secret"]
            with httpx.Client(base_url=cluster.url) as c:
                ask(c, secret, "base")
                first = [ask(c, secret, n) for n in names]  # each loads, then answers
                warm = [ask(c, secret, n) for n in names]
            assert all(s == 200 for s, _, _ in first + warm), (first, warm)
            cold_ms = [round(s * 1000) for _, s, _ in first]
            warm_ms = [round(s * 1000) for _, s, _ in warm]
            print(json.dumps({
                "bench": "adapters", "engine": ENGINE, "adapters": N,
                "figure": "first answer of each adapter" if LLAMA
                else "first request to an adapter not loaded", "first_ms": cold_ms, "then_ms": warm_ms,
                "first_p50_ms": statistics.median(cold_ms), "then_p50_ms": statistics.median(warm_ms),
            }))  # fmt: skip
            shared = load(cluster, secret, names)
            apart = load(cluster, secret, [f"solo-{i}" for i in range(N)])
            print(json.dumps({
                "bench": "adapters", "engine": ENGINE,
                "figure": f"{N} adapters on one replica against {N} replicas", "clients": CLIENTS,
                "max_tokens": MAX_TOKENS, "seconds": SECONDS, **({"threads_per_replica": 1} if LLAMA else {"slots_per_replica": SLOTS}),
                "one_replica": shared, "n_replicas": apart, "load1": os.getloadavg()[0],
            }))  # fmt: skip
        finally:
            cluster.close()
    return 0


def _adapter(home: Path, name: str, i: int, base: str, team: int) -> dict:
    """POST /adapters' body for adapter `name`: a LoRA GGUF written for the base on
    llama-server, an empty PEFT folder on the sim engine (which reads none)."""
    if LLAMA:
        from tests.lora_files import lora_gguf

        path, fmt = lora_gguf(Path(base), home / f"{name}.gguf", seed=i + 1), "gguf"
    else:
        path, fmt = home / name, "peft"
        path.mkdir()
    return {
        "name": name,
        "base": "base",
        "source": str(path),
        "format": fmt,
        "rank": 8,
        "owner": f"team:{team}",
    }


if __name__ == "__main__":
    sys.exit(main())
