"""The cluster page (100 rows of nodes) at 1,000 and 5,000 nodes and 500 models.

For each fleet size, builds the fleet in a fresh database (SQLite under a
temporary LLMGW_HOME, or DATABASE_URL's server when set): nodes of 8 GPUs
reporting every reading a heartbeat carries, 500 models of two ready replicas
each, owned by 20 teams whose quotas each hold them at their limit, and the
model states a reconciler pass records. Then, with Django's test client logged
in as staff, times the whole page, counts its queries, and measures the nodes
table's refresh fragment (what htmx fetches every 5 s).
Prints one JSON line per figure.
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import time
from datetime import timedelta

SIZES = [int(n) for n in os.environ.get("BENCH_PAGE_NODES", "1000,5000").split(",")]
MODELS = int(os.environ.get("BENCH_PAGE_MODELS", 500))
TEAMS = 20
RUNS = int(os.environ.get("BENCH_RUNS", 21))
AIM_P95_MS = 100
AIM_QUERIES = 10
AIM_FRAGMENT_KB = 50
# The cluster, node and model pages with their charts (the console issue's aims).
AIM_CHART_QUERIES = 12


def _load(i: int) -> dict:
    """What a busy 8-GPU machine reports in a heartbeat (fleet/protocol.py, Load)."""
    return {
        "cpu_percent": 30.0 + i % 50,
        "load1": 4.5,
        "load5": 4.0,
        "load15": 3.5,
        "memory_used_bytes": 300 * 1024**3,
        "memory_available_bytes": 700 * 1024**3,
        "cpu_temp_c": 55.0,
        "cpu_power_w": 240.0,
        "inlet_temp_c": 22.5,
        "gpus": [
            {"index": g, "temp_c": 60.0, "memory_temp_c": 70.0, "power_w": 500.0,
             "power_limit_w": 700.0, "throttle": [], "utilization": 80.0, "memory_used_mb": 60000}
            for g in range(8)
        ],
    }  # fmt: skip


def fleet_build(nodes: int, *, models: int = MODELS) -> None:
    """The fleet in the database: `nodes` of 8 GPUs, `models` of two ready replicas each, the
    teams' quotas and two reconciler passes' model states (benchmarks/history.py too)."""
    from django.conf import settings

    from benchmarks.common import vacuumed
    from catalog.models import Model, Profile
    from catalog.selectors import catalog_load
    from fleet.models import Gpu, Lease, ModelState, Node, Replica, Shard
    from fleet.nodes.figures import node_figures_refresh
    from fleet.reconciler.run import reconcile_once
    from fleet.selectors.state import caches_clear
    from llmgw.core import clock
    from tenancy.models import CapacityQuota, Organization, Team

    for table in (Shard, Replica, Gpu, Node, Profile, Model, ModelState, Lease, CapacityQuota):
        table.objects.all().delete()
    caches_clear()
    now = clock.now()
    # Teams sharing the cluster under quotas, each holding its limit of GPUs: the page reads
    # the policy to say which scopes are at a limit.
    org, _ = Organization.objects.get_or_create(name="bench")
    teams = [Team.objects.get_or_create(org=org, name=f"team{t:02d}")[0] for t in range(TEAMS)]
    for t, team in enumerate(teams):
        held = 4 * len(range(t, models, TEAMS))  # its models' two replicas of two GPUs
        CapacityQuota.objects.create(
            scope=f"team:{team.id}", limit_gpus=held, guarantee_gpus=held // 2
        )
    Node.objects.bulk_create(
        (Node(id=f"n{i:05d}", hostname=f"gpu-{i:05d}.example", state="ready", state_since=now,
              registered_at=now, last_seen=now, memory_total_mb=1024 * 1024, cpu_count=96,
              labels={"zone": f"z{i % 4}"}, engines={"sim": "1"}, engines_probed=True, load=_load(i))
         for i in range(nodes)),
        batch_size=1000,
    )  # fmt: skip
    Gpu.objects.bulk_create(
        (Gpu(node_id=f"n{i:05d}", index=g, name="NVIDIA H100 80GB HBM3", memory_mb=81559,
             gpu_class="h100-80g")
         for i in range(nodes) for g in range(8)),
        batch_size=5000,
    )  # fmt: skip
    rows = Model.objects.bulk_create(
        (Model(name=f"m{i:04d}", min_replicas=2, max_replicas=2, owner=f"team:{teams[i % TEAMS].id}",
               description=f"model {i}, for the benchmark's operators")
         for i in range(models)),
        batch_size=1000,
    )  # fmt: skip
    Profile.objects.bulk_create(
        (Profile(model=m, name="tp2", engine="sim", gpu_class="h100-80g", tp=2) for m in rows),
        batch_size=1000,
    )
    fp = {name: spec.profiles[0].fingerprint() for name, spec in catalog_load().items()}
    replicas, shards = [], []
    for slot in range(models * 2):
        m, r = divmod(slot, 2)
        node, first = divmod(slot, 4)
        node %= nodes
        rid = f"m{m:04d}-{r}"
        replicas.append(Replica(id=rid, model=f"m{m:04d}", profile="tp2", profile_fp=fp[f"m{m:04d}"],
                                state="ready", state_since=now, created_at=now, ready_at=now))  # fmt: skip
        shards.append(Shard(id=f"{rid}-0", replica_id=rid, node_id=f"n{node:05d}",
                            gpu_indices=[first * 2, first * 2 + 1], http_port=20000 + first,
                            memory_gb=40, state="ready"))  # fmt: skip
    Replica.objects.bulk_create(replicas, batch_size=2000)
    Shard.objects.bulk_create(shards, batch_size=2000)
    # Written in bulk, as no writer does: the figures the page sorts by, as writers keep them.
    node_figures_refresh(nodes=[f"n{i:05d}" for i in range(nodes)])
    # Two passes, as a running cluster has made: the model states the models table reads.
    later = now + timedelta(seconds=settings.LLMGW.timings.settle + 1)
    reconcile_once(now=now)
    reconcile_once(now=later)
    vacuumed(Node, Gpu, Replica, Shard, ModelState)
    caches_clear()


def _history_filled(nodes: int) -> None:
    """A whole day of this process's history for every node and model, as llmgw serve
    keeps it when no Prometheus is named (benchmarks/history.py records the same)."""
    from benchmarks.day import day_times
    from fleet.console.samples import FLEET, REPLICAS, node_schema
    from llmgw.core.history import HISTORY
    from llmgw.core.traffic import GATEWAY, MODEL

    schema = node_schema(tuple(range(8)))
    HISTORY.clear(15)
    for t in day_times(HISTORY.step, time.time()):
        util = 50 + 40 * ((t // 60) % 2)
        readings = {f"node:n{i:05d}": (schema, [util] * 34) for i in range(nodes)}
        readings["fleet"] = (FLEET, [util, 50.0, nodes * 8.0, float(nodes)])
        readings["gateway"] = (GATEWAY, [100.0, 4000.0, 0.0])
        for m in range(MODELS):
            readings[f"model:m{m:04d}"] = (MODEL, [10.0, 400.0, 0.2, 0.0])
            readings[f"replicas:m{m:04d}"] = (REPLICAS, [2.0, 2.0])
        HISTORY.record(t, readings)


def _measure(nodes: int, client) -> None:
    from django.conf import settings
    from django.db import connection

    fleet_build(nodes)
    # A whole day of charts behind every page, as a server up for a day has.
    _history_filled(nodes)
    page = client.get("/")
    assert page.status_code == 200, page.status_code
    rows = page.content.count(b"<tr data-node=")
    assert rows == 100, f"the page shows {rows} node rows, not 100"
    assert page.content.count(b"<tr data-model=") == min(MODELS, 100)  # paged by 100

    samples = []
    for _ in range(RUNS):
        start = time.perf_counter()
        response = client.get("/")
        samples.append(time.perf_counter() - start)
        assert response.status_code == 200
    queries = []

    def counted(execute, sql, params, many, context):
        queries.append(sql)
        return execute(sql, params, many, context)

    with connection.execute_wrapper(counted):
        client.get("/")
    htmx = {"HTTP_HX_REQUEST": "true"}
    fragment = client.get("/?fragment=nodes", **htmx)
    assert fragment.status_code == 200 and b"<html" not in fragment.content
    models = client.get("/?fragment=models", **htmx)
    assert models.status_code == 200 and b"<html" not in models.content
    fragment_samples = []
    for _ in range(RUNS):
        start = time.perf_counter()
        client.get("/?fragment=nodes", **htmx)
        fragment_samples.append(time.perf_counter() - start)

    # The node and model pages with their charts.
    pages = {}
    for name, path, headers, shows in (
        ("node_page", "/nodes/n00000", {}, b'data-measured="yes"'),
        ("model_page", "/models/m0000", {}, b'data-measured="yes"'),
        # What the model page asks after it: its last placement, headroom and dry run.
        ("model_analysis", "/models/m0000?fragment=analysis", htmx, b'id="headroom"'),
    ):
        shown = client.get(path, **headers)
        assert shown.status_code == 200 and shows in shown.content, path
        taken = []
        for _ in range(RUNS):
            start = time.perf_counter()
            client.get(path, **headers)
            taken.append(time.perf_counter() - start)
        asked: list[str] = []

        def counted_here(execute, sql, params, many, context, asked=asked):
            asked.append(sql)
            return execute(sql, params, many, context)

        with connection.execute_wrapper(counted_here):
            client.get(path, **headers)
        pages[name] = (taken, len(asked))
    chart_samples = []
    for _ in range(RUNS):
        start = time.perf_counter()
        client.get("/?fragment=charts", **htmx)
        chart_samples.append(time.perf_counter() - start)

    scale = {
        "nodes": nodes,
        "gpus": nodes * 8,
        "models": MODELS,
        "replicas": MODELS * 2,
        "rows": 100,
        "database": settings.DATABASES["default"]["ENGINE"].rsplit(".", 1)[-1],
        "runs": RUNS,
    }

    def ms(values: list[float], q: float) -> float:
        return round(statistics.quantiles(values, n=100, method="inclusive")[q - 1] * 1000, 1)

    figures = [
        {"figure": "cluster_page_ms", "median": ms(samples, 50), "p95": ms(samples, 95),
         "aim": AIM_P95_MS},
        {"figure": "cluster_page_queries", "value": len(queries), "aim": AIM_QUERIES},
        {"figure": "cluster_page_kb", "value": round(len(page.content) / 1024, 1), "aim": None},
        {"figure": "nodes_fragment_kb", "value": round(len(fragment.content) / 1024, 1),
         "aim": AIM_FRAGMENT_KB},
        {"figure": "nodes_fragment_ms", "median": ms(fragment_samples, 50),
         "p95": ms(fragment_samples, 95), "aim": None},
        {"figure": "models_fragment_kb", "value": round(len(models.content) / 1024, 1),
         "aim": None},
        {"figure": "charts_fragment_ms", "median": ms(chart_samples, 50),
         "p95": ms(chart_samples, 95), "aim": None},
    ]  # fmt: skip
    for name, (taken, asked) in pages.items():
        page_aim = name.endswith("_page")  # the issue's aims are the pages'
        figures.append({"figure": f"{name}_ms", "median": ms(taken, 50), "p95": ms(taken, 95),
                        "aim": AIM_P95_MS if page_aim else None})  # fmt: skip
        figures.append({"figure": f"{name}_queries", "value": asked,
                        "aim": AIM_CHART_QUERIES if page_aim else None})  # fmt: skip
    for figure in figures:
        print(json.dumps({**figure, "scale": scale}), flush=True)


def main() -> None:
    from benchmarks.common import django_ready

    django_ready()
    from django.contrib.auth import get_user_model
    from django.test import Client

    # Not setup_test_environment(): it instruments every template render to copy its
    # context for the tests, which a served page does not pay.
    users = get_user_model().objects
    # A superuser: the page needs fleet.view_node and catalog.view_model.
    staff = users.filter(username="bench").first() or users.create_user(
        "bench", password="bench-pw", is_staff=True, is_superuser=True
    )
    client = Client()
    client.force_login(staff)
    for nodes in SIZES:
        _measure(nodes, client)


if __name__ == "__main__":
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    main()
