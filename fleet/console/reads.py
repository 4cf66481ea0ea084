"""Reads for the cluster and node pages: every row in a fixed number of queries.

The API's `nodes_list` and `model_views` build whole model instances and every
profile's fingerprint; at 5,000 nodes and 500 models, refreshed every five
seconds, that is most of a page. These read only what the tables show, in
plain values: the nodes' figures from their own columns, sorted and filtered by
the database, and the replicas (`replica_views`, cached per process) from the
caller so the models, quotas and counters share one read of them.
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime
from functools import lru_cache
from typing import TypedDict

from django.db import connection
from django.db.models import (
    BooleanField,
    Case,
    Exists,
    ExpressionWrapper,
    F,
    Func,
    OrderBy,
    Q,
    Value,
    When,
)
from django.db.models.fields.json import KeyTransform
from django.db.models.functions import Collate, NullIf

from catalog.domain import ModelSpec, reservation_warnings
from tenancy.selectors import quota_views

from ..domain.holdings import holdings
from ..domain.power import PDU_LABEL, RACK_LABEL
from ..domain.readings import Reading, replica_reading
from ..domain.reconcile import desired_replicas
from ..domain.types import HOLDING, Failure, ModelState as ModelStateView, ReplicaView
from ..models import Gpu, ModelState, Node, PowerBudget, Shard
from ..selectors.inputs import POLICY
from ..selectors.listings import (
    counted_as,
    failure_shown,
    held_for_shown,
    measured_memory,
    model_status,
)

# What an operator sees, most troubled first: the order of `?sort=state`.
SHOWN_STATES = ("lost", "unreachable", "draining", "cordoned", "ready")
DOWN = frozenset({"lost", "unreachable"})
# The node sensors: a column only when some node reports it.
NODE_SENSORS = ("cpu_temp_c", "cpu_power_w", "inlet_temp_c")


class NodeRow(TypedDict):
    """One node as the cluster page's table shows it; None is not reported.

    Rows are plain dicts: a template looks a dict's keys up at once, an object's
    attributes only after failing to index it, which at 600 rows is a tenth of a page.
    """

    id: str
    state: str
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


# What a node's state reads as on the page (NodeView.shown_state, approval aside).
_SHOWN_STATE = Case(
    When(~Q(state=Node.READY), then=F("state")),
    When(draining=True, then=Value("draining")),
    When(cordoned=True, then=Value("cordoned")),
    default=Value("ready"),
)
# What each order sorts by; None is not reported, and goes last either way.
_SORT_KEYS = {
    "id": None,
    "state": Case(
        *(When(shown=s, then=Value(i)) for i, s in enumerate(SHOWN_STATES)),
        default=Value(len(SHOWN_STATES)),
    ),
    "gpus_free": F("gpu_free"),
    "memory": NullIf(F("memory_total_mb"), Value(0)),
    "cpus": NullIf(F("cpu_count"), Value(0)),
    "load": F("load1"),
}
SORTS = tuple(_SORT_KEYS)
# The columns of a row of `nodes_table`, in order.
_COLUMNS = (
    "id",
    "shown",
    "gpu_total",
    "gpu_free",
    "gpu_classes",
    "memory_total_mb",
    "memory_used_bytes",
    "cpu_count",
    "load1",
    *NODE_SENSORS,
    "replica_count",
    "facility",
    "fabric",
    "asked",
    "of_class",
)
_ID, _STATE, _TOTAL, _FREE, _CLASSES = range(5)
_SENSOR_AT = {s: _COLUMNS.index(s) for s in NODE_SENSORS}
_FACILITY = _COLUMNS.index("facility")
_FABRIC = _COLUMNS.index("fabric")
_ASKED, _OF_CLASS = len(_COLUMNS) - 2, len(_COLUMNS) - 1
# Whether any node says where it is or any power budget exists: the same for every row,
# worked out once by the database (two uncorrelated EXISTS), so that the cluster page
# reads the racks (fleet/selectors/facility.py) only when there are some, without a query to ask.
_ANY_FACILITY = ExpressionWrapper(
    Q(Exists(Node.objects.filter(Q(labels__has_key=RACK_LABEL) | Q(labels__has_key=PDU_LABEL))))
    | Q(Exists(PowerBudget.objects.all())),
    output_field=BooleanField(),
)
# Whether any GPU reports a place in an NVLink fabric: the cluster page links to the
# NVLink page (/fabric) then. The same for every row, worked out once as _ANY_FACILITY.
_ANY_FABRIC = Exists(Gpu.objects.filter(fabric__has_key="fabric"))


class _JsonListHas(Func):
    """Whether a JSON list column holds a string (PostgreSQL's @>; json_each on SQLite)."""

    output_field = BooleanField()

    def as_sqlite(self, compiler, connection, **extra):
        column, params = compiler.compile(self.source_expressions[0])
        value, more = compiler.compile(self.source_expressions[1])
        return (
            f"EXISTS (SELECT 1 FROM json_each({column}) WHERE json_each.value = {value})",
            [*params, *more],
        )

    def as_postgresql(self, compiler, connection, **extra):
        column, params = compiler.compile(self.source_expressions[0])
        value, more = compiler.compile(self.source_expressions[1])
        return f"{column} @> jsonb_build_array({value}::text)", [*params, *more]


def _bytewise_id():
    """The id compared as Python compares strings: PostgreSQL's collation may not."""
    return Collate(F("id"), "C") if connection.vendor == "postgresql" else F("id")


@dataclass(frozen=True)
class NodeTable:
    """Every node in the order asked, what is counted over all of them, and which match.

    `rows` are the database's plain tuples (`node_row` makes one a NodeRow): most are only
    counted, and only the page of them shown is worth a dict.
    """

    rows: list[tuple]
    classes: list[str]
    sensors: dict[str, bool]
    down: list[tuple[str, str]]
    counters: dict[str, int | str]
    facility: bool = False  # a node says where it is, or a power budget exists
    fabric: bool = False  # a GPU reports a place in an NVLink fabric

    def shown(self, *, of_class: bool) -> list[tuple]:
        """The rows in the state and with the label asked; of the class asked too when
        `of_class` (a class the form refused filters nothing)."""
        if of_class:
            return [r for r in self.rows if r[_ASKED] and r[_OF_CLASS]]
        return [r for r in self.rows if r[_ASKED]]


def nodes_table(
    *,
    state: str = "",
    label: tuple[str, str] | None = None,
    gpu_class: str = "",
    sort: str = "id",
    descending: bool = False,
) -> NodeTable:
    """Every node, sorted by the database by `sort` (one of SORTS), ties by id, a node
    that does not report the figure last; each row says whether it is in `state`, carries
    `label` (key, value) and has a GPU of `gpu_class`. One query.

    The figures are the node's own columns (fleet/nodes/figures.py and the load figures the
    database keeps): counting them over 5,000 plain rows is a few milliseconds, where
    deriving them per node was most of the page.
    """
    asked = Q(shown=state) if state else Q()
    if label is not None:
        asked &= Q(label_value=label[1])
    query = Node.objects.annotate(shown=_SHOWN_STATE)
    if label is not None:
        query = query.alias(label_value=KeyTransform(label[0], "labels"))
    of_class = _JsonListHas(F("gpu_classes"), Value(gpu_class)) if gpu_class else Value(True)
    query = query.annotate(
        facility=_ANY_FACILITY,
        fabric=_ANY_FABRIC,
        asked=ExpressionWrapper(asked, output_field=BooleanField()) if asked else Value(True),
        of_class=of_class,
    )
    key = _SORT_KEYS.get(sort)
    if key is None:
        order = [OrderBy(_bytewise_id(), descending=descending)]
    else:
        order = [OrderBy(key, descending=descending, nulls_last=True), OrderBy(_bytewise_id())]
    sql, params = query.order_by(*order).values_list(*_COLUMNS).query.sql_with_params()
    # Straight from the driver: Django's converters would decode every figure again.
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        rows = cursor.fetchall()
    ready = free = gpus = 0
    # GPUs idle on a node nothing new is placed on (cordoned, draining, awaiting approval):
    # not free, and the counter says how many, beside a node row showing them idle.
    unplaceable: dict[str, int] = defaultdict(int)
    down = []
    for r in rows:
        gpus += r[_TOTAL]
        if r[_STATE] == "ready":
            ready += 1
            free += r[_FREE] or 0
        elif r[_STATE] in DOWN:
            down.append((r[_ID], r[_STATE]))
        elif r[_FREE]:
            unplaceable[r[_STATE]] += r[_FREE]
    return NodeTable(
        rows=rows,
        classes=sorted({c for text in {r[_CLASSES] for r in rows} for c in _classes(text)}),
        sensors={s: any(r[i] is not None for r in rows) for s, i in _SENSOR_AT.items()},
        down=sorted(down),
        counters={
            "nodes_ready": ready,
            "nodes": len(rows),
            "gpus_free": free,
            "gpus": gpus,
            "gpus_idle_not_free": idle_not_free(unplaceable),
        },
        facility=bool(rows) and bool(rows[0][_FACILITY]),
        fabric=bool(rows) and bool(rows[0][_FABRIC]),
    )


def idle_not_free(idle: Mapping[str, int]) -> str:
    """What idles where nothing new is placed, by state: "not free: 8 idle on draining
    nodes, 2 on cordoned nodes"; "" when nothing does."""
    parts = [f"{n} on {state} nodes" for state, n in sorted(idle.items()) if n]
    if not parts:
        return ""
    first = parts[0].replace(" on ", " idle on ", 1)
    return "not free: " + ", ".join([first, *parts[1:]])


def _classes(column: str | list) -> tuple[str, ...]:
    """A node's GPU classes from their column (JSON text from either driver)."""
    return _decoded(column) if isinstance(column, str) else tuple(column)


@lru_cache(maxsize=256)
def _decoded(text: str) -> tuple[str, ...]:
    # Most nodes share one of a few lists of classes: each is decoded once.
    return tuple(json.loads(text))


def node_row(row: tuple) -> NodeRow:
    """A row of `nodes_table` as the table shows it."""
    (node_id, state, total, free, classes, memory_mb, used, cpus, load1, *sensors, held) = row[
        :_FACILITY
    ]
    cpu_temp, cpu_power, inlet = sensors
    return NodeRow(
        id=node_id,
        state=state,
        gpu_total=total,
        gpu_free=free or 0,
        gpu_class=", ".join(_classes(classes)),
        memory_gb=memory_mb / 1024 if memory_mb else None,
        memory_used_gb=used / 1024**3 if used is not None else None,
        cpu_count=cpus or None,
        load1=load1,
        cpu_temp_c=cpu_temp,
        cpu_power_w=cpu_power,
        inlet_temp_c=inlet,
        replicas=held,
    )


def nodes_down() -> list[tuple[str, str]]:
    """(id, state) of every node the control plane cannot reach, by id: one query."""
    return list(Node.objects.exclude(state=Node.READY).values_list("id", "state"))


_STATE_FIELDS = (
    "model",
    "desired",
    "failures",
    "backoff_until",
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


def _cause(state: ModelStateView | None, now: datetime) -> dict | None:
    """Why a model backing off or parked failed last, as the attention strip says it:
    `failures`, the engine's last words (`said`), where (`replica`, `node`, `exit_code`)
    and its next try (`next_try`, None when it is due or the model parked); None for a model
    whose failures do not count now."""
    shown = failure_shown(state)
    if state is None or shown is None:
        return None
    assert state.last_failure is not None
    return shown | {
        "failures": state.failures,
        "said": state.last_failure.summary,
        "next_try": state.backoff_until
        if state.backoff_until and state.backoff_until > now and not state.parked_since
        else None,
    }


class ModelRow(TypedDict):
    """One model as the cluster page's table shows it (a plain dict, as NodeRow)."""

    name: str
    aliases: tuple[str, ...]
    description: str
    status: str
    reason: str
    ready: int
    # Serving still, but on their way out (a restart, a drain): not among the ready.
    retiring: int
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
        counts[r.model][counted_as(r)] += 1
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
                retiring=c["retiring"],
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
                failing=_cause(state, now),
            )
        )
    return out


_UNITS = {"gpus": "GPUs", "cpu_cores": "cores", "memory_gb": "GB of memory"}


def quotas_at_limit(
    catalog: Mapping[str, ModelSpec], replicas: Iterable[ReplicaView]
) -> list[dict]:
    """Each governed resource a scope holds at or over its limit: scope name, resource,
    holds and limit (the quotas page's figures). The policy is the one the reconciler keeps
    (`readings.POLICY`): one query, its revision, while no quota or scope changed."""
    policy = POLICY.get()
    if not any(q.limit.any() for q in policy.quotas.values()):
        return []
    out = []
    for q in quota_views(holdings=holdings(replicas, catalog), policy=policy):
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


def node_engine_readings(node_id: str) -> dict[str, Reading]:
    """What the engines of a node's shards last said, by shard (its agent's `engine_load`);
    a shard whose engine said nothing has no entry."""
    said = Node.objects.filter(pk=node_id).values_list("load__engines", flat=True).first()
    if not isinstance(said, dict):
        return {}
    readings = {s: replica_reading([figures]) for s, figures in said.items()}
    return {s: r for s, r in readings.items() if r is not None}


def node_replicas(node_id: str) -> list[dict]:
    """The replicas holding room on a node, by model: id, model, state, its shard here, the
    GPUs and the cores and memory it reserves here."""
    rows = (
        Shard.objects.filter(node_id=node_id, replica__state__in=HOLDING)
        .order_by("replica__model", "replica_id")
        .values_list(
            "replica_id",
            "replica__model",
            "replica__state",
            "gpu_indices",
            "id",
            "cpu_cores",
            "memory_gb",
        )
    )
    return [
        {
            "id": rid,
            "model": model,
            "state": state,
            "gpus": list(indices or ()),
            "shard": shard,
            "cpu_cores": cores,
            "memory_gb": memory_gb,
        }
        for rid, model, state, indices, shard, cores, memory_gb in rows
    ]
