"""Fleet reads: the reconciler's snapshot, and the views the API and pages show.

The snapshot is read with a handful of queries over plain values (no model
instances), since a pass at 5,000 nodes and 10,000 replicas must stay cheap.
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Iterable, Mapping
from datetime import UTC, datetime

from django.conf import settings
from django.db import connection, transaction
from django.db.models import Count, Max
from django.db.models.fields.json import KeyTransform

from catalog.domain import MAX_REPLICAS, ModelSpec, reservation_warnings, suggested_cores
from catalog.selectors import catalog_load
from llmgw.core import clock, sources
from llmgw.core.errors import Invalid, NotFound
from mirror.selectors import weights_waiting
from tenancy.quota import Holding, Policy

from .domain.capacity import (
    NotMeasured,
    headroom,
    preemption_dry_run,
    replicas_needed,
    standing,
    target,
)
from .domain.gpuclass import CLASS_LABEL
from .domain.holdings import holdings
from .domain.measured import combined_load
from .domain.reconcile import desired_replicas, held_for
from .domain.types import (
    ACTIVE,
    HOLDING,
    Failure,
    GpuView,
    Load,
    Measured,
    ModelState as ModelStateView,
    NodeView,
    ReplicaView,
    Reservation,
    ShardView,
    Snapshot,
)
from .engine_installs import installing_said, installs_of, with_installable
from .models import Gpu, ModelState, Node, Replica, Shard
from .readings import MEASUREMENTS, POLICY

# What changes between registrations, read every pass; the rest is cached per node.
_NODE_DYNAMIC = (
    "id",
    "state",
    "last_seen",
    "cordoned",
    "draining",
    "approved",
    "memory_total_mb",
    "cpu_count",
    "spec_at",
)
_NODE_STATIC = (
    "id",
    "labels",
    "engines",
    "engines_probed",
    "disk_free_gb",
    "weights",
    "platform",
    "engine_installs",
)
_REPLICA_FIELDS = (
    "id",
    "model",
    "profile",
    "profile_fp",
    "state",
    "created_at",
    "state_since",
    "ready_at",
    "last_used_at",
    "retiring",
    "drain_deadline",
    "stop_grace_s",
    "preempted_for",
    "reason",
    "counts_as_failure",
    "unhealthy_since",
)
_SHARD_STATIC = ("id", "node_id", "rank", "gpu_indices", "memory_gb", "cpu_cores", "http_port")
_STATE_FIELDS = [
    f.name
    for f in ModelState._meta.fields
    if f.name not in ("updated_at", "explanation", "reserved", "last_failure")
]
_CHUNK = 500

# Per-process caches of what a pass would otherwise decode again every few seconds at
# 5,000 nodes: keyed by what the database says changed, so other processes' writes count.
_node_static: dict[str, tuple[datetime | None, dict]] = {}
_shard_static: dict[tuple[str, str], dict] = {}


def _fast_values(qs, fields: tuple[str, ...]) -> list[tuple]:
    """`qs.values_list(*fields)` without Django's per-value converters.

    On SQLite those convert every datetime again in Python (they were most of a
    pass at 10,000 replicas); here the driver's naive UTC datetimes are only
    made aware, and booleans made bool. On PostgreSQL see _postgres_rows.
    """
    sql, params = qs.values_list(*fields).query.sql_with_params()
    if connection.vendor == "postgresql":
        return _postgres_rows(sql, params)
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        rows = cursor.fetchall()
    if connection.vendor != "sqlite":
        return rows
    kinds = [qs.model._meta.get_field(f.removesuffix("_id")).get_internal_type() for f in fields]
    dates = [i for i, k in enumerate(kinds) if k == "DateTimeField"]
    bools = [i for i, k in enumerate(kinds) if k == "BooleanField"]
    out = []
    for row in rows:
        row = list(row)
        for i in dates:
            row[i] = aware(row[i])
        for i in bools:
            row[i] = bool(row[i])
        out.append(tuple(row))
    return out


def aware(value: datetime | str | None) -> datetime | None:
    """A timestamp as a driver hands it over (SQLite: text or naive UTC), made an aware
    datetime; one already aware is left as it is."""
    if isinstance(value, str):
        value = datetime.fromisoformat(value)
    if value is not None and value.tzinfo is None:
        value = value.replace(tzinfo=UTC)
    return value


def _postgres_rows(sql: str, params) -> list[tuple]:
    """Rows through psycopg's own C timestamp loader.

    Django registers a pure-Python loader for timestamptz on its connections;
    at 10,000 replicas it was most of a pass. The connection's time zone is
    UTC (Django sets it), so the datetimes come back aware, as Django's would.
    """
    import psycopg

    connection.ensure_connection()
    loader = psycopg.adapters.get_loader(
        psycopg.postgres.types["timestamptz"].oid, psycopg.pq.Format.TEXT
    )
    # Django's error wrapper, so a bad value raises django.db.DataError as through the ORM.
    with connection.wrap_database_errors, connection.connection.cursor() as cursor:
        cursor.adapters.register_loader("timestamptz", loader)
        cursor.execute(sql, params)
        return cursor.fetchall()


def caches_clear() -> None:
    """Forget every cached view (tests reuse ids and clocks across databases)."""
    for cache in (_node_static, _shard_static, _replica_cache, _state_cache, _memo):
        cache.clear()


def _chunks(ids: list[str]):
    for i in range(0, len(ids), _CHUNK):
        yield ids[i : i + _CHUNK]


def _load_node_static(stale: dict[str, datetime | None]) -> None:
    ids = list(stale)
    gpus: dict[str, list[tuple]] = defaultdict(list)
    gpu_rows = Gpu.objects.order_by().values_list(
        "node_id", "index", "gpu_class", "healthy", "unknown_processes"
    )
    node_rows = Node.objects.order_by().values_list(*_NODE_STATIC)
    # A few nodes are named in the query; many (a restart, every node registering) are read
    # all at once, two queries however many.
    chunks = [ids] if len(ids) > _CHUNK else list(_chunks(ids))
    rows = []
    for chunk in chunks:
        named = len(ids) <= _CHUNK
        for row in gpu_rows.filter(node_id__in=chunk) if named else gpu_rows:
            if row[0] in stale:
                gpus[row[0]].append(row[1:])
        rows.extend(
            r for r in (node_rows.filter(pk__in=chunk) if named else node_rows) if r[0] in stale
        )
    for row in rows:
        d = dict(zip(_NODE_STATIC, row, strict=True))
        labels = d["labels"] or {}
        override = labels.get(CLASS_LABEL)
        _node_static[d["id"]] = (
            stale[d["id"]],
            {
                "labels": labels,
                "gpus": tuple(
                    GpuView(index=i, gpu_class=override or c, healthy=h, held=bool(u))
                    for i, c, h, u in sorted(gpus[d["id"]])
                ),
                "engines": frozenset(d["engines"] or ()) if d["engines_probed"] else None,
                "disk_free_gb": d["disk_free_gb"],
                "weights": frozenset(
                    w.get("source", "") for w in d["weights"] or () if isinstance(w, dict)
                ),
                "platform": d["platform"],
                "installs": installs_of(d["engine_installs"]),
            },
        )


def node_registrations(spec_at: Mapping[str, datetime | None]) -> dict[str, dict]:
    """What every node registered (labels, GPUs as placement sees them, engines, disk,
    weights), keyed by node: from the per-process cache, read again only for nodes whose
    `spec_at` (set by each registration) moved. `spec_at` names every node there is."""
    stale = {
        i: at for i, at in spec_at.items() if i not in _node_static or _node_static[i][0] != at
    }
    if stale:
        _load_node_static(stale)
    for gone in _node_static.keys() - spec_at.keys():
        del _node_static[gone]
    return {i: _node_static[i][1] for i in spec_at}


def node_views() -> dict[str, NodeView]:
    """Every node as placement sees it; registered figures come from the cache when unchanged."""
    rows = _fast_values(Node.objects.all(), _NODE_DYNAMIC)
    registered = node_registrations({r[0]: r[8] for r in rows})
    views = {}
    for node_id, state, last_seen, cordoned, draining, approved, memory_mb, cpus, _ in rows:
        views[node_id] = NodeView(
            id=node_id,
            state=state,
            last_seen=last_seen,
            cordoned=cordoned,
            draining=draining,
            approved=approved,
            memory_gb=memory_mb / 1024 if memory_mb else None,
            cpu_count=cpus or None,
            **registered[node_id],
        )
    return views


def _memoized(name: str, rows, build):
    """`build(rows)`, or last time's result when the rows are the same (compared in C)."""
    hit = _memo.get(name)
    if hit is not None and hit[0] == rows:
        return hit[1]
    result = build(rows)
    _memo[name] = (rows, result)
    return result


_memo: dict[str, tuple] = {}


def _group_shards(rows: list[tuple]) -> dict[str, tuple[ShardView, ...]]:
    """Shards by replica, in rank order: where they are and what they hold never changes, so
    it is cached by id, and only their state is read each time."""
    unknown = [r[0] for r in rows if (r[0], r[2]) not in _shard_static]
    for chunk in _chunks(unknown):
        for row in Shard.objects.filter(pk__in=chunk).values_list(*_SHARD_STATIC):
            d = dict(zip(_SHARD_STATIC, row, strict=True))
            d["gpu_indices"] = tuple(d["gpu_indices"] or ())
            _shard_static[(d.pop("id"), d.pop("node_id"))] = d
    by_replica: dict[str, list[ShardView]] = defaultdict(list)
    for shard_id, replica_id, node_id, state in rows:
        by_replica[replica_id].append(
            ShardView(
                id=shard_id, node_id=node_id, state=state, **_shard_static[(shard_id, node_id)]
            )
        )
    if len(_shard_static) > 2 * len(rows) + 1000:
        live = {(r[0], r[2]) for r in rows}
        for key in _shard_static.keys() - live:
            del _shard_static[key]
    return {rid: tuple(sorted(v, key=lambda s: s.rank)) for rid, v in by_replica.items()}


def _views(cache: dict, rows, key, build):
    """Views of rows, reusing the view built last time for a row (and extra) that is unchanged."""
    out = []
    for row in rows:
        k = key(row)
        hit = cache.get(k[0])
        if hit is None or hit[0] != k:
            hit = (k, build(row))
            cache[k[0]] = hit
        out.append(hit[1])
    if len(cache) > 2 * len(out) + 1000:
        live = {key(r)[0] for r in rows}
        for gone in cache.keys() - live:
            del cache[gone]
    return out


_replica_cache: dict[str, tuple] = {}
_state_cache: dict[str, tuple] = {}


def replica_views(*, model: str | None = None) -> tuple[ReplicaView, ...]:
    replicas = Replica.objects.all()
    shards = Shard.objects.all()
    if model:
        replicas = replicas.filter(model=model)
        shards = shards.filter(replica__model=model)
    shard_rows = _fast_values(shards, ("id", "replica_id", "node_id", "state"))
    rows = _fast_values(replicas, _REPLICA_FIELDS)
    if model is None:
        # The whole fleet, as each pass reads it: the same rows give the same views.
        return _memoized("replicas", (rows, shard_rows), lambda _: _replica_views(rows, shard_rows))
    return _replica_views(rows, shard_rows)


def _replica_views(rows: list[tuple], shard_rows: list[tuple]) -> tuple[ReplicaView, ...]:
    by_replica = _group_shards(shard_rows)
    return tuple(
        _views(
            _replica_cache,
            rows,
            key=lambda row: (row[0], row, by_replica.get(row[0], ())),
            build=lambda row: ReplicaView(
                **dict(zip(_REPLICA_FIELDS, row, strict=True)), shards=by_replica.get(row[0], ())
            ),
        )
    )


def model_states(*, name: str | None = None) -> dict[str, ModelStateView]:
    """Every model's controller state (or one's); explanations (JSON) are read only where there is one."""
    states = ModelState.objects.all() if name is None else ModelState.objects.filter(pk=name)
    explanations = dict(states.exclude(explanation=[]).values_list("model", "explanation"))
    reserved = {
        model: tuple(Reservation.of(r) for r in rows if isinstance(r, dict))
        for model, rows in states.exclude(reserved=[]).values_list("model", "reserved")
    }
    # The last failure (JSON) comes with the row: its column is null for most models.
    rows = _fast_values(states, (*_STATE_FIELDS, "last_failure"))
    views = _views(
        _state_cache,
        rows,
        key=lambda row: (
            row[0],
            row,
            tuple(explanations.get(row[0]) or ()),
            reserved.get(row[0], ()),
        ),
        build=lambda row: ModelStateView(
            **dict(zip(_STATE_FIELDS, row[:-1], strict=True)),
            explanation=tuple(explanations.get(row[0]) or ()),
            reserved=reserved.get(row[0], ()),
            last_failure=_failure_of(row[-1]),
        ),
    )
    return {v.model: v for v in views}


def _failure_of(value) -> Failure | None:
    """A stored last failure as read straight from the driver: SQLite gives its JSON text,
    PostgreSQL its text or its object."""
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError:
            return None
    return Failure.of(value) if isinstance(value, dict) else None


def failed_shards() -> dict[str, Failure]:
    """What the failed shards of failed replicas reported, by replica (its first failed
    shard by rank): the reconciler keeps it with the model when it counts the failure."""
    rows = (
        Shard.objects.filter(replica__state="failed", state="failed")
        .order_by("replica_id", "rank")
        .values_list("replica_id", "node_id", "exit_code", "detail")
    )
    out: dict[str, Failure] = {}
    for replica_id, node_id, exit_code, detail in rows:
        out.setdefault(replica_id, Failure(replica_id, node_id, exit_code, detail))
    return out


def snapshot_load(
    *,
    settling: bool,
    silence_floor: datetime | None,
    policy: Policy | None = None,
    measurements: dict[tuple[str, str], Measured] | None = None,
    with_weights: bool = False,
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
        replicas = replica_views()
        return Snapshot(
            nodes=with_installable(node_views()),
            models=models,
            replicas=replicas,
            states=model_states(),
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
        )


def _iso(t: datetime | None) -> str | None:
    return t.isoformat() if t else None


def replica_out(r: ReplicaView, spec: ModelSpec | None, endpoints: dict[str, str]) -> dict:
    """A replica as the API shows it; outdated when its profile changed since it started."""
    profile = spec.profile(r.profile) if spec else None
    return {
        "id": r.id,
        "model": r.model,
        "profile": r.profile,
        "state": r.state,
        "shards": [
            {
                "id": s.id,
                "node": s.node_id,
                "rank": s.rank,
                "gpu_indices": list(s.gpu_indices),
                "memory_gb": s.memory_gb,
                "cpu_cores": s.cpu_cores,
            }
            for s in r.shards
        ],
        "endpoint": endpoints.get(r.shards[0].id, "") if r.shards else "",
        "created_at": _iso(r.created_at),
        "ready_at": _iso(r.ready_at),
        "last_used_at": _iso(r.last_used_at),
        "preempted_for": r.preempted_for,
        "reason": r.reason,
        "retiring": r.retiring,
        "outdated": profile is not None and profile.fingerprint() != r.profile_fp,
        "unhealthy_since": _iso(r.unhealthy_since),
    }


def replicas_list(*, model: str | None = None) -> list[dict]:
    catalog = catalog_load()
    shards = Shard.objects.filter(rank=0)
    if model:
        shards = shards.filter(replica__model=model)
    endpoints = dict(shards.values_list("id", "endpoint"))
    views = sorted(replica_views(model=model), key=lambda r: (r.model, r.created_at))
    fetching = replicas_fetching()
    return [
        {**replica_out(r, catalog.get(r.model), endpoints), "fetching": fetching.get(r.id)}
        for r in views
    ]


def replicas_fetching() -> dict[str, dict]:
    """Replicas whose agents are fetching their weights: bytes done and total (None unknown)."""
    rows = Shard.objects.filter(state="fetching").values_list(
        "replica_id", "progress_done", "progress_total"
    )
    return {rid: {"done": done or 0, "total": total} for rid, done, total in rows}


def _node_out(node: Node, gpus: list[Gpu], used: dict[int, str], replicas: list[str]) -> dict:
    view_state = NodeView(
        id=node.id,
        state=node.state,
        cordoned=node.cordoned,
        draining=node.draining,
        approved=node.approved,
    ).shown_state
    override = (node.labels or {}).get(CLASS_LABEL)
    classes = sorted({override or g.gpu_class for g in gpus})
    return {
        "id": node.id,
        "hostname": node.hostname,
        "state": view_state,
        "labels": node.labels,
        "gpu_total": len(gpus),
        "gpu_free": sum(
            1 for g in gpus if g.healthy and not g.unknown_processes and g.index not in used
        ),
        "gpu_class": ", ".join(classes) or None,
        "gpus": [
            {
                "index": g.index,
                "uuid": g.uuid,
                "name": g.name,
                "memory_mb": g.memory_mb,
                "class": override or g.gpu_class,
                "healthy": g.healthy,
                # Processes no shard of llmgw runs, as its agent last said; null: unknown.
                "unknown_processes": g.unknown_processes,
                "replica": used.get(g.index),
            }
            for g in gpus
        ],
        "memory_gb": round(node.memory_total_mb / 1024, 1) if node.memory_total_mb else None,
        "cpu_count": node.cpu_count,
        "engines": node.engines,
        "engine_installs": [i.__dict__ for i in installs_of(node.engine_installs)],
        "disk": {"free_gb": node.disk_free_gb, "total_gb": node.disk_total_gb},
        # What its weight cache holds, as it last said.
        "weights": [
            {"sha256": w.get("sha256"), "size": w.get("size"), "source": w.get("source") or ""}
            for w in node.weights or ()
            if isinstance(w, dict) and w.get("sha256")
        ],
        "replicas": replicas,
        "load": {k: v for k, v in (node.load or {}).items() if k != "engines"},
        "agent_version": node.agent_version,
        "mgmt_addr": node.mgmt_addr,
        "last_seen": _iso(node.last_seen),
        "registered_at": _iso(node.registered_at),
    }


def nodes_list(*, node_id: str | None = None) -> list[dict]:
    """Nodes as the API shows them, in four queries whatever their number."""
    nodes = Node.objects.all()
    if node_id is not None:
        nodes = nodes.filter(pk=node_id)
    nodes = list(nodes)
    if node_id is not None and not nodes:
        raise NotFound(f"There is no node {node_id!r}.")
    ids = [n.id for n in nodes]
    gpus: dict[str, list[Gpu]] = defaultdict(list)
    for g in Gpu.objects.filter(node_id__in=ids) if node_id else Gpu.objects.all():
        gpus[g.node_id].append(g)
    used: dict[str, dict[int, str]] = defaultdict(dict)
    replicas: dict[str, list[str]] = defaultdict(list)
    shards = Shard.objects.filter(replica__state__in=HOLDING)
    if node_id:
        shards = shards.filter(node_id=node_id)
    for shard_node, replica_id, indices in shards.values_list(
        "node_id", "replica_id", "gpu_indices"
    ):
        replicas[shard_node].append(replica_id)
        for i in indices or ():
            used[shard_node][i] = replica_id
    return [_node_out(n, gpus[n.id], used[n.id], sorted(replicas[n.id])) for n in nodes]


def _status(
    spec: ModelSpec, state: ModelStateView | None, desired: int, ready: int, starting: int
) -> tuple[str, str]:
    """A model's one-word status and the sentence behind it."""
    if state and state.parked_since:
        return "parked", state.parked_reason
    if desired == 0:
        return ("idle" if spec.on_demand else "stopped"), ""
    if ready >= desired:
        return "ready", ""
    explanation = list(state.explanation) if state else []
    first = next((r for e in explanation for r in e.get("reasons", ())), "")
    if state and state.unplaceable:
        return "unplaceable", first
    if starting:
        return "starting", first
    return "waiting", first


def model_views(*, name: str | None = None) -> list[dict]:
    """Models as the API shows them, with what runs of each (a fixed number of queries)."""
    catalog = catalog_load()
    if name is not None:
        if name not in catalog:
            raise NotFound(f"There is no model {name!r}.")
        catalog = {name: catalog[name]}
    states = model_states(name=name)
    counts: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
    replicas = replica_views(model=name)
    for r in replicas:
        counts[r.model][r.state] += 1
    one = states.get(name) if name is not None else None
    if one is not None and one.held_for and one.held_for not in states:
        # Whether it is still held depends on the model it gave room to.
        states = {**states, **model_states(name=one.held_for)}
        for state in Replica.objects.filter(model=one.held_for).values_list("state", flat=True):
            counts[one.held_for][state] += 1
    measured = measured_memory(replicas, catalog)
    cpu_nodes = (
        [
            (mb / 1024 if mb else None, cpus)
            for mb, cpus in Node.objects.filter(state=Node.READY).values_list(
                "memory_total_mb", "cpu_count"
            )
        ]
        if any(p.cpu_only for spec in catalog.values() for p in spec.profiles)
        else []
    )
    out = []
    for spec in catalog.values():
        state = states.get(spec.name)
        # Before its first pass a model wants what its scaling says, not nothing.
        desired = (
            state.desired
            if state
            else desired_replicas(spec, ModelStateView(model=spec.name), clock.now())
        )
        c = counts[spec.name]
        status, reason = _status(spec, state, desired, c["ready"], c["pending"] + c["starting"])
        first = spec.profiles[0]
        out.append(
            {
                "name": spec.name,
                "aliases": list(spec.aliases),
                "description": spec.description,
                "source": spec.source,
                "ready": c["ready"],
                "desired": desired,
                "min": spec.min_replicas,
                "max": spec.max_replicas,
                "idle_timeout": spec.idle_timeout_s,
                "on_demand": spec.on_demand,
                "status": status,
                "reason": reason,
                "class": spec.effective_class,
                "owner": spec.owner,
                "memory_gb": first.min_memory_gb,
                "cpu_cores": first.reserved_cores,
                "suggested_cores": (
                    suggested_cores(first.min_memory_gb, cpu_nodes) or None
                    if first.cpu_only
                    else None
                ),
                "measured_memory_gb": measured.get(spec.name),
                "warnings": reservation_warnings(spec, measured.get(spec.name)),
                "preempted": state.preempted if state else 0,
                "held_for": _held_for(state, counts, states),
                "unplaceable": bool(state and state.unplaceable),
                "parked": bool(state and state.parked_since),
                "failures": state.failures if state else 0,
                "last_failure": failure_shown(state),
                "profiles": [p.to_dict() | {"fingerprint": p.fingerprint()} for p in spec.profiles],
                "fallbacks": list(spec.fallbacks),
                "routing_profile": spec.routing_profile,
                "declared": spec.declared,
                "slo": spec.slo.to_dict(),
                "context_length": spec.context_length,
                "max_output": spec.max_output,
            }
        )
    return out


def failure_shown(state: ModelStateView | None) -> dict | None:
    """The model's last failure as the API shows it, while it backs off or is parked;
    None otherwise (a retry or a ready replica has put it behind it)."""
    if state is None or state.last_failure is None:
        return None
    if not (state.failures or state.parked_since):
        return None
    return state.last_failure.as_dict()


def _held_for(state: ModelStateView | None, counts: dict, states: dict) -> str:
    """The model this one gave room to, while it is held back (reconcile.held_for's rule)."""
    if state is None or not state.held_for:
        return ""
    live = sum(counts[state.held_for][s] for s in ("pending", "starting", "ready"))
    return held_for(state, clock.now(), live, states.get(state.held_for))


def measured_memory(
    replicas: Iterable[ReplicaView], catalog: Mapping[str, ModelSpec]
) -> dict[str, float]:
    """The most resident memory one shard of each model was measured using, in GB, from the
    agents' per-shard figures (one query, reading only the nodes that run ready shards); a
    model no agent measured has no entry."""
    # Keyed by (node, shard): a node's figures count only for shards placed on it.
    model_of = {
        (s.node_id, s.id): r.model
        for r in replicas
        if r.state == "ready" and r.model in catalog
        for s in r.shards
    }
    if not model_of:
        return {}
    hosts = Shard.objects.filter(replica__state="ready").values("node_id")
    uses = (
        Node.objects.filter(pk__in=hosts)
        .annotate(uses=KeyTransform("shards", "load"))
        .values_list("id", "uses")
    )
    out: dict[str, float] = {}
    for node_id, shards in uses:
        for shard_id, use in (shards if isinstance(shards, dict) else {}).items():
            model = model_of.get((node_id, shard_id))
            rss = use.get("rss_bytes") if isinstance(use, dict) else None
            if model and isinstance(rss, int) and rss > 0:
                out[model] = max(out.get(model, 0.0), round(rss / 1024**3, 1))
    return out


def model_explain(*, name: str) -> dict:
    """Why the model's last placement failed, per profile and node."""
    view = model_views(name=name)[0]
    state = model_states(name=name).get(name)
    return {
        "model": name,
        "unplaceable": view["unplaceable"],
        "reason": view["reason"],
        "explanation": list(state.explanation) if state else [],
        "last_failure": view["last_failure"],
        "installing": installing_said(catalog_load().get(name)),
    }


def holdings_load() -> list[Holding]:
    """What every replica holds now, and for whom (for quotas' holds and the policy)."""
    return holdings(replica_views(), catalog_load())


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
    at_gateway = {
        m: Load(running=r, waiting=w)
        for m, (r, w) in (sources.read(sources.GATEWAY_LOAD) or {}).items()
        if m in scalable
    }
    out = {}
    for m in engines.keys() | at_gateway.keys():
        load = combined_load(engines.get(m), at_gateway.get(m))
        if load is not None:
            out[m] = load
    return out


def _engine_loads(replicas: tuple[ReplicaView, ...], scalable: set[str]) -> dict[str, Load]:
    """What the engines of ready replicas of these models said, as their agents report it."""
    # Keyed by (node, shard): a node's figures count only for shards placed on it.
    model_of: dict[tuple[str, str], str] = {}
    for r in replicas:
        if r.model in scalable and r.state == "ready":
            for s in r.shards:
                model_of[(s.node_id, s.id)] = r.model
    if not model_of:
        return {}
    nodes = {s.node_id for r in replicas if r.model in scalable for s in r.shards}
    running: dict[str, int] = defaultdict(int)
    waiting: dict[str, int] = defaultdict(int)
    seen: set[str] = set()
    for chunk in _chunks(sorted(nodes)):
        for node_id, load in Node.objects.filter(pk__in=chunk, state=Node.READY).values_list(
            "id", "load"
        ):
            for shard_id, figures in ((load or {}).get("engines") or {}).items():
                model = model_of.get((node_id, shard_id))
                if model is None or not isinstance(figures, dict):
                    continue
                seen.add(model)
                running[model] += int(figures.get("running") or 0)
                waiting[model] += int(figures.get("waiting") or 0)
    return {m: Load(running=running[m], waiting=waiting[m]) for m in seen}


def _standing_snapshot() -> Snapshot:
    """The fleet as it stands, with quotas and measurements as they stand now: the cached
    ones while their revisions say they have not changed, read again once they have."""
    return snapshot_load(
        settling=False,
        silence_floor=None,
        policy=POLICY.get(),
        measurements=MEASUREMENTS.get(),
    )


def _spec(snap: Snapshot, name: str) -> ModelSpec:
    spec = snap.models.get(name)
    if spec is None:
        raise NotFound(f"There is no model {name!r}.")
    return spec


def model_headroom(*, name: str, limit: int) -> dict:
    """How many more replicas of a model fit now, and why not one more (changing nothing)."""
    snap = _standing_snapshot()
    spec = _spec(snap, name)
    now = clock.now()
    st = standing(snap, now, settings.LLMGW.timings)
    st.inv.unreserve(name)
    room = headroom(
        spec,
        st.inv,
        st.live.get(name, 0),
        limit,
        snap.policy,
        st.ctx.usage,
        snap.measurements,
    )
    return room.as_dict()


def model_target(*, name: str, tokens_per_sec: float) -> dict:
    """Replicas a throughput needs, from the model's measurement, and whether they fit."""
    snap = _standing_snapshot()
    spec = _spec(snap, name)
    st = standing(snap, clock.now(), settings.LLMGW.timings)
    st.inv.unreserve(name)
    running = [r.profile for r in snap.replicas if r.model == name and r.state in ACTIVE]
    try:
        sized = replicas_needed(spec, tokens_per_sec, running, snap.measurements)
    except NotMeasured as exc:
        raise Invalid(str(exc)) from None
    if sized[0] > MAX_REPLICAS:
        raise Invalid(
            f"{tokens_per_sec:g} tokens/s would need {sized[0]} replicas of {name} at "
            f"{sized[1].tok_per_sec:g} each; a model may ask for at most {MAX_REPLICAS}."
        )
    current = st.live.get(name, 0)
    room = headroom(
        spec,
        st.inv,
        current,
        max(sized[0] - current, 0),
        snap.policy,
        st.ctx.usage,
        snap.measurements,
    )
    return target(spec, tokens_per_sec, sized, room)


def model_preemption(*, name: str) -> dict:
    """The preemption dry run: what would be stopped for one more replica, and what may not."""
    snap = _standing_snapshot()
    return preemption_dry_run(_spec(snap, name), snap, clock.now(), settings.LLMGW.timings)


def node_rooms() -> list:
    """Each node's free room as placement counts it now (for sizing what would fit where)."""
    st = standing(_standing_snapshot(), clock.now(), settings.LLMGW.timings)
    return list(st.inv.rooms.values())


def reconciler_status(*, now: datetime) -> dict:
    """When the last pass began, whether it settles, and a sentence when passes stopped
    (fleet/domain/passes.py): what `ctl models`, the cluster page and GET /reconciler say."""
    from django.conf import settings

    from .domain.passes import stale_warning
    from .models import Lease

    row = (
        Lease.objects.filter(pk="reconciler")
        .values_list("last_pass_at", "settle_until", "served_since")
        .first()
    )
    last_pass_at, settle_until, served_since = row or (None, None, None)
    cfg = settings.LLMGW
    return {
        "last_pass_at": last_pass_at,
        "settling": settle_until is not None and now < settle_until,
        "interval_s": cfg.timings.reconcile_interval,
        "warning": stale_warning(
            now=now,
            last_pass_at=last_pass_at,
            served_since=served_since,
            embedded=cfg.embedded,
            t=cfg.timings,
        ),
    }


def replicas_print() -> tuple:
    """(state, count, latest state change) per state, in one scan of the replicas: the
    gateway reads its routes again only when this moved."""
    rows = Replica.objects.order_by().values_list("state").annotate(Count("id"), Max("state_since"))
    return tuple(sorted(rows))


def routing_rows(*, since: datetime | None) -> list[tuple]:
    """What the gateway routes by: (id, model, profile, state, first shard's endpoint, state
    since, unhealthy) of each active replica; with `since`, of every replica whose state
    changed from then on, whatever its state now."""
    qs = Replica.objects.order_by()
    qs = qs.filter(state__in=ACTIVE) if since is None else qs.filter(state_since__gte=since)
    rows = qs.values_list("id", "model", "profile", "state", "state_since", "unhealthy_since")
    if since is None:
        endpoints = dict(
            Shard.objects.filter(rank=0, replica__state="ready").values_list(
                "replica_id", "endpoint"
            )
        )
    else:
        endpoints = _first_endpoints([r[0] for r in rows if r[3] == "ready"])
    return [
        (i, m, p, st, endpoints.get(i, ""), t, sick is not None) for i, m, p, st, t, sick in rows
    ]


def _first_endpoints(replica_ids: list[str]) -> dict[str, str]:
    """Each replica's first shard's endpoint, read in chunks the databases accept."""
    out: dict[str, str] = {}
    for chunk in _chunks(replica_ids):
        out.update(
            Shard.objects.filter(replica_id__in=chunk, rank=0).values_list("replica_id", "endpoint")
        )
    return out


def on_demand_trouble(model: str) -> str | None:
    """Why an on-demand model cannot start, from the reconciler's last word: None while
    it may still come."""
    row = (
        ModelState.objects.filter(pk=model)
        .values("parked_since", "parked_reason", "unplaceable", "explanation")
        .first()
    )
    if row is None:
        return None
    if row["parked_since"]:
        return f"parked: {row['parked_reason'] or 'it failed to start too often'}"
    if row["unplaceable"]:
        entries = [e for e in row["explanation"] or [] if isinstance(e, dict)]
        first = next((r for e in entries for r in e.get("reasons", ())), "")
        return f"no room: {first or 'no node can take it now'}"
    return None
