"""Facility reads (docs/facility.md): the power budgets, the GPUs' power under them for the
reconciler's snapshot, each rack's and PDU's nodes, GPUs and draw against its budget
for the cluster page, `GET /facility` and `llmgw ctl facility list`, and what a model's
ready replicas draw now for `llmgw ctl bench` (`GET /models/{name}/power`)."""

from __future__ import annotations

import json
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime

from django.conf import settings
from django.db.models import (
    CharField,
    DateTimeField,
    FloatField,
    IntegerField,
    JSONField,
    Value,
)
from django.db.models.fields.json import KeyTransform

from catalog.domain import ModelSpec
from catalog.selectors import catalog_load, model_called
from llmgw.core.errors import NotFound

from ..domain.drawn import GpuReading, NodeDraw, shard_draw
from ..domain.power import (
    BUDGET_LABELS,
    DERATING,
    EPSILON,
    KINDS,
    Budget,
    Figures,
    GpuPower,
    Held,
    Power,
    bases,
    domain_said,
    domains_of,
    draws,
    kilowatts,
    measured,
    watts,
)
from ..domain.types import HOLDING, NodeView, ReplicaView
from ..facility.observe import metered_now
from ..models import JsonNumber, Node, PowerBudget, Shard

_CHUNK = 500


_BUDGET_FIELDS = ("kind", "name", "watts", "margin", "feeds", "derating", "other_watts")


def _budget(kind, name, watts, margin, feeds, derating, other_watts) -> Budget:
    if isinstance(feeds, str):  # a JSON column through a union, on some databases
        feeds = json.loads(feeds)
    ratings = tuple(float(f) for f in feeds) if isinstance(feeds, list) else ()
    return Budget(
        kind, name, watts, margin or 0.0, ratings, derating or DERATING, other_watts or 0.0
    )


def budgets_load() -> tuple[Budget, ...]:
    """Every power budget, by kind and name: one query."""
    return tuple(_budget(*row) for row in PowerBudget.objects.values_list(*_BUDGET_FIELDS))


def figures_load() -> Figures:
    """The settings' figures for CPU cores and each node's own share (None: not counted)."""
    power = settings.LLMGW.power
    return Figures(per_core_w=power.core_watts, node_w=power.node_watts)


def declared_load(models: Mapping[str, ModelSpec]) -> dict[tuple[str, str], float]:
    """Each profile's declared `power_watts`, by (model, profile)."""
    return {
        (m.name, p.name): p.power_watts
        for m in models.values()
        for p in m.profiles
        if p.power_watts
    }


def _reading(value) -> float | None:
    """A positive finite number, else None: absent, never zero (docs/sensors.md)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value) if 0 < value < 1e7 else None


def gpus_power(reported) -> dict[int, GpuPower]:
    """A heartbeat's `load.gpus` as each GPU's power limit and draw, by index."""
    out: dict[int, GpuPower] = {}
    for g in reported if isinstance(reported, list) else ():
        if not isinstance(g, dict) or not isinstance(g.get("index"), int):
            continue
        power = GpuPower(_reading(g.get("power_limit_w")), _reading(g.get("power_w")))
        if power.limit_w is not None or power.draw_w is not None:
            out[g["index"]] = power
    return out


def power_load(
    nodes: Mapping[str, NodeView], models: Mapping[str, ModelSpec] | None = None
) -> Power:
    """The budgets and, for the nodes in a budgeted rack or PDU, their GPUs' power as their
    agents last reported it, with the profiles' declared draws and the settings' figures:
    one query, and one more when there is a budget a node is under. No budget: Power(),
    and placement is what it is without one."""
    budgets = budgets_load()
    if not budgets:
        return Power()
    extra = {
        "declared": declared_load(models or {}),
        "figures": figures_load(),
        "metered": metered_now(time.time()),
    }
    budgeted = {(b.kind, b.name) for b in budgets}
    under = {n for n, v in nodes.items() if budgeted & set(domains_of(v.labels))}
    if not under:
        return Power(budgets, **extra)
    rows = Node.objects.annotate(gpu_load=KeyTransform("gpus", "load")).order_by()
    # A few nodes are named in the query; many are read all at once, one query however many.
    if len(under) <= _CHUNK:
        rows = rows.filter(pk__in=sorted(under))
    gpus: dict[str, dict[int, GpuPower]] = {}
    for node_id, reported in rows.values_list("id", "gpu_load"):
        if node_id in under and (found := gpus_power(reported)):
            gpus[node_id] = found
    return Power(budgets, gpus, **extra)


@dataclass(frozen=True)
class Domain:
    """A rack, PDU or PDU phase (or a budgeted row, room or site) as people see it: its
    nodes and GPUs, what they draw, its budget."""

    kind: str
    name: str
    nodes: int = 0
    gpus: int = 0
    estimated_w: float = 0.0
    measured_w: float | None = None
    unknown_gpus: int = 0
    budget_w: float | None = None
    # Of all its GPUs, held or not, those whose agents report neither power nor its limit.
    silent_gpus: int = 0
    # What placement loads it to (the budget less its margin), and what it holds before
    # any replica: its nodes' own share and its other equipment (power.bases).
    limit_w: float | None = None
    base_w: float = 0.0

    @property
    def title(self) -> str:
        """How a page names it: "rack r12-07", "PDU r12-a", "PDU r12-a phase L2"."""
        said = domain_said((self.kind, self.name))
        return f"PDU{said[3:]}" if said.startswith("pdu ") else said

    @property
    def reserved_w(self) -> float:
        """What placement counts as held there: the GPUs' estimate and the base."""
        return self.estimated_w + self.base_w

    @property
    def over(self) -> bool:
        """Past its limit, by what is reserved or what is measured: it takes nothing new."""
        if self.limit_w is None:
            return False
        return max(self.reserved_w, self.measured_w or 0.0) > self.limit_w + EPSILON

    @property
    def known(self) -> bool:
        """Whether what it draws is known: not when every GPU held there reports no power
        (then its 0 W is no reading)."""
        return bool(self.estimated_w) or not self.unknown_gpus

    @property
    def said(self) -> str:
        """ "9.6 of 16 kW" against a budget, "9.6 kW" without one; "unknown" for the draw
        of GPUs none of which reports its power."""
        drawn = f"{kilowatts(self.reserved_w)}" if self.known else "unknown"
        if self.budget_w is None:
            return f"{drawn} kW" if self.known else drawn
        return f"{drawn} of {kilowatts(self.budget_w)} kW"

    @property
    def measured_said(self) -> str:
        """ "1,300 W measured", or "" where nothing there reports its draw (no GPU held
        there, no node its own)."""
        return f"{watts(self.measured_w)} W measured" if self.measured_w is not None else ""

    def as_dict(self) -> dict:
        return {
            "kind": self.kind,
            "name": self.name,
            "nodes": self.nodes,
            "gpus": self.gpus,
            "estimated_w": round(self.estimated_w, 1) if self.known else None,
            "reserved_w": round(self.reserved_w, 1) if self.known else None,
            "limit_w": round(self.limit_w, 1) if self.limit_w is not None else None,
            "measured_w": round(self.measured_w, 1) if self.measured_w is not None else None,
            "unknown_gpus": self.unknown_gpus,
            "budget_w": self.budget_w,
            "over": self.over,
            "said": self.said,
        }


def _located_and_budgets(now: datetime) -> tuple[list[tuple], list[Budget], set[str]]:
    """The nodes with a rack or PDU label (id, labels, load.gpus, GPU count, its CPU
    packages' reported draw, its whole draw from its BMC), the budgets, and the nodes away
    (`_away`), in one query: the cluster page adds no more than that. A budget's feeds ride
    in the labels' column. A node away has no readings: its last ones are not its draw now."""
    none = Value(None, output_field=FloatField())
    nodes = (
        Node.objects.filter(labels__has_any_keys=list(BUDGET_LABELS))
        .annotate(
            tag=Value("node"),
            gpu_load=KeyTransform("gpus", "load"),
            budget=none,
            no_margin=none,
            no_derating=none,
            no_other=none,
            node_w=JsonNumber("load", "node_power_w"),
        )
        .values_list(
            "state",
            "last_seen",
            "tag",
            "id",
            "labels",
            "gpu_load",
            "gpu_total",
            "budget",
            "no_margin",
            "no_derating",
            "no_other",
            "cpu_power_w",
            "node_w",
        )
        .order_by()
    )
    budgets = (
        PowerBudget.objects.annotate(
            no_state=Value(None, output_field=CharField()),
            no_seen=Value(None, output_field=DateTimeField()),
            no_load=Value(None, output_field=JSONField()),
            no_gpus=Value(None, output_field=IntegerField()),
            no_cpu=Value(None, output_field=FloatField()),
            no_node=Value(None, output_field=FloatField()),
        )
        .values_list(
            "no_state",
            "no_seen",
            "kind",
            "name",
            "feeds",
            "no_load",
            "no_gpus",
            "watts",
            "margin",
            "derating",
            "other_watts",
            "no_cpu",
            "no_node",
        )
        .order_by()
    )
    located, budgeted, away = [], [], set()
    rows = nodes.union(budgets, all=True)
    for state, seen, tag, key, labels, *rest in rows:
        gpu_load, gpu_total, cap, margin, derating, other, *own = rest
        if tag != "node":
            budgeted.append(_budget(tag, key, cap, margin, labels, derating, other))
            continue
        ls = labels if isinstance(labels, dict) else {}
        if _away(state, seen, now):
            away.add(key)
            own = [None, None]
        located.append((key, ls, gpu_load, gpu_total, *map(_reading, own)))
    return located, budgeted, away


def _away(state: str, seen: datetime | None, now: datetime) -> bool:
    """Whether a node's last readings are not what it draws now: it is not ready
    (unreachable, lost), or not heard from within LLMGW_UNREACHABLE_SECONDS (the rule of
    `GET /models/{name}/power`, drawn.NodeDraw.fresh)."""
    age_s = (now - seen).total_seconds() if seen else None
    return state != Node.READY or not NodeDraw(age_s=age_s).fresh(
        settings.LLMGW.timings.unreachable
    )


def held_gpus(replicas: Iterable[ReplicaView]) -> list[tuple[str, tuple[int, ...]]]:
    """(node, GPU indices) of every shard of a replica holding room."""
    return [(s.node_id, s.gpu_indices) for r in replicas if r.state in HOLDING for s in r.shards]


def held_shards(
    replicas: Iterable[ReplicaView], models: Mapping[str, ModelSpec] | None = None
) -> list[Held]:
    """Every shard of a replica holding room, as what it draws is counted: its GPUs, its
    cores and its share of its profile's declared draw (the catalog's, unless given)."""
    declared = declared_load(catalog_load() if models is None else models)
    out = []
    for r in replicas:
        if r.state not in HOLDING or not r.shards:
            continue
        figure = declared.get((r.model, r.profile))
        share = figure / len(r.shards) if figure else None
        out.extend(Held(s.node_id, s.gpu_indices, s.cpu_cores, share) for s in r.shards)
    return out


def held_of_rows(rows: Iterable[tuple], models: Mapping[str, ModelSpec]) -> list[Held]:
    """`held_shards` from shard rows (node, GPU indices, cores, model, profile, replica),
    as /metrics reads them."""
    rows = list(rows)
    declared = declared_load(models)
    shards_of: dict[str, int] = {}
    for *_, replica_id in rows:
        shards_of[replica_id] = shards_of.get(replica_id, 0) + 1
    out = []
    for node_id, indices, cores, model, profile, replica_id in rows:
        figure = declared.get((model, profile))
        share = figure / shards_of[replica_id] if figure else None
        out.append(Held(node_id, tuple(indices or ()), cores, share))
    return out


def facility_domains(held: Iterable[tuple], *, now: datetime) -> list[Domain]:
    """Every rack, PDU and PDU phase the nodes' labels name or a budget names, with its
    nodes, GPUs and what the replicas held there draw as placement counts it (power.draws),
    racks first, then each PDU followed by its phases, by name. `held` is a power.Held per shard holding room (`held_shards`; a (node, GPU
    indices) pair counts its GPUs alone). Empty when no node says where it is and there is no
    budget. A node not ready or not heard from lately (`_away`) adds nothing to what is
    measured. One query."""
    located, budgeted, away = _located_and_budgets(now)
    if not located and not budgeted:
        return []
    labels = {node_id: ls for node_id, ls, *_ in located}
    power = {node_id: gpus_power(g) for node_id, _, g, *_ in located}
    own = {node_id: w for node_id, *_, w, _ in located if w is not None}
    whole = {node_id: w for node_id, *_, w in located if w is not None}
    figures = figures_load()
    drawn = draws(labels, [h for h in held if h[0] in labels], power, figures, own, whole, away)
    nodes: dict[tuple[str, str], int] = {}
    gpus: dict[tuple[str, str], int] = {}
    silent: dict[tuple[str, str], int] = {}
    for node_id, ls, _, gpu_total, *_ in located:
        for d in domains_of(ls):
            nodes[d] = nodes.get(d, 0) + 1
            gpus[d] = gpus.get(d, 0) + (gpu_total or 0)
            silent[d] = silent.get(d, 0) + max((gpu_total or 0) - len(power[node_id]), 0)
    budgets = {(b.kind, b.name): b for b in budgeted}
    node_domains = [tuple(d for d in domains_of(ls) if d in budgets) for _, ls, *_ in located]
    base = bases(budgets.values(), node_domains, figures)
    metered = metered_now(time.time())
    out = []
    # Every rack, PDU and phase; a row, room or site only when it has a budget.
    shown = {k for k in drawn if k[0] in ("rack", "pdu", "phase")} | budgets.keys()
    for key in sorted(shown, key=_listed_order):
        d = drawn.get(key)
        out.append(
            Domain(
                kind=key[0],
                name=key[1],
                nodes=nodes.get(key, 0),
                gpus=gpus.get(key, 0),
                estimated_w=d.estimated_w if d else 0.0,
                measured_w=measured(d.measured_w if d else None, metered.get(key)),
                unknown_gpus=d.unknown_gpus if d else 0,
                budget_w=budgets[key].cap_w if key in budgets else None,
                silent_gpus=silent.get(key, 0),
                limit_w=budgets[key].limit_w if key in budgets else None,
                base_w=base.get(key, 0.0),
            )
        )
    return out


def _listed_order(domain: tuple[str, str]) -> tuple:
    """Racks, then PDUs each followed by its phases ("r12-a", "r12-a/L1", ...), then rows,
    rooms and sites, each by name."""
    kind, name = domain
    if kind == "phase":
        pdu, _, phase = name.rpartition("/")
        return (KINDS.index("pdu"), pdu, phase)
    return (KINDS.index(kind), name, "")


def _gpu_readings(reported) -> dict[int, GpuReading]:
    """A heartbeat's `load.gpus` as each GPU's draw, power limit and default limit, by index."""
    return {
        g["index"]: GpuReading(
            _reading(g.get("power_w")),
            _reading(g.get("power_limit_w")),
            _reading(g.get("power_default_w")),
        )
        for g in (reported if isinstance(reported, list) else ())
        if isinstance(g, dict) and isinstance(g.get("index"), int)
    }


def model_power(*, name: str, now: datetime) -> dict:
    """What each ready replica of a model draws now, shard by shard, with the power limit each
    of its GPUs is held to and its default, as its nodes' agents last reported them
    (`drawn.shard_draw`): two queries. 404 for a model by no such name."""
    model = model_called(name)
    if model is None:
        raise NotFound(f"There is no model {name!r}.")
    shards = list(
        Shard.objects.filter(replica__model=model, replica__state="ready")
        .order_by("replica__created_at", "replica_id", "rank")
        .values_list("replica_id", "replica__profile", "node_id", "gpu_indices")
    )
    nodes = {
        node_id: NodeDraw(
            _gpu_readings(reported),
            _reading(cpu_w),
            (now - seen).total_seconds() if seen else None,
        )
        for node_id, reported, cpu_w, seen in Node.objects.filter(pk__in={s[2] for s in shards})
        .annotate(gpu_load=KeyTransform("gpus", "load"))
        .values_list("id", "gpu_load", "cpu_power_w", "last_seen")
    }
    stale_after = settings.LLMGW.timings.unreachable
    replicas: dict[str, dict] = {}
    for replica_id, profile, node_id, indices in shards:
        r = replicas.setdefault(replica_id, {"id": replica_id, "profile": profile, "shards": []})
        r["shards"].append(shard_draw(node_id, indices or (), nodes.get(node_id), stale_after))
    return {"model": model, "replicas": list(replicas.values())}
