"""Power budgets per rack and PDU (docs/facility.md): what placement counts against them.

Pure. A budget is an operator's cap in watts for a rack or a PDU, named by the
nodes' `llmgw.io/rack` and `llmgw.io/pdu` labels. A GPU held by a replica counts
the larger of its enforced power limit and its measured draw, as its agent last
reported them; a new replica needs the sum of the limits of the GPUs placement
would give it. Missing data is safe: a GPU whose limit is unknown gives a need
that cannot be estimated, and such a replica is placed as if there were no
budget (the placement says so). Only GPUs are counted: a CPU-only replica's draw
is not estimated.

`Ledger` is the watts held per budgeted domain as one pass places replicas; the
inventory (placement/inventory.py) takes and gives back watts with the GPUs, so a trial
with victims removed frees their watts too, and preemption can make room under
a budget as it does for GPUs.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

ZONE_LABEL = "llmgw.io/zone"
RACK_LABEL = "llmgw.io/rack"
PDU_LABEL = "llmgw.io/pdu"
KINDS = ("rack", "pdu")
# A rack's or PDU's name, as a Kubernetes label value is written: what a budget and the
# agent's --rack, --pdu and --zone accept, so that the two always name the same thing.
NAME_RE = re.compile(r"[A-Za-z0-9]([A-Za-z0-9._-]{0,61}[A-Za-z0-9])?\Z")
MOST_WATTS = 10_000_000


def name_refusal(what: str, name: object) -> str | None:
    """Why `name` cannot name a rack, PDU or zone (`what`), in a sentence; None if it can."""
    if not isinstance(name, str) or not name:
        return f"a {what} needs a name."
    if len(name) > 63:
        return f"a {what}'s name is at most 63 characters, not {len(name)}."
    if not NAME_RE.match(name):
        return (
            f"{name!r} is not a {what}'s name: letters, digits, '.', '_' and '-', "
            "beginning and ending with a letter or digit."
        )
    return None


@dataclass(frozen=True)
class Budget:
    """The most a rack or PDU may draw, in watts, as an operator set it."""

    kind: str
    name: str
    watts: float


@dataclass(frozen=True)
class GpuPower:
    """One GPU's power as its agent last reported it; None where it did not say."""

    limit_w: float | None = None
    draw_w: float | None = None

    @property
    def held_w(self) -> float:
        """What it counts for while a replica holds it: the larger figure known, else 0."""
        return max(self.limit_w or 0.0, self.draw_w or 0.0)


@dataclass(frozen=True)
class Power:
    """The budgets and the GPUs' power a pass decides on. `gpus` is keyed by node, then
    GPU index, and need hold only the nodes in a budgeted domain."""

    budgets: tuple[Budget, ...] = ()
    gpus: Mapping[str, Mapping[int, GpuPower]] = field(default_factory=dict)


def pdus_of(labels: Mapping[str, str]) -> tuple[str, ...]:
    """The PDUs a node draws from: its `llmgw.io/pdu` label, several comma-separated for a
    dual-fed rack (each must carry the node alone, so it counts against every one)."""
    raw = labels.get(PDU_LABEL) or ""
    return tuple(dict.fromkeys(p.strip() for p in raw.split(",") if p.strip()))


def domains_of(labels: Mapping[str, str]) -> tuple[tuple[str, str], ...]:
    """The (kind, name) of every rack and PDU a node's labels put it in."""
    rack = (labels.get(RACK_LABEL) or "").strip()
    out = [("rack", rack)] if rack else []
    out.extend(("pdu", p) for p in pdus_of(labels))
    return tuple(out)


def watts(value: float) -> str:
    """14200.0 → "14,200"."""
    return f"{value:,.0f}"


def kilowatts(value: float) -> str:
    """9600.0 → "9.6"; whole kilowatts without a decimal."""
    kw = value / 1000
    return f"{kw:,.0f}" if abs(kw - round(kw)) < 0.05 else f"{kw:,.1f}"


class Ledger:
    """Watts held per budgeted domain, taken and given back with the GPUs that draw them."""

    def __init__(
        self,
        budgets: Mapping[tuple[str, str], float],
        node_domains: Mapping[str, tuple[tuple[str, str], ...]],
        gpus: Mapping[str, Mapping[int, GpuPower]],
        held: Mapping[tuple[str, str], float] | None = None,
    ):
        self.budgets = budgets
        self.node_domains = node_domains
        self.gpus = gpus
        self.held: dict[tuple[str, str], float] = dict(held or dict.fromkeys(budgets, 0.0))

    @classmethod
    def of(cls, power: Power | None, labels: Mapping[str, Mapping[str, str]]) -> Ledger | None:
        """The ledger for these nodes' labels (keyed by node), None when no budget applies
        to any of them: placement is then exactly what it is without budgets."""
        if power is None or not power.budgets:
            return None
        budgets = {(b.kind, b.name): float(b.watts) for b in power.budgets}
        node_domains = {}
        for node_id, node_labels in labels.items():
            mine = tuple(d for d in domains_of(node_labels) if d in budgets)
            if mine:
                node_domains[node_id] = mine
        if not node_domains:
            return None
        return cls(budgets, node_domains, power.gpus)

    def copy(self) -> Ledger:
        return Ledger(self.budgets, self.node_domains, self.gpus, self.held)

    def _gpu(self, node_id: str, index: int) -> GpuPower:
        return self.gpus.get(node_id, {}).get(index) or GpuPower()

    def take(self, node_id: str, indices: Iterable[int], sign: int = 1) -> None:
        """Count (sign -1: stop counting) what these GPUs of a node draw while held."""
        domains = self.node_domains.get(node_id)
        if not domains:
            return
        drawn = sum(self._gpu(node_id, i).held_w for i in indices)
        if not drawn:
            return
        for d in domains:
            self.held[d] += sign * drawn

    def need(self, node_id: str, indices: Iterable[int]) -> float | None:
        """What a replica given these GPUs is estimated to draw: what each counts once held
        (its limit, or its draw where that is higher) summed; None when any limit is
        unknown (nothing can be estimated)."""
        gpus = [self._gpu(node_id, i) for i in indices]
        if not all(g.limit_w for g in gpus):
            return None
        return sum(g.held_w for g in gpus)

    def refusal(self, node_id: str, indices: tuple[int, ...]) -> str | None:
        """Why these GPUs of this node would take a budget past its cap, in a sentence with
        the figures; None when they would not, or when their draw is unknown."""
        domains = self.node_domains.get(node_id)
        if not domains or not indices:
            return None
        need = self.need(node_id, indices)
        if need is None:
            return None
        for kind, name in domains:
            cap, held = self.budgets[(kind, name)], self.held[(kind, name)]
            if held + need > cap + 1e-6:
                return (
                    f"node {node_id} is in {kind} {name}: {watts(max(held, 0))} of "
                    f"{watts(cap)} W held, this replica needs ~{watts(need)} W"
                )
        return None

    def refusal_together(self, shards: Iterable[tuple[str, tuple[int, ...]]]) -> str | None:
        """Why shards on several nodes (node, GPU indices) would together pass a budget."""
        ledger = self.copy()
        for node_id, indices in shards:
            if why := ledger.refusal(node_id, indices):
                return why
            ledger.take(node_id, indices)
        return None

    def unknown(self, node_id: str, indices: tuple[int, ...]) -> str:
        """A sentence when these GPUs are under a budget but their draw cannot be
        estimated (so they are not counted against it); "" otherwise."""
        domains = self.node_domains.get(node_id)
        if not domains or not indices or self.need(node_id, indices) is not None:
            return ""
        where = ", ".join(f"{k} {n}" for k, n in domains)
        return (
            f"its draw is unknown (node {node_id} does not report its GPUs' power limits), "
            f"so it is not counted against {where}"
        )


@dataclass(frozen=True)
class Draw:
    """What a rack or PDU draws as placement counts it: the estimate (per held GPU the
    larger of its limit and its measured draw), the measured part alone, and how many
    held GPUs said nothing at all."""

    estimated_w: float = 0.0
    measured_w: float | None = None
    unknown_gpus: int = 0


def draws(
    labels: Mapping[str, Mapping[str, str]],
    held: Iterable[tuple[str, Iterable[int]]],
    gpus: Mapping[str, Mapping[int, GpuPower]],
) -> dict[tuple[str, str], Draw]:
    """Per rack and PDU the nodes' labels name, what the GPUs held there draw. `held` is
    (node, GPU indices) per shard holding room; `labels` is keyed by node."""
    est: dict[tuple[str, str], float] = {}
    measured: dict[tuple[str, str], float] = {}
    unknown: dict[tuple[str, str], int] = {}
    domains = {n: domains_of(ls) for n, ls in labels.items()}
    for domain in {d for ds in domains.values() for d in ds}:
        est[domain], unknown[domain] = 0.0, 0
    for node_id, indices in held:
        for i in indices:
            gpu = gpus.get(node_id, {}).get(i) or GpuPower()
            for d in domains.get(node_id, ()):
                est[d] += gpu.held_w
                if gpu.draw_w:
                    measured[d] = measured.get(d, 0.0) + gpu.draw_w
                if not gpu.held_w:
                    unknown[d] += 1
    return {d: Draw(est[d], measured.get(d), unknown[d]) for d in est}
