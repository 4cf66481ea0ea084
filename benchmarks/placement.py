"""Placing replicas at scale, committed; and how long one preemption decision takes.

Builds 5,000 nodes of 8 H100s in a fresh database (SQLite under a temporary
LLMGW_HOME, or DATABASE_URL's server when set) and 2,500 models of four tp2
replicas, then runs reconciler passes from empty until all 10,000 replicas are
placed and committed. Then, with the fleet full and aged, times the preemption
decision for critical models that need a whole node. One JSON line per figure.
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
PER_MODEL = 4
TRIALS = int(os.environ.get("BENCH_TRIALS", 50))


def main() -> None:
    from benchmarks.common import django_ready, gpu_nodes

    django_ready()
    from django.conf import settings

    from catalog.domain import ModelSpec, Profile as ProfileSpec
    from catalog.models import Model, Profile
    from fleet.domain.capacity import standing
    from fleet.domain.preemption import context, preempt
    from fleet.models import Gpu, Lease, ModelState, Node, Replica, Shard
    from fleet.reconciler.run import reconcile_once
    from fleet.selectors.snapshot import snapshot_load
    from llmgw.core import clock

    for table in (Shard, Replica, Gpu, Node, Profile, Model, Lease, ModelState):
        table.objects.all().delete()
    now = clock.now()
    gpu_nodes(NODES, now)
    models = REPLICAS // PER_MODEL
    rows = Model.objects.bulk_create(
        (Model(name=f"m{i:05d}", min_replicas=PER_MODEL, max_replicas=PER_MODEL)
         for i in range(models)),
        batch_size=1000,
    )  # fmt: skip
    Profile.objects.bulk_create(
        (Profile(model=m, name="tp2", engine="sim", gpu_class="h100-80g", tp=2) for m in rows),
        batch_size=1000,
    )
    from catalog.services import _bump

    _bump()
    # Past the settle period, so the timed passes place.
    Lease.objects.all().delete()
    reconcile_once(now=now)
    t = now + timedelta(seconds=settings.LLMGW.timings.settle + 1)
    Lease.objects.update(settle_until=now, last_pass_at=t - timedelta(seconds=1))
    Node.objects.update(last_seen=t)

    start = time.perf_counter()
    passes = 0
    while Replica.objects.count() < REPLICAS and passes < 20:
        reconcile_once(now=t)
        passes += 1
    elapsed = time.perf_counter() - start
    placed = Replica.objects.count()
    db = settings.DATABASES["default"]["ENGINE"].rsplit(".", 1)[-1]
    scale = {"nodes": NODES, "gpus": NODES * 8, "replicas": placed, "models": models,
             "database": db}  # fmt: skip
    print(json.dumps({"figure": "replicas_from_empty_s", "value": round(elapsed, 2), "aim": 10,
                      "passes": passes, "scale": scale}), flush=True)  # fmt: skip
    print(json.dumps({"figure": "placements_per_s_committed", "value": round(placed / elapsed),
                      "aim": 1000, "scale": scale}), flush=True)  # fmt: skip

    # Every replica ready for an hour: all may be preempted by class.
    ready_at = t - timedelta(hours=1)
    Replica.objects.update(state="ready", ready_at=ready_at, created_at=ready_at)
    snap = snapshot_load(settling=False, silence_floor=None)
    timings = settings.LLMGW.timings
    st = standing(snap, t, timings)
    assert st.inv.rooms  # built before timing: a pass has built it by the time it preempts
    ctx = context(snap.models, [r for r in snap.replicas], snap.policy, t, timings)
    whole = ProfileSpec(name="tp4", engine="sim", gpu_class="h100-80g", tp=4)
    samples = []
    for i in range(TRIALS):
        want = ModelSpec(name=f"vital{i}", profiles=(whole,), capacity_class="critical")
        begin = time.perf_counter()
        result = preempt(want, [whole], 0, st.inv, ctx)
        samples.append(time.perf_counter() - begin)
        assert result.victims, result.blocked
    samples.sort()
    p99 = samples[min(len(samples) - 1, int(len(samples) * 0.99))]
    print(json.dumps({"figure": "preemption_decision_ms", "p50": round(statistics.median(samples) * 1000, 1),
                      "p99": round(p99 * 1000, 1), "trials": TRIALS,
                      "scale": {**scale, "replicas": len(snap.replicas)}}), flush=True)  # fmt: skip


if __name__ == "__main__":
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    main()
