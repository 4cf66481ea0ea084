"""Fleet reads: the reconciler's snapshot, and the views the API and pages show.

The snapshot is read with a handful of queries over plain values (no model
instances), since a pass at 5,000 nodes and 10,000 replicas must stay cheap.
"""

from __future__ import annotations

from collections import defaultdict
from datetime import datetime

from catalog.domain import ModelSpec, reservation_warnings
from catalog.selectors import catalog_load
from llmgw import clock
from llmgw.errors import NotFound

from .domain.gpuclass import CLASS_LABEL
from .domain.reconcile import desired_replicas
from .domain.types import (
    HOLDING,
    GpuView,
    ModelState as ModelStateView,
    NodeView,
    ReplicaView,
    ShardView,
    Snapshot,
)
from .models import Gpu, ModelState, Node, Replica, Shard

_NODE_FIELDS = (
    "id",
    "state",
    "last_seen",
    "cordoned",
    "draining",
    "labels",
    "memory_total_mb",
    "cpu_count",
    "engines",
    "engines_probed",
    "disk_free_gb",
    "weights",
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
)
_SHARD_FIELDS = (
    "id",
    "replica_id",
    "node_id",
    "rank",
    "gpu_indices",
    "memory_gb",
    "cpu_cores",
    "http_port",
    "state",
)
_STATE_FIELDS = [f.name for f in ModelState._meta.fields if f.name != "updated_at"]


def node_views() -> dict[str, NodeView]:
    gpus: dict[str, list[GpuView]] = defaultdict(list)
    for node_id, index, gpu_class, healthy in Gpu.objects.values_list(
        "node_id", "index", "gpu_class", "healthy"
    ):
        gpus[node_id].append(GpuView(index=index, gpu_class=gpu_class, healthy=healthy))
    views = {}
    for row in Node.objects.values_list(*_NODE_FIELDS):
        d = dict(zip(_NODE_FIELDS, row, strict=True))
        override = (d["labels"] or {}).get(CLASS_LABEL)
        node_gpus = tuple(
            GpuView(index=g.index, gpu_class=override or g.gpu_class, healthy=g.healthy)
            for g in sorted(gpus.get(d["id"], ()), key=lambda g: g.index)
        )
        views[d["id"]] = NodeView(
            id=d["id"],
            state=d["state"],
            last_seen=d["last_seen"],
            cordoned=d["cordoned"],
            draining=d["draining"],
            labels=d["labels"] or {},
            memory_gb=d["memory_total_mb"] / 1024 if d["memory_total_mb"] else None,
            cpu_count=d["cpu_count"] or None,
            gpus=node_gpus,
            engines=frozenset(d["engines"] or ()) if d["engines_probed"] else None,
            disk_free_gb=d["disk_free_gb"],
            weights=frozenset(
                w.get("source", "") for w in d["weights"] or () if isinstance(w, dict)
            ),
        )
    return views


def replica_views(*, model: str | None = None) -> tuple[ReplicaView, ...]:
    replicas = Replica.objects.all()
    shards = Shard.objects.all()
    if model:
        replicas = replicas.filter(model=model)
        shards = shards.filter(replica__model=model)
    by_replica: dict[str, list[ShardView]] = defaultdict(list)
    for row in shards.values_list(*_SHARD_FIELDS):
        d = dict(zip(_SHARD_FIELDS, row, strict=True))
        replica_id = d.pop("replica_id")
        d["gpu_indices"] = tuple(d["gpu_indices"] or ())
        by_replica[replica_id].append(ShardView(**d))
    views = []
    for row in replicas.values_list(*_REPLICA_FIELDS):
        d = dict(zip(_REPLICA_FIELDS, row, strict=True))
        d["shards"] = tuple(sorted(by_replica.get(d["id"], ()), key=lambda s: s.rank))
        views.append(ReplicaView(**d))
    return tuple(views)


def model_states() -> dict[str, ModelStateView]:
    states = {}
    for row in ModelState.objects.values_list(*_STATE_FIELDS):
        d = dict(zip(_STATE_FIELDS, row, strict=True))
        d["explanation"] = tuple(d["explanation"] or ())
        states[d["model"]] = ModelStateView(**d)
    return states


def snapshot_load(*, settling: bool, silence_floor: datetime | None) -> Snapshot:
    """Everything a pass decides on, read at once."""
    return Snapshot(
        nodes=node_views(),
        models=catalog_load(),
        replicas=replica_views(),
        states=model_states(),
        settling=settling,
        silence_floor=silence_floor,
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
    }


def replicas_list(*, model: str | None = None) -> list[dict]:
    catalog = catalog_load()
    endpoints = dict(Shard.objects.filter(rank=0).values_list("id", "endpoint"))
    views = sorted(replica_views(model=model), key=lambda r: (r.model, r.created_at))
    return [replica_out(r, catalog.get(r.model), endpoints) for r in views]


def _node_out(node: Node, gpus: list[Gpu], used: dict[int, str], replicas: list[str]) -> dict:
    view_state = NodeView(
        id=node.id, state=node.state, cordoned=node.cordoned, draining=node.draining
    ).shown_state
    override = (node.labels or {}).get(CLASS_LABEL)
    classes = sorted({override or g.gpu_class for g in gpus})
    return {
        "id": node.id,
        "hostname": node.hostname,
        "state": view_state,
        "labels": node.labels,
        "gpu_total": len(gpus),
        "gpu_free": sum(1 for g in gpus if g.healthy and g.index not in used),
        "gpu_class": ", ".join(classes) or None,
        "gpus": [
            {
                "index": g.index,
                "uuid": g.uuid,
                "name": g.name,
                "memory_mb": g.memory_mb,
                "class": override or g.gpu_class,
                "healthy": g.healthy,
                "replica": used.get(g.index),
            }
            for g in gpus
        ],
        "memory_gb": round(node.memory_total_mb / 1024, 1) if node.memory_total_mb else None,
        "cpu_count": node.cpu_count,
        "engines": node.engines,
        "disk": {"free_gb": node.disk_free_gb, "total_gb": node.disk_total_gb},
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
    states = model_states()
    counts: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
    replicas = Replica.objects.filter(model__in=list(catalog)) if name else Replica.objects.all()
    for model, state in replicas.values_list("model", "state"):
        counts[model][state] += 1
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
                "measured_memory_gb": None,
                "warnings": reservation_warnings(spec),
                "preempted": state.preempted if state else 0,
                "held_for": state.held_for if state else "",
                "unplaceable": bool(state and state.unplaceable),
                "parked": bool(state and state.parked_since),
                "failures": state.failures if state else 0,
                "profiles": [p.to_dict() | {"fingerprint": p.fingerprint()} for p in spec.profiles],
                "fallbacks": list(spec.fallbacks),
                "routing_profile": spec.routing_profile,
                "declared": spec.declared,
            }
        )
    return out


def model_explain(*, name: str) -> dict:
    """Why the model's last placement failed, per profile and node."""
    view = model_views(name=name)[0]
    state = model_states().get(name)
    return {
        "model": name,
        "unplaceable": view["unplaceable"],
        "reason": view["reason"],
        "explanation": list(state.explanation) if state else [],
    }
