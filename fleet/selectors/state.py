"""The fleet's state as every reader sees it: each node, replica and model state as a view,
built again only for rows the database numbered anew (fleet/selectors/rows.py), and shared
by the reconciler's snapshot, the API, the pages and the gateway.
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Mapping
from datetime import datetime
from operator import itemgetter

from django.conf import settings

from catalog.selectors import catalog_load
from llmgw.core import reads
from mirror.selectors import builds_offered
from tenancy.quota import Holding

from ..domain.fabric import gpu_domain, gpu_problem, nvlink_peers
from ..domain.gpuclass import CLASS_LABEL
from ..domain.holdings import holdings
from ..domain.types import (
    Failure,
    GpuView,
    ModelState as ModelStateView,
    NodeView,
    ReplicaView,
    Reservation,
    ShardView,
)
from ..models import Gpu, ModelState, Node, Replica, Shard
from .installs import installs_of, with_installable
from .rows import (
    CHUNK,
    RowsByRevision,
    aware,
    chunks,
    date_columns,
    decoded,
    memoized,
    raw_json,
    raw_values,
    views_of,
)

# What changes between registrations, what a node's number moves with (migration 0015); the
# rest is cached per node, and the last-seen time read alone (it moves with every heartbeat).
_NODE_VIEWED = (
    "id",
    "state",
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
    "address_refusal",
    "imex",
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
    if f.name not in ("updated_at", "explanation", "reserved", "last_failure", "rev")
]

# Per-process caches of what a pass would otherwise decode again every few seconds at
# 5,000 nodes: keyed by what the database says changed, so other processes' writes count.
_node_static: dict[str, tuple[datetime | None, dict]] = {}
_shard_static: dict[tuple[str, str], dict] = {}


def caches_clear() -> None:
    """Forget every cached view (tests reuse ids and clocks across databases)."""
    for cache in (_node_static, _node_cache, _shard_static, _replica_cache, _state_cache, _memo):
        cache.clear()
    for rows in (_NODE_ROWS, _REPLICA_ROWS, _SHARD_ROWS, _STATE_ROWS):
        rows.clear()
    _node_built[0] = None


def _load_node_static(stale: dict[str, datetime | None]) -> None:
    ids = list(stale)
    gpus: dict[str, list[tuple]] = defaultdict(list)
    gpu_rows = Gpu.objects.order_by().values_list(
        "node_id",
        "index",
        "gpu_class",
        "healthy",
        "unknown_processes",
        "memory_mb",
        "fabric",
        "cordoned",
    )
    node_rows = Node.objects.order_by().values_list(*_NODE_STATIC)
    # A few nodes are named in the query; many (a restart, every node registering) are read
    # all at once, two queries however many.
    named = len(ids) <= CHUNK
    rows = []
    for chunk in chunks(ids) if named else [ids]:
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
                    GpuView(
                        index=i,
                        gpu_class=override or c,
                        healthy=h,
                        held=bool(u),
                        memory_mb=m,
                        **gpu_fabric_fields(d["id"], i, fabric, cordoned=cordoned),
                    )
                    for i, c, h, u, m, fabric, cordoned in sorted(gpus[d["id"]], key=itemgetter(0))
                ),
                "engines": frozenset(d["engines"] or ()) if d["engines_probed"] else None,
                "disk_free_gb": d["disk_free_gb"],
                "weights": frozenset(
                    w.get("source", "") for w in d["weights"] or () if isinstance(w, dict)
                ),
                "platform": d["platform"],
                "installs": installs_of(d["engine_installs"]),
                "address_refusal": d["address_refusal"],
                **node_fabric_fields(d["imex"]),
            },
        )


def gpu_fabric_fields(
    node_id: str, index: int, fabric: Mapping | None, *, cordoned: bool = False
) -> dict:
    """A GPU's placement fields (GpuView.problem, domain, nvlink_peers, cordoned) from its
    row's `fabric` and `cordoned`, through the pure rules of fleet/domain/fabric.py.
    A GPU whose agent said nothing of its fabric has no problem, domain nor peers."""
    report = {**(fabric if isinstance(fabric, Mapping) else {}), "index": index}
    return {
        "problem": gpu_problem(report, node_id=node_id),
        "domain": gpu_domain(report),
        "nvlink_peers": nvlink_peers(report),
        "cordoned": bool(cordoned),
    }


def node_fabric_fields(imex: Mapping | None) -> dict:
    """A node's placement field NodeView.imex from its row's `imex`: True while its agent
    says IMEX is up, False down, None where it has none or did not say."""
    state = imex.get("state") if isinstance(imex, Mapping) else None
    return {"imex": None if state not in ("up", "down") else state == "up"}


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
    """Every node as placement sees it, told which engines it would install
    (`engine_installs.with_installable`)."""
    return nodes_heard()[0]


def nodes_heard() -> tuple[dict[str, NodeView], dict[str, datetime]]:
    """`node_views`, and when each node was last heard from. A node's view is built again
    only when its row or what the mirror offers changed: the same view object pass after
    pass while only its last-seen time moves (every heartbeat)."""
    # The last-seen times move with every heartbeat: read with the numbers, in one query.
    seen = raw_values(Node.objects.order_by(), ("id", "rev", "last_seen"))
    rows = _NODE_ROWS.read(revs=[(node_id, rev) for node_id, rev, _ in seen])
    offer = (builds_offered(), settings.LLMGW.vllm.version)
    if offer != _node_offer[0]:
        _node_cache.clear()
        _node_built[0] = None
        _node_offer[0] = offer
    built = _node_built[0]
    if built is None or built[0] is not rows:  # the same list while no node's number moved
        _node_views_build(rows)
        built = _node_built[0] = (rows, {row[0]: _node_cache[row[0]][1] for row in rows})
    heard = {node_id: aware(at) for node_id, _, at in seen if node_id in built[1]}
    return dict(built[1]), heard


def _node_views_build(rows: list[tuple]) -> None:
    stale = [r for r in rows if (hit := _node_cache.get(r[0])) is None or hit[0] != r]
    if not stale and len(rows) == len(_node_cache):
        return
    registered = node_registrations({r[0]: aware(r[7]) for r in rows})
    built = {}
    for row in stale:
        node_id, state, cordoned, draining, approved, memory_mb, cpus, _ = row
        built[node_id] = NodeView(
            id=node_id,
            state=state,
            cordoned=cordoned,
            draining=draining,
            approved=approved,
            memory_gb=memory_mb / 1024 if memory_mb else None,
            cpu_count=cpus or None,
            **registered[node_id],
        )
    built = with_installable(built) if built else built
    for row in stale:
        _node_cache[row[0]] = (row, built[row[0]])
    for gone in _node_cache.keys() - registered.keys():
        del _node_cache[gone]


# Every node's row as the views were built from it (read by its number).
_NODE_ROWS = RowsByRevision(Node, _NODE_VIEWED, order=itemgetter(0))
# What the mirror offered and the pinned vLLM when the views were built: what each view was
# told it would install (with_installable), so its views are built again when it moves.
_node_offer: list = [None]
# Per node: its row and its view; and the rows every view was last built from, with them.
_node_cache: dict[str, tuple[tuple, NodeView]] = {}
_node_built: list[tuple[list, dict[str, NodeView]] | None] = [None]


def _group_shards(rows: list[tuple]) -> dict[str, tuple[ShardView, ...]]:
    """Shards by replica, in rank order: where they are and what they hold never changes, so
    it is cached by id, and only their state is read each time."""
    unknown = [r[0] for r in rows if (r[0], r[2]) not in _shard_static]
    for chunk in chunks(unknown):
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


_memo: dict[str, tuple] = {}
_replica_cache: dict[str, tuple] = {}
_state_cache: dict[str, tuple] = {}
# What each pass reads of every replica, shard and model state, by the rows' revisions;
# the replicas come by model and age, as the model's ordering gives them.
_REPLICA_ROWS = RowsByRevision(Replica, _REPLICA_FIELDS, order=lambda r: (r[1], r[5]))
_SHARD_ROWS = RowsByRevision(Shard, ("id", "replica_id", "node_id", "state"))
_STATE_ROWS = RowsByRevision(
    ModelState, (*_STATE_FIELDS, "last_failure", "explanation", "reserved")
)


def replica_views(
    *, model: str | None = None, by_revision: bool = False
) -> tuple[ReplicaView, ...]:
    """Every replica (or one model's) with its shards, by model and age; the views of
    unchanged rows are last time's. Inside llmgw.core.reads.once_each, read once.

    `by_revision` (the pass, every few seconds): of every replica and shard, only the
    rows the database numbered anew since the last such read are read in full
    (`_REPLICA_ROWS`, `_SHARD_ROWS`)."""
    if reads.sharing():
        every = reads.once("replicas", lambda: _replica_views_read(by_revision=by_revision))
        return every if model is None else tuple(r for r in every if r.model == model)
    return _replica_views_read(model=model, by_revision=by_revision)


def _replica_views_read(
    *, model: str | None = None, by_revision: bool = False
) -> tuple[ReplicaView, ...]:
    if model is None and by_revision:
        rows, shard_rows = _REPLICA_ROWS.read(), _SHARD_ROWS.read()
        return memoized(
            _memo, "replicas", (rows, shard_rows), lambda _: _replica_views(rows, shard_rows)
        )
    replicas = Replica.objects.all()
    # In no order: they are grouped by replica and put in rank order there, and the sort
    # the model's ordering asks for was most of reading them.
    shards = Shard.objects.order_by()
    if model:
        replicas = replicas.filter(model=model)
        shards = shards.filter(replica__model=model)
    shard_rows = raw_values(shards, ("id", "replica_id", "node_id", "state"))
    rows = raw_values(replicas, _REPLICA_FIELDS)
    if model is None:
        # The whole fleet, as each pass reads it: the same rows give the same views.
        return memoized(
            _memo, "replicas", (rows, shard_rows), lambda _: _replica_views(rows, shard_rows)
        )
    return _replica_views(rows, shard_rows)


def _replica_views(rows: list[tuple], shard_rows: list[tuple]) -> tuple[ReplicaView, ...]:
    by_replica = _group_shards(shard_rows)
    dates = date_columns(Replica, _REPLICA_FIELDS)
    return tuple(
        views_of(
            _replica_cache,
            rows,
            key=lambda row: (row[0], row, by_replica.get(row[0], ())),
            build=lambda row: ReplicaView(
                **dict(zip(_REPLICA_FIELDS, decoded(row, dates), strict=True)),
                shards=by_replica.get(row[0], ()),
            ),
        )
    )


def model_states(
    *, name: str | None = None, by_revision: bool = False
) -> dict[str, ModelStateView]:
    """Every model's controller state (or one's); explanations (JSON) are read only where
    there is one. Inside llmgw.core.reads.once_each, read once. `by_revision` (the pass):
    only the rows the database numbered anew since the last such read are read in full,
    JSON and all (`_STATE_ROWS`)."""
    if reads.sharing():
        every = reads.once("states", lambda: _model_states_read(by_revision=by_revision))
        return dict(every) if name is None else {k: v for k, v in every.items() if k == name}
    return _model_states_read(name=name, by_revision=by_revision)


def _model_states_read(
    *, name: str | None = None, by_revision: bool = False
) -> dict[str, ModelStateView]:
    dates = date_columns(ModelState, _STATE_FIELDS)
    if name is None and by_revision:
        parts = memoized(_memo, "state_rows", _STATE_ROWS.read(), _state_parts)
        return _model_states_built(*parts, dates, memo=True)
    states = ModelState.objects.all() if name is None else ModelState.objects.filter(pk=name)
    explanations = dict(states.exclude(explanation=[]).values_list("model", "explanation"))
    reserved = {
        model: tuple(Reservation.of(r) for r in rows if isinstance(r, dict))
        for model, rows in states.exclude(reserved=[]).values_list("model", "reserved")
    }
    # The last failure (JSON) comes with the row: its column is null for most models.
    rows = raw_values(states, (*_STATE_FIELDS, "last_failure"))
    return _model_states_built(rows, explanations, reserved, dates, memo=name is None)


def _state_parts(every: list[tuple]) -> tuple[list[tuple], dict, dict]:
    """Rows read with their explanation and reservations last: the rows without them, and
    those two by model where there are any."""
    rows = [row[:-2] for row in every]
    explanations = {row[0]: raw_json(row[-2]) for row in every if row[-2] not in _EMPTY}
    reserved = {
        row[0]: tuple(Reservation.of(r) for r in raw_json(row[-1]) if isinstance(r, dict))
        for row in every
        if row[-1] not in _EMPTY
    }
    return rows, explanations, reserved


# An empty JSON list as each driver hands it over (SQLite: text; PostgreSQL: the list).
_EMPTY = ("[]", [], None)


def _model_states_built(
    rows: list[tuple], explanations: dict, reserved: dict, dates: tuple[int, ...], *, memo: bool
) -> dict[str, ModelStateView]:
    """The states' views, last time's for unchanged rows (`memo`: every model's, as a pass
    reads them, kept whole while the rows are the same)."""

    def build(_) -> dict[str, ModelStateView]:
        views = views_of(
            _state_cache,
            rows,
            key=lambda row: (
                row[0],
                row,
                tuple(explanations.get(row[0]) or ()),
                reserved.get(row[0], ()),
            ),
            build=lambda row: ModelStateView(
                **dict(zip(_STATE_FIELDS, decoded(row[:-1], dates), strict=True)),
                explanation=tuple(explanations.get(row[0]) or ()),
                reserved=reserved.get(row[0], ()),
                last_failure=_failure_of(row[-1]),
            ),
        )
        return {v.model: v for v in views}

    if memo:
        # Every model's, as each pass reads them: the same rows give the same views.
        return dict(memoized(_memo, "states", (rows, explanations, reserved), build))
    return build(None)


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


def holdings_load() -> list[Holding]:
    """What every replica holds now, and for whom (for quotas' holds and the policy)."""
    return holdings(replica_views(), catalog_load())
