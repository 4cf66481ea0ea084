"""Nodes and replicas as the API, ctl and the pages show them, and what the fleet knows of
each model for its listing (catalog/selectors/listings.py composes that). Reads only."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import asdict
from datetime import datetime

from django.db.models.fields.json import KeyTransform

from catalog.domain import ModelSpec
from catalog.selectors import catalog_load
from llmgw.core import clock
from llmgw.core.errors import NotFound

from ..domain.fabric import gpu_problem
from ..domain.gpuclass import CLASS_LABEL
from ..domain.plan import duration
from ..domain.readings import Reading
from ..domain.reconcile import held_for
from ..domain.refusals import one_line
from ..domain.spread import location_of
from ..domain.types import ACTIVE, HOLDING, ModelState as ModelStateView, NodeView, ReplicaView
from ..models import Gpu, Node, Replica, Shard
from .installs import installing_said, installs_of
from .passes import drains_stuck
from .routing import replica_readings
from .state import model_states, replica_views


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
    readings = replica_readings(views)
    return [
        {
            **replica_out(r, catalog.get(r.model), endpoints),
            "fetching": fetching.get(r.id),
            "engine": reading_out(readings.get(r.id)),
        }
        for r in views
    ]


def reading_out(reading: Reading | None) -> dict | None:
    """A replica's engine reading as the API and the pages show it, its adapters by name and
    those its node fetches (absent when none); None when none said."""
    if reading is None:
        return None
    out = asdict(reading)
    if reading.slots is None:
        del out["slots"]  # left to the engine's default: unknown, as before slots were said
    if reading.adapters is None:
        del out["adapters"]  # said nothing of them: as before adapters were read
    else:
        out["adapters"] = [name for name, _ in reading.adapters]
    del out["fetching"]
    if reading.fetching:
        out["adapters_fetching"] = [
            {"name": name, "done": done, "total": total} for name, done, total in reading.fetching
        ]
    return out


def replicas_fetching() -> dict[str, dict]:
    """Replicas whose agents are fetching their weights: bytes done and total (None unknown)."""
    rows = Shard.objects.filter(state="fetching").values_list(
        "replica_id", "progress_done", "progress_total"
    )
    return {rid: {"done": done or 0, "total": total} for rid, done, total in rows}


# The parts of a GPU's fabric report gpu_problem reads: not its links, kilobytes a GPU
# on a rack, which the list leaves unread.
_PROBLEM_PARTS = ("ecc", "fabric", "xids")


def _kept(node_id: str, gpu: Gpu) -> bool:
    """Whether a GPU takes no new replica though healthy: cordoned, or a problem in its
    fabric report (fleet/domain/fabric.py), as placement reads them."""
    parts = {p: getattr(gpu, f"part_{p}", None) for p in _PROBLEM_PARTS}
    report = {p: v for p, v in parts.items() if v is not None} | {"index": gpu.index}
    return gpu.cordoned or gpu_problem(report, node_id=node_id) is not None


def _node_out(
    node: Node,
    gpus: list[Gpu],
    used: dict[int, str],
    replicas: list[str],
    stuck: str = "",
    *,
    one: bool = False,
) -> dict:
    view_state = NodeView(
        id=node.id,
        state=node.state,
        cordoned=node.cordoned,
        draining=node.draining,
        approved=node.approved,
        address_refusal=node.address_refusal,
    ).shown_state
    override = (node.labels or {}).get(CLASS_LABEL)
    classes = sorted({override or g.gpu_class for g in gpus})
    return {
        "id": node.id,
        "hostname": node.hostname,
        "state": view_state,
        # What an operator set, which a lost or unreachable state hides.
        "cordoned": node.cordoned,
        "draining": node.draining,
        "labels": node.labels,
        "location": location_of(node.labels or {}),
        "gpu_total": len(gpus),
        # Free as placement counts it: a GPU kept out of service (a problem, a cordon) is not.
        "gpu_free": sum(
            1
            for g in gpus
            if g.healthy
            and not g.unknown_processes
            and g.index not in used
            and not _kept(node.id, g)
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
                "cordoned": g.cordoned,
                # Its fabric, NVLinks, memory errors and Xids as its agent last said
                # (fleet/protocol.py GpuFabricReport); null: it said nothing of them. Only
                # for one node: a rack's links are kilobytes a GPU.
                **({"fabric": g.fabric} if one else {}),
            }
            for g in gpus
        ],
        "memory_gb": round(node.memory_total_mb / 1024, 1) if node.memory_total_mb else None,
        "cpu_count": node.cpu_count,
        "engines": node.engines,
        "engine_installs": [i.__dict__ for i in installs_of(node.engine_installs)],
        "disk": {"free_gb": node.disk_free_gb, "total_gb": node.disk_total_gb},
        # Its IMEX service and InfiniBand ports as its agent last said; null: none, or unsaid.
        "imex": node.imex,
        "ib_ports": node.ib_ports,
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
        "seen_addr": node.seen_addr,
        "approved_addr": node.approved_addr,
        "address_refusal": node.address_refusal,
        # A drain that cannot go on for lack of room, and why; "" otherwise.
        "drain_stuck": stuck,
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
    rows = Gpu.objects.annotate(**{f"part_{p}": KeyTransform(p, "fabric") for p in _PROBLEM_PARTS})
    for g in rows.filter(node_id__in=ids) if node_id else rows.defer("fabric"):
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
    # Only while a node drains: its drain may be stuck for lack of room.
    stuck = drains_stuck() if any(n.draining for n in nodes) else {}
    return [
        _node_out(
            n,
            gpus[n.id],
            used[n.id],
            sorted(replicas[n.id]),
            stuck.get(n.id, ""),
            one=node_id is not None,
        )
        for n in nodes
    ]


def counted_as(replica: ReplicaView) -> str:
    """What a replica counts as among its model's: its state, or "retiring" while it serves
    on its way out (a restart, its node's drain). A retiring replica no longer counts
    toward the model's replicas, as the reconciler and headroom count them."""
    return "retiring" if replica.retiring and replica.state in ACTIVE else replica.state


def model_status(
    spec: ModelSpec,
    state: ModelStateView | None,
    desired: int,
    ready: int,
    starting: int,
    now: datetime | None = None,
) -> tuple[str, str]:
    """A model's one-word status and the sentence behind it. A model whose replicas fail
    to start is ``failing``, with why (the engine's line that says it) and its next try."""
    if state and state.parked_since:
        return "parked", state.parked_reason
    if desired == 0:
        return ("idle" if spec.on_demand else "stopped"), ""
    if ready >= desired:
        return "ready", ""
    if state and state.failures:
        return "failing", failing_said(state, starting, now or clock.now())
    first = one_line(state.explanation) if state else ""
    if state and state.unplaceable:
        return "unplaceable", first
    if starting:
        return "starting", first
    return "waiting", first


def failing_said(state: ModelStateView, starting: int, now: datetime) -> str:
    """Why a model fails and when it tries again: "invalid magic characters: 'This',
    expected 'GGUF'; 3 failures, next try in 40s"."""
    said = state.last_failure.summary if state.last_failure else ""
    count = f"{state.failures} failure{'' if state.failures == 1 else 's'}"
    if starting:
        when = "trying again now"
    elif state.backoff_until and state.backoff_until > now:
        when = f"next try in {duration((state.backoff_until - now).total_seconds() + 0.999)}"
    else:
        when = "next try on the next pass"
    return "; ".join(part for part in (said, f"{count}, {when}") if part)


def failure_shown(state: ModelStateView | None) -> dict | None:
    """The model's last failure as the API shows it, while it backs off or is parked;
    None otherwise (a retry or a ready replica has put it behind it)."""
    if state is None or state.last_failure is None:
        return None
    if not (state.failures or state.parked_since):
        return None
    failure = state.last_failure
    return failure.as_dict() | {"said": failure.summary, "exit": failure.exit_said}


def held_for_shown(state: ModelStateView | None, counts: dict, states: dict) -> str:
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


def replica_states(model: str) -> list[str]:
    """The state of each of a model's replicas (one query)."""
    return list(Replica.objects.filter(model=model).values_list("state", flat=True))


def ready_node_sizes() -> list[tuple[float | None, int]]:
    """Each ready node's memory in GB (None unknown) and CPU count, for the cores a CPU-only
    model is suggested (one query)."""
    return [
        (mb / 1024 if mb else None, cpus)
        for mb, cpus in Node.objects.filter(state=Node.READY).values_list(
            "memory_total_mb", "cpu_count"
        )
    ]


def placement_explained(*, name: str, spec: ModelSpec | None) -> dict:
    """Why a model's last placement failed, per profile and node, and the engines being
    installed for it."""
    state = model_states(name=name).get(name)
    return {
        "explanation": list(state.explanation) if state else [],
        "installing": installing_said(spec),
    }
