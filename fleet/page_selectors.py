"""Reads for the cluster and node pages: every row in a fixed number of queries.

The API's `nodes_list` and `model_views` build whole model instances and every
profile's fingerprint; at 5,000 nodes and 500 models, refreshed every five
seconds, that is most of a page. These read only what the tables show, in
plain values, and take the replicas (`replica_views`, cached per process) from
the caller so the nodes, models and quotas share one read of them.
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Iterable, Mapping
from datetime import datetime
from typing import TypedDict

from django.db import connection
from django.db.models import Q
from django.db.models.fields.json import KeyTransform

from catalog.domain import ModelSpec, reservation_warnings
from tenancy.models import CapacityQuota
from tenancy.selectors import quota_views

from .domain.holdings import holdings
from .domain.reconcile import desired_replicas
from .domain.types import HOLDING, Failure, ModelState as ModelStateView, NodeView, ReplicaView
from .listings import failure_shown, held_for_shown, measured_memory, model_status
from .models import ModelState, Node, Shard
from .selectors import aware, node_registrations

# What an operator sees, most troubled first: the order of `?sort=state`.
SHOWN_STATES = ("lost", "unreachable", "draining", "cordoned", "ready")
DOWN = frozenset({"lost", "unreachable"})
# Load figures the nodes table shows, as kept in Node.load (fleet/events.py, Load).
_LOAD_KEYS = ("load1", "memory_used_bytes", "cpu_temp_c", "cpu_power_w", "inlet_temp_c")
# The node sensors: a column only when some node reports it.
NODE_SENSORS = ("cpu_temp_c", "cpu_power_w", "inlet_temp_c")


class NodeRow(TypedDict):
    """One node as the cluster page's table shows it; None is not reported.

    Rows are plain dicts: a template looks a dict's keys up at once, an object's
    attributes only after failing to index it, which at 600 rows is a tenth of a page.
    """

    id: str
    state: str
    labels: Mapping[str, str]
    gpu_total: int
    gpu_free: int
    gpu_class: str
    memory_gb: float | None
    memory_used_gb: float | None
    cpu_count: int | None
    load1: float | None
    cpu_temp_c: float | None
    cpu_power_w: float | None
    inlet_temp_c: float | None
    replicas: int
    classes: tuple[str, ...]


def _figure(value) -> float | None:
    """A reading from the JSON, or None: anything but a number was not a reading.

    SQLite hands a JSON number over as a number; PostgreSQL's jsonb comes as its text.
    """
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError:
            return None
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return value


def node_rows(replicas: Iterable[ReplicaView]) -> list[NodeRow]:
    """Every node, by id, with its GPUs free and their class, its load and sensors.

    One query, and two more for the nodes that registered since the process last read them
    (the reconciler's cache, fleet.selectors.node_registrations). A
    GPU is free when it is healthy and no holding replica has it, as `nodes_list` says.
    """
    used: dict[str, set[int]] = defaultdict(set)
    on_node: dict[str, set[str]] = defaultdict(set)
    for r in replicas:
        if r.state not in HOLDING:
            continue
        for s in r.shards:
            used[s.node_id].update(s.gpu_indices)
            on_node[s.node_id].add(r.id)
    figures = {f"l_{k}": KeyTransform(k, "load") for k in _LOAD_KEYS}
    query = Node.objects.annotate(**figures).values_list(
        "id",
        "state",
        "cordoned",
        "draining",
        "memory_total_mb",
        "cpu_count",
        "spec_at",
        *figures,
    )
    # Straight from the driver: Django's converters would decode each date and figure again.
    sql, params = query.query.sql_with_params()
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        rows = cursor.fetchall()
    # Keyed as the reconciler keys them, so the two share one cache.
    registered = node_registrations({r[0]: aware(r[6]) for r in rows})
    out = []
    for node_id, state, cordoned, draining, memory_mb, cpus, _, *load in rows:
        load1, mem_used, cpu_temp, cpu_power, inlet = (_figure(v) for v in load)
        known = registered[node_id]
        gpus = known["gpus"]
        classes = tuple(sorted({g.gpu_class for g in gpus}))
        shown = NodeView(id=node_id, state=state, cordoned=bool(cordoned), draining=bool(draining))
        out.append(
            NodeRow(
                id=node_id,
                state=shown.shown_state,
                labels=known["labels"],
                gpu_total=len(gpus),
                gpu_free=sum(1 for g in gpus if g.healthy and g.index not in used[node_id]),
                gpu_class=", ".join(classes),
                memory_gb=memory_mb / 1024 if memory_mb else None,
                memory_used_gb=mem_used / 1024**3 if mem_used is not None else None,
                cpu_count=cpus or None,
                load1=load1,
                cpu_temp_c=cpu_temp,
                cpu_power_w=cpu_power,
                inlet_temp_c=inlet,
                replicas=len(on_node[node_id]),
                classes=classes,
            )
        )
    return out


def nodes_filter(
    rows: Iterable[NodeRow],
    *,
    state: str = "",
    label: tuple[str, str] | None = None,
    gpu_class: str = "",
) -> list[NodeRow]:
    """The rows in a state, carrying a label (key, value) and having a GPU of a class."""
    return [
        r
        for r in rows
        if (not state or r["state"] == state)
        and (label is None or r["labels"].get(label[0]) == label[1])
        and (not gpu_class or gpu_class in r["classes"])
    ]


_SORT_KEYS = {
    "id": lambda r: r["id"],
    "state": lambda r: (
        SHOWN_STATES.index(r["state"]) if r["state"] in SHOWN_STATES else len(SHOWN_STATES)
    ),
    "gpus_free": lambda r: r["gpu_free"] if r["gpu_total"] else None,
    "memory": lambda r: r["memory_gb"],
    "cpus": lambda r: r["cpu_count"],
    "load": lambda r: r["load1"],
}
SORTS = tuple(_SORT_KEYS)


def nodes_sort(rows: list[NodeRow], key: str, *, descending: bool = False) -> list[NodeRow]:
    """Rows by `key` (one of SORTS), ties by id; a node that does not report it goes last."""
    get = _SORT_KEYS[key]
    known = sorted((r for r in rows if get(r) is not None), key=lambda r: r["id"])
    known.sort(key=get, reverse=descending)
    return known + sorted((r for r in rows if get(r) is None), key=lambda r: r["id"])


def nodes_down() -> list[tuple[str, str]]:
    """(id, state) of every node the control plane cannot reach, by id: one query."""
    return list(Node.objects.exclude(state=Node.READY).values_list("id", "state"))


_STATE_FIELDS = (
    "model",
    "desired",
    "failures",
    "parked_since",
    "parked_reason",
    "unplaceable",
    "explanation",
    "held_until",
    "held_for",
    "preempted",
    "last_failure",
)


def _states() -> dict[str, ModelStateView]:
    rows = ModelState.objects.values_list(*_STATE_FIELDS)
    out = {}
    for row in rows:
        d = dict(zip(_STATE_FIELDS, row, strict=True))
        d["explanation"] = tuple(d["explanation"] or ())
        failure = d["last_failure"]
        d["last_failure"] = Failure.of(failure) if isinstance(failure, dict) else None
        out[d["model"]] = ModelStateView(**d)
    return out


def _cause(state: ModelStateView | None) -> dict | None:
    """Why a model backing off or parked failed last, as the attention strip says it:
    `failures`, the engine's last words (`said`) and where (`replica`, `node`,
    `exit_code`); None for a model whose failures do not count now."""
    shown = failure_shown(state)
    if state is None or shown is None:
        return None
    assert state.last_failure is not None
    return shown | {"failures": state.failures, "said": state.last_failure.summary}


class ModelRow(TypedDict):
    """One model as the cluster page's table shows it (a plain dict, as NodeRow)."""

    name: str
    aliases: tuple[str, ...]
    description: str
    status: str
    reason: str
    ready: int
    desired: int
    min: int
    max: int
    capacity_class: str
    held_for: str
    preempted: int
    memory_gb: float | None
    cpu_cores: int | None
    measured_memory_gb: float | None
    warnings: tuple[str, ...]
    profiles: tuple[str, ...]
    fallbacks: tuple[str, ...]
    # While it backs off or is parked: how often it failed, and the engine's last words.
    failing: dict | None


def model_rows(
    catalog: Mapping[str, ModelSpec], replicas: Iterable[ReplicaView], now: datetime
) -> list[ModelRow]:
    """Every model, by name, with what runs of it and why not: two queries."""
    states = _states()
    counts: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
    for r in replicas:
        counts[r.model][r.state] += 1
    measured = measured_memory(replicas, catalog)
    out = []
    for spec in catalog.values():
        state = states.get(spec.name)
        # Before its first pass a model wants what its scaling says, not nothing.
        desired = (
            state.desired if state else desired_replicas(spec, ModelStateView(model=spec.name), now)
        )
        c = counts[spec.name]
        status, reason = model_status(
            spec, state, desired, c["ready"], c["pending"] + c["starting"]
        )
        first = spec.profiles[0]
        out.append(
            ModelRow(
                name=spec.name,
                aliases=spec.aliases,
                description=spec.description,
                status=status,
                reason=reason,
                ready=c["ready"],
                desired=desired,
                min=spec.min_replicas,
                max=spec.max_replicas,
                capacity_class=spec.effective_class,
                held_for=held_for_shown(state, counts, states),
                preempted=state.preempted if state else 0,
                memory_gb=first.min_memory_gb,
                cpu_cores=first.reserved_cores,
                measured_memory_gb=measured.get(spec.name),
                warnings=tuple(reservation_warnings(spec, measured.get(spec.name))),
                profiles=tuple(p.name for p in spec.profiles),
                fallbacks=spec.fallbacks,
                failing=_cause(state),
            )
        )
    return out


_UNITS = {"gpus": "GPUs", "cpu_cores": "cores", "memory_gb": "GB of memory"}


def quotas_at_limit(
    catalog: Mapping[str, ModelSpec], replicas: Iterable[ReplicaView]
) -> list[dict]:
    """Each governed resource a scope holds at or over its limit: scope name, resource,
    holds and limit (the quotas page's figures): one query when no quota sets a limit,
    five when one does."""
    limited = CapacityQuota.objects.filter(
        Q(limit_gpus__isnull=False)
        | Q(limit_cpu_cores__isnull=False)
        | Q(limit_memory_gb__isnull=False)
    )
    if not limited.exists():
        return []
    out = []
    for q in quota_views(holdings=holdings(replicas, catalog)):
        for resource, limit in q["limit"].items():
            held = q["holds"].get(resource, 0)
            if held >= limit:
                out.append(
                    {
                        "scope": q["scope"],
                        "name": q["name"],
                        "resource": resource,
                        "unit": _UNITS.get(resource, resource),
                        "holds": held,
                        "limit": limit,
                    }
                )
    return out


def node_replicas(node_id: str) -> list[dict]:
    """The replicas holding room on a node, by model: id, model, state and its GPUs here."""
    rows = (
        Shard.objects.filter(node_id=node_id, replica__state__in=HOLDING)
        .order_by("replica__model", "replica_id")
        .values_list("replica_id", "replica__model", "replica__state", "gpu_indices")
    )
    return [
        {"id": rid, "model": model, "state": state, "gpus": list(indices or ())}
        for rid, model, state, indices in rows
    ]
