"""Facility reads (docs/facility.md): the power budgets, the GPUs' power under them for the
reconciler's snapshot, and each rack's and PDU's nodes, GPUs and draw against its budget
for the cluster page, `GET /facility` and `llmgw ctl facility list`."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from django.db.models import FloatField, IntegerField, JSONField, Q, Value
from django.db.models.fields.json import KeyTransform

from ..domain.power import (
    PDU_LABEL,
    RACK_LABEL,
    Budget,
    GpuPower,
    Power,
    domains_of,
    draws,
    kilowatts,
    watts,
)
from ..domain.types import HOLDING, NodeView, ReplicaView
from ..models import Node, PowerBudget

_CHUNK = 500


def budgets_load() -> tuple[Budget, ...]:
    """Every power budget, by kind and name: one query."""
    return tuple(
        Budget(kind, name, watts)
        for kind, name, watts in PowerBudget.objects.values_list("kind", "name", "watts")
    )


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


def power_load(nodes: Mapping[str, NodeView]) -> Power:
    """The budgets and, for the nodes in a budgeted rack or PDU, their GPUs' power as their
    agents last reported it: one query, and one more when there is a budget a node is
    under. No budget: Power(), and placement is what it is without one."""
    budgets = budgets_load()
    if not budgets:
        return Power()
    budgeted = {(b.kind, b.name) for b in budgets}
    under = {n for n, v in nodes.items() if budgeted & set(domains_of(v.labels))}
    if not under:
        return Power(budgets)
    rows = Node.objects.annotate(gpu_load=KeyTransform("gpus", "load")).order_by()
    # A few nodes are named in the query; many are read all at once, one query however many.
    if len(under) <= _CHUNK:
        rows = rows.filter(pk__in=sorted(under))
    gpus: dict[str, dict[int, GpuPower]] = {}
    for node_id, reported in rows.values_list("id", "gpu_load"):
        if node_id in under and (found := gpus_power(reported)):
            gpus[node_id] = found
    return Power(budgets, gpus)


@dataclass(frozen=True)
class Domain:
    """A rack or PDU as people see it: its nodes and GPUs, what they draw, its budget."""

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

    @property
    def over(self) -> bool:
        return self.budget_w is not None and self.estimated_w > self.budget_w

    @property
    def known(self) -> bool:
        """Whether what it draws is known: not when every GPU held there reports no power
        (then its 0 W is no reading)."""
        return bool(self.estimated_w) or not self.unknown_gpus

    @property
    def said(self) -> str:
        """ "9.6 of 16 kW" against a budget, "9.6 kW" without one; "unknown" for the draw
        of GPUs none of which reports its power."""
        drawn = f"{kilowatts(self.estimated_w)}" if self.known else "unknown"
        if self.budget_w is None:
            return f"{drawn} kW" if self.known else drawn
        return f"{drawn} of {kilowatts(self.budget_w)} kW"

    @property
    def measured_said(self) -> str:
        """ "1,300 W measured", or "" where no GPU held there reports its draw."""
        return f"{watts(self.measured_w)} W measured" if self.measured_w is not None else ""

    def as_dict(self) -> dict:
        return {
            "kind": self.kind,
            "name": self.name,
            "nodes": self.nodes,
            "gpus": self.gpus,
            "estimated_w": round(self.estimated_w, 1) if self.known else None,
            "measured_w": round(self.measured_w, 1) if self.measured_w is not None else None,
            "unknown_gpus": self.unknown_gpus,
            "budget_w": self.budget_w,
            "over": self.over,
            "said": self.said,
        }


def _located_and_budgets() -> tuple[list[tuple], list[tuple]]:
    """The nodes with a rack or PDU label (id, labels, load.gpus, GPU count) and the
    budgets (kind, name, watts), in one query: the cluster page adds no more than that."""
    nodes = (
        Node.objects.filter(Q(labels__has_key=RACK_LABEL) | Q(labels__has_key=PDU_LABEL))
        .annotate(
            tag=Value("node"),
            gpu_load=KeyTransform("gpus", "load"),
            budget=Value(None, output_field=FloatField()),
        )
        .values_list("tag", "id", "labels", "gpu_load", "gpu_total", "budget")
        .order_by()
    )
    budgets = (
        PowerBudget.objects.annotate(
            no_labels=Value(None, output_field=JSONField()),
            no_load=Value(None, output_field=JSONField()),
            no_gpus=Value(None, output_field=IntegerField()),
        )
        .values_list("kind", "name", "no_labels", "no_load", "no_gpus", "watts")
        .order_by()
    )
    located, budgeted = [], []
    for tag, key, labels, gpu_load, gpu_total, cap in nodes.union(budgets, all=True):
        if tag == "node":
            located.append((key, labels if isinstance(labels, dict) else {}, gpu_load, gpu_total))
        else:
            budgeted.append((tag, key, cap))
    return located, budgeted


def held_gpus(replicas: Iterable[ReplicaView]) -> list[tuple[str, tuple[int, ...]]]:
    """(node, GPU indices) of every shard of a replica holding room."""
    return [(s.node_id, s.gpu_indices) for r in replicas if r.state in HOLDING for s in r.shards]


def facility_domains(held: Iterable[tuple[str, Iterable[int]]]) -> list[Domain]:
    """Every rack and PDU the nodes' labels name or a budget names, with its nodes, GPUs and
    what the GPUs held by replicas there draw (per GPU the larger of its power limit and
    its measured draw), racks first, by name. `held` is (node, GPU indices) per shard
    holding room (`held_gpus`). Empty when no node says where it is and there is no
    budget. One query."""
    located, budgeted = _located_and_budgets()
    if not located and not budgeted:
        return []
    labels = {node_id: ls for node_id, ls, _, _ in located}
    power = {node_id: gpus_power(g) for node_id, _, g, _ in located}
    drawn = draws(labels, [(n, i) for n, i in held if n in labels], power)
    nodes: dict[tuple[str, str], int] = {}
    gpus: dict[tuple[str, str], int] = {}
    silent: dict[tuple[str, str], int] = {}
    for node_id, ls, _, gpu_total in located:
        for d in domains_of(ls):
            nodes[d] = nodes.get(d, 0) + 1
            gpus[d] = gpus.get(d, 0) + (gpu_total or 0)
            silent[d] = silent.get(d, 0) + max((gpu_total or 0) - len(power[node_id]), 0)
    budgets = {(kind, name): watts for kind, name, watts in budgeted}
    out = []
    for key in sorted(drawn.keys() | budgets.keys(), key=lambda k: (k[0] != "rack", k[1])):
        d = drawn.get(key)
        out.append(
            Domain(
                kind=key[0],
                name=key[1],
                nodes=nodes.get(key, 0),
                gpus=gpus.get(key, 0),
                estimated_w=d.estimated_w if d else 0.0,
                measured_w=d.measured_w if d else None,
                unknown_gpus=d.unknown_gpus if d else 0,
                budget_w=budgets.get(key),
                silent_gpus=silent.get(key, 0),
            )
        )
    return out
