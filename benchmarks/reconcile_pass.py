"""A reconciler pass with nothing to do, at 5,000 nodes and 10,000 replicas; where its time goes.

Builds the fleet in a fresh database (SQLite under a temporary LLMGW_HOME, or
DATABASE_URL's server when set), runs passes every 5 s until the settle period is
over, then times `reconcile_once` (every node heard from again before each), and
beside it its steps: loading the snapshot, `decide` as the pass runs it (skipping
the models whose inputs did not change) and `decide` over every model. Prints one
JSON line per figure, with the machine's load average at the start.
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import time
from datetime import timedelta

NODES = int(os.environ.get("BENCH_NODES", 5000))
REPLICAS = int(os.environ.get("BENCH_REPLICAS", 10000))
RUNS = int(os.environ.get("BENCH_RUNS", 7))
# Models that stay unplaceable: a whole node each, only on the nodes already full, beside
# replicas of their own class at their minimum (which may not be preempted for them).
UNPLACEABLE = int(os.environ.get("BENCH_UNPLACEABLE", 20))


def main() -> None:
    from benchmarks.common import django_ready, gpu_nodes, host_loop_ms, vacuumed

    django_ready()
    from django.conf import settings

    from catalog.models import Model, Profile
    from fleet.domain.reconcile import decide
    from fleet.models import Gpu, Lease, Node, Replica, Shard
    from fleet.reconciler.run import QUIET, reconcile_once
    from fleet.selectors.inputs import MEASUREMENTS, POLICY
    from fleet.selectors.snapshot import snapshot_load
    from llmgw.core import clock
    from tenancy.models import CapacityQuota

    # The quotas too: another benchmark's on the same server would be a policy this one did
    # not ask for.
    for table in (Shard, Replica, Gpu, Node, Profile, Model, Lease, CapacityQuota):
        table.objects.all().delete()
    now = clock.now()
    models = REPLICAS // 2  # two replicas each, two GPUs per replica
    gpu_nodes(NODES, now)
    # As agents that install engines say it: each node is told the pinned vLLM it would install.
    Node.objects.update(platform="linux-x86_64")
    rows = Model.objects.bulk_create(
        (Model(name=f"m{i:05d}", min_replicas=2, max_replicas=2) for i in range(models)),
        batch_size=1000,
    )
    Profile.objects.bulk_create(
        (Profile(model=m, name="tp2", engine="sim", gpu_class="h100-80g", tp=2) for m in rows),
        batch_size=1000,
    )
    from catalog.selectors import catalog_load

    fp = {name: spec.profiles[0].fingerprint() for name, spec in catalog_load().items()}
    replicas, shards = [], []
    slot = 0
    hour = timedelta(hours=1)  # ready for an hour: past their protection
    for m in range(models):
        for r in range(2):
            node, first = divmod(slot, 4)
            node %= NODES
            rid = f"m{m:05d}-{r}"
            replicas.append(Replica(id=rid, model=f"m{m:05d}", profile="tp2", profile_fp=fp[f"m{m:05d}"],
                                    state="ready", state_since=now, created_at=now - hour, ready_at=now - hour))  # fmt: skip
            shards.append(Shard(id=f"{rid}-0", replica_id=rid, node_id=f"n{node:05d}", gpu_indices=[first * 2, first * 2 + 1],
                                http_port=20000 + first, state="ready"))  # fmt: skip
            slot += 1
    Replica.objects.bulk_create(replicas, batch_size=2000)
    Shard.objects.bulk_create(shards, batch_size=2000)
    full = sorted({s.node_id for s in shards})[: len(shards) // 4]
    Node.objects.filter(pk__in=full).update(labels={"pool": "full"})
    stuck = Model.objects.bulk_create(
        Model(name=f"u{i:05d}", min_replicas=1, max_replicas=1) for i in range(UNPLACEABLE)
    )
    Profile.objects.bulk_create(
        Profile(model=m, name="tp8", engine="sim", gpu_class="h100-80g", tp=8,
                node_selector={"pool": "full"})
        for m in stuck
    )  # fmt: skip
    vacuumed(Node, Gpu, Replica, Shard, Model, Profile)
    # Passes every 5 s from a fresh start, as the loop runs them, until settling is over and a
    # pass looks at no model (the settle period's end is counted from when the control plane
    # began serving, which a slow first pass moves); the timed ones find nothing to do.
    Lease.objects.all().delete()
    t = now
    settle = settings.LLMGW.timings.settle
    for _ in range(int(settle // 5) + 12):
        Node.objects.update(last_seen=t)
        result = reconcile_once(now=t)
        t += timedelta(seconds=5)
        if t > now + timedelta(seconds=settle + 5) and not result["settling"] and not QUIET.ran:
            break

    load, loop = os.getloadavg()[0], host_loop_ms()
    figures: dict[str, list[float]] = {
        "reconcile_pass_idle_ms": [],
        # This process's CPU time in the pass: what the pass costs whatever else runs beside it
        # (on PostgreSQL the server's share is not in it).
        "reconcile_pass_idle_cpu_ms": [],
        "snapshot_load_ms": [],
        "decide_idle_ms": [],
        "decide_every_model_ms": [],
    }
    skipped = []
    for _ in range(RUNS):
        t += timedelta(seconds=5)
        Node.objects.update(last_seen=t)
        start, cpu = time.perf_counter(), time.process_time()
        result = reconcile_once(now=t)
        figures["reconcile_pass_idle_ms"].append(time.perf_counter() - start)
        figures["reconcile_pass_idle_cpu_ms"].append(time.process_time() - cpu)
        assert result["ran"] and not result["settling"] and not result["events"], result
        skipped.append(QUIET.skipped)
        start = time.perf_counter()
        # As the pass loads it: with the same policy and measurements, so that `decide` below
        # sees the world the pass saw (a different one would make the pass's next world new).
        snap = snapshot_load(settling=False, silence_floor=None, with_weights=True,
                             policy=POLICY.get(), measurements=MEASUREMENTS.get())  # fmt: skip
        figures["snapshot_load_ms"].append(time.perf_counter() - start)
        for name, quiet in (("decide_idle_ms", QUIET), ("decide_every_model_ms", None)):
            start = time.perf_counter()
            plan = decide(snap, t, settings.LLMGW.timings, quiet=quiet)
            figures[name].append(time.perf_counter() - start)
            assert plan.empty
    db = settings.DATABASES["default"]["ENGINE"].rsplit(".", 1)[-1]
    scale = {
        "nodes": NODES,
        "gpus": NODES * 8,
        "replicas": REPLICAS,
        "models": models,
        "unplaceable_models": UNPLACEABLE,
        "database": db,
        "runs": RUNS,
        "load_avg_1m": round(load, 2),
        "host_loop_ms": loop,
        "models_skipped": min(skipped),
    }
    for name, samples in figures.items():
        print(json.dumps({"figure": name, "median": round(statistics.median(samples) * 1000, 1), "min": round(min(samples) * 1000, 1),
                          "max": round(max(samples) * 1000, 1), "aim": 100 if name == "reconcile_pass_idle_ms" else None,
                          "scale": scale}), flush=True)  # fmt: skip


if __name__ == "__main__":
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    main()
