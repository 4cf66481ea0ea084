"""`GET /metrics` at about 100,000 series, and heartbeat handling while it is scraped.

Builds a fleet in a fresh database (SQLite under a temporary LLMGW_HOME, or
DATABASE_URL's server when set): BENCH_NODES nodes of 8 GPUs each, every one
heard from now with a full load (CPU, memory, load averages, CPU and inlet
temperature, CPU power, and per GPU temperature, memory temperature, power,
power limit, utilisation, memory used, a throttle reason on some), models with
replicas on them, and capacity quotas. At 79 series a node, 1,270 nodes give
about 100,000 series. Times BENCH_RUNS scrapes after a first one (which reads
every GPU and fills the label cache), plain and gzipped as Prometheus asks,
through Django's test client; and the same collector written by
prometheus_client's own exposition (generate_latest), for the ratio.

Then starts `llmgw serve` on the same database, connects BENCH_AGENTS agents
and measures heartbeat handling at BENCH_RATE a second as
benchmarks/heartbeats.py does (a probe after each heartbeat), for
BENCH_SECONDS without scrapes and BENCH_SECONDS with a gzipped scrape every
BENCH_SCRAPE_EVERY seconds; the fleet's rows are kept heard from meanwhile.
Prints one JSON line per figure.
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

NODES = int(os.environ.get("BENCH_NODES", 1270))
MODELS = int(os.environ.get("BENCH_MODELS", 500))
RUNS = int(os.environ.get("BENCH_RUNS", 15))
# The second part: heartbeat handling in a real `llmgw serve` over this fleet, without and
# with scrapes every SCRAPE_EVERY seconds (Prometheus' default is 15). 0 leaves it out.
AGENTS = int(os.environ.get("BENCH_AGENTS", 50))
RATE = float(os.environ.get("BENCH_RATE", 1000))
SECONDS = float(os.environ.get("BENCH_SECONDS", 10))
SCRAPE_EVERY = float(os.environ.get("BENCH_SCRAPE_EVERY", 2))
HEARTBEATS = os.environ.get("BENCH_METRICS_HEARTBEATS", "1") != "0"


def _load(i: int) -> dict:
    gpus = [
        {"index": g, "temp_c": 60.0 + (i + g) % 25, "memory_temp_c": 70.0 + (i * g) % 15,
         "power_w": 300.0 + (i * 7 + g) % 400, "power_limit_w": 700.0,
         "throttle": ["sw_power_cap"] if (i + g) % 16 == 0 else [],
         "utilization": float((i * 13 + g) % 101), "memory_used_mb": (i * 97 + g) % 81559}
        for g in range(8)
    ]  # fmt: skip
    return {"cpu_percent": float(i % 100), "load1": 3.5, "load5": 3.0, "load15": 2.5,
            "memory_used_bytes": 200 << 30, "memory_available_bytes": 56 << 30,
            "cpu_temp_c": 55.0 + i % 20, "cpu_power_w": 180.0 + i % 50, "inlet_temp_c": 22.5,
            "gpus": gpus}  # fmt: skip


def main() -> None:
    from benchmarks.common import django_ready, vacuumed

    django_ready()
    from django.conf import settings
    from django.db import connection
    from django.test import Client
    from django.test.utils import CaptureQueriesContext
    from prometheus_client import CollectorRegistry, generate_latest

    from catalog.models import Model, Profile
    from fleet.metrics.collector import FleetCollector, fleet_text
    from fleet.models import Gpu, ModelState, Node, Replica, Shard
    from llmgw.core import clock
    from tenancy.models import CapacityQuota, Organization, Team

    for table in (Shard, Replica, ModelState, Gpu, Node, Profile, Model, CapacityQuota, Team, Organization):  # fmt: skip
        table.objects.all().delete()
    now = clock.now()
    Node.objects.bulk_create(
        (Node(id=f"n{i:05d}", state="ready", state_since=now, registered_at=now, last_seen=now, spec_at=now,
              memory_total_mb=256 * 1024, cpu_count=96, load=_load(i)) for i in range(NODES)),
        batch_size=500,
    )  # fmt: skip
    Gpu.objects.bulk_create(
        (Gpu(node_id=f"n{i:05d}", index=g, name="NVIDIA H100 80GB HBM3", memory_mb=81559, gpu_class="h100-80g")
         for i in range(NODES) for g in range(8)),
        batch_size=5000,
    )  # fmt: skip
    org = Organization.objects.create(name="acme")
    teams = [Team.objects.create(org=org, name=f"team{t}") for t in range(20)]
    CapacityQuota.objects.create(scope=f"org:{org.id}", limit_gpus=NODES * 8, guarantee_gpus=NODES)
    for t in teams:
        CapacityQuota.objects.create(scope=f"team:{t.id}", limit_gpus=400, guarantee_gpus=40, limit_memory_gb=4000)  # fmt: skip
    rows = Model.objects.bulk_create(
        (Model(name=f"m{i:04d}", min_replicas=2, max_replicas=2, owner=f"team:{teams[i % 20].id}") for i in range(MODELS)),
        batch_size=1000,
    )  # fmt: skip
    Profile.objects.bulk_create(
        (Profile(model=m, name="tp2", engine="sim", gpu_class="h100-80g", tp=2) for m in rows),
        batch_size=1000,
    )
    replicas, shards = [], []
    for m in range(MODELS):
        for r in range(2):
            slot = m * 2 + r
            node, first = divmod(slot, 4)
            rid = f"m{m:04d}-{r}"
            replicas.append(Replica(id=rid, model=f"m{m:04d}", profile="tp2", profile_fp="x", state="ready",
                                    state_since=now, created_at=now, ready_at=now))  # fmt: skip
            shards.append(Shard(id=f"{rid}-0", replica_id=rid, node_id=f"n{node % NODES:05d}",
                                gpu_indices=[first * 2, first * 2 + 1], http_port=20000 + first, state="ready"))  # fmt: skip
    Replica.objects.bulk_create(replicas, batch_size=2000)
    Shard.objects.bulk_create(shards, batch_size=2000)
    ModelState.objects.bulk_create(
        (ModelState(model=f"m{i:04d}", desired=2, preempted=i % 3) for i in range(MODELS)),
        batch_size=1000,
    )
    vacuumed(Node, Gpu, Replica, Shard, ModelState)

    client = Client()
    start = time.perf_counter()
    first = client.get("/metrics")
    cold = time.perf_counter() - start
    assert first.status_code == 200, first.status_code
    text = first.content.decode()
    series = sum(1 for line in text.splitlines() if line and not line.startswith("#"))
    assert "llmgw_gpu_temperature_celsius" in text  # the nodes' readings are fresh
    plain, zipped = [], []
    with CaptureQueriesContext(connection) as queries:
        fleet_text()
    query_count = len(queries)  # now: the next request forgets them
    for _ in range(RUNS):
        start = time.perf_counter()
        response = client.get("/metrics")
        plain.append(time.perf_counter() - start)
        assert response.status_code == 200
        start = time.perf_counter()
        response = client.get("/metrics", HTTP_ACCEPT_ENCODING="gzip")
        zipped.append(time.perf_counter() - start)
        assert response["Content-Encoding"] == "gzip"
    # The same collector through prometheus_client's own exposition, for the ratio.
    registry = CollectorRegistry()
    registry.register(FleetCollector())
    stock = []
    for _ in range(max(3, RUNS // 3)):
        start = time.perf_counter()
        generate_latest(registry)
        stock.append(time.perf_counter() - start)
    db = settings.DATABASES["default"]["ENGINE"].rsplit(".", 1)[-1]
    scale = {
        "series": series,
        "nodes": NODES,
        "gpus": NODES * 8,
        "models": MODELS,
        "replicas": MODELS * 2,
        "database": db,
        "runs": RUNS,
        "queries": query_count,
        "first_scrape_ms": round(cold * 1000, 1),
        "bytes": len(text),
        "gzip_bytes": len(response.content),
    }
    ours = statistics.median(plain)
    for name, samples in (("metrics_scrape_ms", plain), ("metrics_scrape_gzip_ms", zipped),
                          ("metrics_prometheus_client_exposition_ms", stock)):  # fmt: skip
        ordered = sorted(samples)
        p95 = ordered[min(len(ordered) - 1, round(0.95 * (len(ordered) - 1)))]
        print(json.dumps({"figure": name, "median": round(statistics.median(samples) * 1000, 1),
                          "p95": round(p95 * 1000, 1), "aim": 150 if name == "metrics_scrape_ms" else None,
                          "ratio_to_ours": round(statistics.median(samples) / ours, 2), "scale": scale}),
              flush=True)  # fmt: skip
    if HEARTBEATS:
        _heartbeats_while_scraped(scale)


def _heartbeats_while_scraped(scale: dict) -> None:
    import asyncio
    import contextlib
    import threading

    import heartbeats as hb  # benchmarks/heartbeats.py, beside this file
    import httpx
    from django.db import DatabaseError, connection

    from fleet.models import Node
    from llmgw.core import clock
    from tenancy.models import Token
    from tenancy.services import token_create

    token = token_create(name="bench-metrics", kind=Token.AGENT)[1]
    port = hb._free_port()
    base = f"http://127.0.0.1:{port}"
    done, scraping = threading.Event(), threading.Event()
    scrapes: list[float] = []

    def keep_heard() -> None:
        # What these nodes' agents would do: without it their readings go stale in 15 s.
        while not done.wait(3):
            with contextlib.suppress(DatabaseError):
                Node.objects.filter(id__startswith="n").update(last_seen=clock.now())
        connection.close()

    def scrape() -> None:
        with httpx.Client(timeout=60) as client:
            while not done.is_set():
                if not scraping.wait(0.1):
                    continue
                start = time.perf_counter()
                response = client.get(f"{base}/metrics", headers={"Accept-Encoding": "gzip"})
                assert response.status_code == 200
                scrapes.append(time.perf_counter() - start)
                done.wait(SCRAPE_EVERY)

    async def paced(conns, seconds: float, seq: int) -> list[float]:
        """As heartbeats.py's paced run; the probe's answer is awaited past any command the
        server sends (it stops the shard the payload says runs, which it does not know)."""
        latencies: list[float] = []
        interval = len(conns) / RATE

        async def one(ws, offset: float) -> None:
            start, k, n = time.monotonic() + offset, 0, seq
            while (due := start + k * interval) < start + seconds:
                await asyncio.sleep(max(0.0, due - time.monotonic()))
                n += 1
                await ws.send(hb._heartbeat(n))
                sent = time.perf_counter()
                await ws.send(hb._heartbeat(n))  # the probe: answered once all before it is handled
                while json.loads(await ws.recv())["type"] != "error":
                    pass
                latencies.append(time.perf_counter() - sent)
                k += 1

        await asyncio.gather(*(one(ws, i * interval / len(conns)) for i, ws in enumerate(conns)))
        return sorted(latencies)

    async def run(pid: int) -> dict:
        conns = [
            await hb._connect(f"ws://127.0.0.1:{port}/ws/agent/", token, n) for n in range(AGENTS)
        ]
        try:
            await paced(conns, 3, 1_000_000)  # warm up
            quiet = await paced(conns, SECONDS, 2_000_000)
            scraping.set()
            busy = await paced(conns, SECONDS, 3_000_000)
            return {"quiet": quiet, "busy": busy}
        finally:
            done.set()
            await asyncio.to_thread(scraper.join, 120)  # a scrape under way ends first
            for ws in conns:
                await ws.close()

    scraper = threading.Thread(target=scrape, daemon=True)
    helpers = [threading.Thread(target=keep_heard, daemon=True), scraper]
    for t in helpers:
        t.start()
    # Each agent sends 40 frames a second here (a heartbeat and its probe, 20 times), past the
    # per-connection budget, which would close them: this measures handling, as heartbeats.py.
    env = {**os.environ, "PYTHONPATH": str(hb.REPO), "LLMGW_AGENT_FRAMES_PER_SECOND": "1000000"}
    log = Path(os.environ.get("LLMGW_HOME") or tempfile.gettempdir()) / "bench-metrics-serve.log"
    try:
        found = hb._serve([sys.executable, "-m", "llmgw", "serve", "--port", str(port)], env, log,
                          f"{base}/api/v1/openapi.json", run)  # fmt: skip
    finally:
        done.set()
        for t in helpers:
            t.join(timeout=60)
    quiet, busy = found["quiet"], found["busy"]
    pct = lambda lat, q: round(lat[min(len(lat) - 1, int(q * len(lat)))] * 1000, 2)  # noqa: E731
    print(json.dumps({"figure": "heartbeat_handling_while_scraped_ms",
                      "p50_unscraped": pct(quiet, 0.5), "p99_unscraped": pct(quiet, 0.99),
                      "p50_scraped": pct(busy, 0.5), "p99_scraped": pct(busy, 0.99),
                      "p99_change": round(pct(busy, 0.99) / pct(quiet, 0.99) - 1, 3), "aim_p99_change": 0.10,
                      "scrapes": len(scrapes), "scrape_every_s": SCRAPE_EVERY,
                      "scrape_ms_median": round(statistics.median(scrapes) * 1000, 1) if scrapes else None,
                      "scale": {**scale, "agents": AGENTS, "offered_per_second": RATE, "seconds": SECONDS,
                                "probes": len(busy), "machine_cores": os.cpu_count(),
                                "client_on_same_machine": True}}), flush=True)  # fmt: skip


if __name__ == "__main__":
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    main()
