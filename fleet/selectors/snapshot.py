"""The reconciler's snapshot: everything a pass decides on, read as one consistent picture,
and the load the autoscaler scales by.

Read with a handful of queries over plain values (no model instances), through the cached
views of fleet.selectors.state, since a pass at 5,000 nodes and 10,000 replicas must stay cheap.
"""

from __future__ import annotations

from collections import defaultdict
from datetime import datetime

from django.db import connection, transaction

from catalog.domain import ModelSpec
from catalog.selectors import adapters_load, catalog_load
from llmgw.core import sources
from mirror.selectors import weights_waiting
from tenancy.quota import Policy

from ..domain.measured import combined_load
from ..domain.types import Load, Measured, ReplicaView, Snapshot
from ..selectors.capped import caps_load
from ..selectors.conditions import facility_load
from ..selectors.facility import power_load
from ..selectors.routing import replica_readings
from ..selectors.state import failed_shards, model_states, nodes_heard, replica_views


def snapshot_load(
    *,
    settling: bool,
    silence_floor: datetime | None,
    policy: Policy | None = None,
    measurements: dict[tuple[str, str], Measured] | None = None,
    with_weights: bool = False,
    now: datetime | None = None,
) -> Snapshot:
    """Everything a pass decides on, read as one consistent picture.

    In one transaction (repeatable read on PostgreSQL), so a replica adopted between
    reading shards and replicas cannot show up without the GPUs it holds. The quota policy
    and measurements are the caller's: they are read less often than every pass.
    """
    fresh = not connection.in_atomic_block
    with transaction.atomic():
        if fresh and connection.vendor == "postgresql":
            with connection.cursor() as cursor:
                cursor.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
        models = catalog_load()
        replicas = replica_views(by_revision=True)
        nodes, heard = nodes_heard()
        return Snapshot(
            nodes=nodes,
            heard=heard,
            models=models,
            replicas=replicas,
            states=model_states(by_revision=True),
            settling=settling,
            silence_floor=silence_floor,
            policy=policy if policy is not None else Policy(),
            measurements=measurements or {},
            loads=model_loads(replicas, models),
            failures=failed_shards() if any(r.state == "failed" for r in replicas) else {},
            # Only the pass asks (two queries): a dry run answers what would fit.
            weights_waiting=(
                weights_waiting({n: m.source for n, m in models.items()}) if with_weights else {}
            ),
            power=power_load(nodes, models),
            facility=facility_load(now),
            caps=caps_load(nodes, bool(measurements)),
        )


def model_loads(replicas: tuple[ReplicaView, ...], models: dict[str, ModelSpec]) -> dict[str, Load]:
    """Requests running and waiting per model, for the autoscaler: the one input it reads.

    Of models that can grow (max above min), what their engines report (`engine_load`,
    summed over ready replicas) combined with what the gateway counts running and waiting
    (`combined_load`). Only nodes that host such replicas are read, and a model neither
    said anything about has no entry: unknown is not idle.
    """
    scalable = {n for n, m in models.items() if m.max_replicas > m.min_replicas and not m.on_demand}
    if not scalable:
        return {}
    engines = _engine_loads(replicas, scalable)
    counted = sources.read(sources.GATEWAY_LOAD) or {}
    at_gateway = {
        m: Load(running=r, waiting=w)
        for m, (r, w) in on_bases(
            counted, {a.name: a.base for a in adapters_load().values()}
        ).items()
        if m in scalable
    }
    out = {}
    for m in engines.keys() | at_gateway.keys():
        load = combined_load(engines.get(m), at_gateway.get(m))
        if load is not None:
            out[m] = load
    return out


def on_bases(
    counts: dict[str, tuple[int, int]], base_of: dict[str, str]
) -> dict[str, tuple[int, int]]:
    """The gateway's (running, waiting) per model with each LoRA adapter's added to its
    base's: its requests run on the base's replicas, so they are the base's demand (the
    engines' own counts have them already)."""
    out: dict[str, tuple[int, int]] = {}
    for m, (r, w) in counts.items():
        m = base_of.get(m, m)
        was = out.get(m, (0, 0))
        out[m] = (was[0] + r, was[1] + w)
    return out


def _engine_loads(replicas: tuple[ReplicaView, ...], scalable: set[str]) -> dict[str, Load]:
    """What the engines of ready replicas of these models said, per model: requests running
    and waiting, summed, and the KV cache's use, on average over the replicas that said
    (the gateway steers requests away from a full one, so the fullest is not the model's)."""
    readings = replica_readings(r for r in replicas if r.model in scalable)
    model_of = {r.id: r.model for r in replicas}
    running: dict[str, int] = defaultdict(int)
    waiting: dict[str, int] = defaultdict(int)
    kv: dict[str, list[float]] = defaultdict(list)
    for replica_id, reading in readings.items():
        model = model_of[replica_id]
        running[model] += reading.running or 0
        waiting[model] += reading.waiting or 0
        if reading.kv_cache is not None:
            kv[model].append(reading.kv_cache)
    return {
        m: Load(
            running=running[m],
            waiting=waiting[m],
            kv_cache=sum(kv[m]) / len(kv[m]) if kv.get(m) else None,
        )
        for m in {model_of[r] for r in readings}
    }
