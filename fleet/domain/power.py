"""Power budgets per rack, PDU, PDU phase, row, room and site (docs/facility.md): what
placement counts against them.

Pure. A budget is an operator's cap in watts for a rack, a PDU, a phase of a PDU, a row,
a room or a site, named by the nodes' `llmgw.io/rack`, `llmgw.io/pdu`,
`llmgw.io/pdu-phase`, `llmgw.io/row`, `llmgw.io/room` and `llmgw.io/site` labels (a
phase as `<pdu>/<phase>`: "r12-a/L2"), or for a dual-fed domain the
smaller feed's rating times its derating (80 % unless said); placement loads it
to the cap less its safety margin (`Budget.limit_w`). What a domain holds starts
from its base: a per-node share for the CPUs, memory and fans of every node in it
(a setting) and a declared figure for what else stands there (switches,
storage). A replica then counts, per shard, its profile's declared `power_watts`
where it has one, else the sum of its GPUs' enforced power limits, else for a
CPU replica its reserved cores times a per-core figure (a setting); and never
less than what its GPUs are measured to draw. Missing data is safe: a need that
cannot be estimated (a GPU whose limit is unknown, a CPU replica without a
per-core figure) is placed as if there were no budget (the placement says so),
except in a domain already over its limit, which takes nothing new.

`Ledger` is the watts held per budgeted domain as one pass places replicas; the
inventory (placement/inventory.py) takes and gives back watts with the GPUs, so a trial
with victims removed frees their watts too, and preemption can make room under
a budget as it does for GPUs.
"""

from __future__ import annotations

import math
import re
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass, field
from typing import NamedTuple

ZONE_LABEL = "llmgw.io/zone"
RACK_LABEL = "llmgw.io/rack"
PDU_LABEL = "llmgw.io/pdu"
# The phase of each PDU the node draws from, in the order of its `llmgw.io/pdu` list.
PHASE_LABEL = "llmgw.io/pdu-phase"
ROW_LABEL = "llmgw.io/row"
ROOM_LABEL = "llmgw.io/room"
SITE_LABEL = "llmgw.io/site"
# What a budget may be for: a rack, a PDU and each phase of a three-phase PDU (its breakers
# trip per phase), and the rows, rooms and sites of the location tree above them (each
# named by its label).
KINDS = ("rack", "pdu", "phase", "row", "room", "site")
_TREE = (("row", ROW_LABEL), ("room", ROOM_LABEL), ("site", SITE_LABEL))
# The labels naming them: a node with none is under no budget.
BUDGET_LABELS = (RACK_LABEL, PDU_LABEL, ROW_LABEL, ROOM_LABEL, SITE_LABEL)
# A rack's or PDU's name, as a Kubernetes label value is written: what a budget and the
# agent's --rack, --pdu and --zone accept, so that the two always name the same thing.
NAME_RE = re.compile(r"[A-Za-z0-9]([A-Za-z0-9._-]{0,61}[A-Za-z0-9])?\Z")
# A phase's name within its PDU: L1, L2, L3, or a short token where a PDU names them
# otherwise (A, B, C).
PHASE_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]{0,7}\Z")
MOST_WATTS = 10_000_000
# What one feed of a dual-fed domain may be loaded to, of its rating, unless a budget says:
# the usual continuous-load derating of a breaker.
DERATING = 0.8
# Within a watt: float sums of many GPUs' figures must not refuse what is exactly at a limit.
EPSILON = 1e-6


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


def phase_name_refusal(name: object) -> str | None:
    """Why `name` cannot name a PDU's phase as a budget does (`<pdu>/<phase>`: "r12-a/L2"),
    in a sentence; None if it can."""
    if not isinstance(name, str) or "/" not in name:
        return f"a phase is named by its PDU and its phase, as r12-a/L2, not {name!r}."
    pdu, _, phase = name.rpartition("/")
    return name_refusal("PDU", pdu) or phase_token_refusal(phase)


def phase_token_refusal(phase: str) -> str | None:
    """Why `phase` cannot name a phase within its PDU ("L2"), in a sentence; None if it can."""
    if PHASE_RE.match(phase):
        return None
    return (
        f"{phase!r} is not a phase: L1, L2 or L3, or a short token (at most 8 letters, "
        "digits, '_' and '-', beginning with a letter or digit)."
    )


MOST_MARGIN = 0.5
MOST_FEEDS = 4


def _within(value: object, low: float, high: float, *, above: bool = False) -> bool:
    """Whether `value` is a finite number from `low` (above it, with `above`) to `high`."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        return False
    return (value > low if above else value >= low) and value <= high


def budget_refusal(
    watts: object, margin: object, feeds: object, derating: object, other_w: object
) -> str | None:
    """Why these figures cannot make a budget, in a sentence; None when they can. A budget
    gives `watts` or its `feeds`' ratings, not both; a margin is a share from 0 to 0.5, a
    derating above 0 and at most 1, and other equipment from 0 watts."""
    most = f"{MOST_WATTS:,}"
    if watts is None and not feeds:
        return "a budget needs its watts, or its feeds' ratings for a dual-fed domain."
    if watts is not None and feeds:
        return "a budget gives its watts or its feeds' ratings, not both."
    if watts is not None and not _within(watts, 0, MOST_WATTS, above=True):
        return f"watts must be a number above 0 and at most {most}, not {watts!r}."
    if feeds:
        if not isinstance(feeds, list | tuple) or len(feeds) > MOST_FEEDS:
            return f"feeds are a list of one to {MOST_FEEDS} ratings in watts, not {feeds!r}."
        for f in feeds:
            if not _within(f, 0, MOST_WATTS, above=True):
                return f"a feed's rating must be a number above 0 and at most {most}, not {f!r}."
    if not _within(margin, 0, MOST_MARGIN):
        return (
            f"margin must be a share from 0 to {MOST_MARGIN} (0.1 keeps 10 % back), not {margin!r}."
        )
    if not _within(derating, 0, 1, above=True):
        return f"derating must be a share above 0 and at most 1 (0.8 is 80 %), not {derating!r}."
    if not _within(other_w, 0, MOST_WATTS):
        return f"other_watts must be a number from 0 to {most}, not {other_w!r}."
    return None


def feed_cap(feeds: Iterable[float], derating: float = DERATING) -> float:
    """What a domain fed by several feeds may draw: the smaller feed's rating times its
    derating, since the domain must survive the loss of the other (not their sum)."""
    return min(feeds) * derating


@dataclass(frozen=True)
class Budget:
    """The most a rack or PDU may draw, in watts, as an operator set it: `watts`, or for a
    dual-fed domain its `feeds`' ratings (then the cap is `feed_cap`); loaded to the cap
    less `margin` (a share: 0.1 keeps 10 % back). `other_w` is what else stands in it that
    reports nothing here (switches, storage), held from the start."""

    kind: str
    name: str
    watts: float
    margin: float = 0.0
    feeds: tuple[float, ...] = ()
    derating: float = DERATING
    other_w: float = 0.0

    @property
    def cap_w(self) -> float:
        return feed_cap(self.feeds, self.derating) if self.feeds else float(self.watts)

    @property
    def limit_w(self) -> float:
        """What placement loads the domain to: `cap × (1 − margin)`."""
        return self.cap_w * (1 - self.margin)

    @property
    def said(self) -> str:
        """How the limit was found, in words; "" for a plain cap with no margin:
        "the smaller feed's 7,400 W at 80 %, less a 10 % margin"."""
        parts = []
        if self.feeds:
            parts.append(f"the smaller feed's {watts(min(self.feeds))} W at {share(self.derating)}")
        if self.margin:
            what = "" if self.feeds else f"{watts(self.cap_w)} W "
            parts.append(f"{what}less a {share(self.margin)} margin")
        return ", ".join(parts)


def share(value: float) -> str:
    """0.1 → "10 %"."""
    return f"{value * 100:g} %"


@dataclass(frozen=True)
class Figures:
    """What is not reported, as the settings figure it: a CPU core's draw under load
    (LLMGW_POWER_CORE_WATTS), and a node's own share for its CPUs, memory and fans
    (LLMGW_POWER_NODE_WATTS). None: not counted."""

    per_core_w: float | None = None
    node_w: float | None = None


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
    # A profile's declared `power_watts`, per replica, by (model, profile).
    declared: Mapping[tuple[str, str], float] = field(default_factory=dict)
    figures: Figures = Figures()
    # What the facility's meter (a Prometheus `power_watts` signal) reads a domain drawing
    # now, fresh readings only (`metered_fresh`).
    metered: Mapping[tuple[str, str], float] = field(default_factory=dict)


class Metered(NamedTuple):
    """A facility meter's reading of a domain's draw in watts, taken at `at` (seconds);
    past `stale_after` seconds it is absent."""

    domain: tuple[str, str]
    watts: float
    at: float
    stale_after: float


def metered_fresh(readings: Iterable[Metered], now: float) -> dict[tuple[str, str], float]:
    """Per domain, its newest fresh meter reading: a stale one is absent, and zero or less
    is no reading (zero is unknown, never a draw)."""
    newest: dict[tuple[str, str], Metered] = {}
    for m in readings:
        fresh = m.watts > 0 and now - m.at <= m.stale_after
        if fresh and (m.domain not in newest or m.at > newest[m.domain].at):
            newest[m.domain] = m
    return {d: m.watts for d, m in newest.items()}


def measured(agents_w: float | None, meter_w: float | None) -> float | None:
    """What a domain is measured to draw: the facility's meter where it reads one, since it
    sees everything on the circuit (the nodes' own share, switches, storage, losses) where the
    agents see only their GPUs; else the agents' GPUs; None when neither says."""
    return meter_w if meter_w else agents_w


def pdus_of(labels: Mapping[str, str]) -> tuple[str, ...]:
    """The PDUs a node draws from: its `llmgw.io/pdu` label, several comma-separated for a
    dual-fed rack (each must carry the node alone, so it counts against every one)."""
    raw = labels.get(PDU_LABEL) or ""
    return tuple(dict.fromkeys(p.strip() for p in raw.split(",") if p.strip()))


def _listed(raw: str | None) -> list[str]:
    return [p.strip() for p in (raw or "").split(",") if p.strip()]


def phase_refusal(labels: Mapping[str, str]) -> str | None:
    """Why a node's `llmgw.io/pdu-phase` label cannot be read, in a sentence; None when it
    can or the node has none (an empty label is none). It names one phase per PDU of
    `llmgw.io/pdu`, in its order (a dual-fed node on L2 of both: "L2,L2")."""
    if not _listed(labels.get(PHASE_LABEL)):
        return None
    phases, pdus = _listed(labels.get(PHASE_LABEL)), _listed(labels.get(PDU_LABEL))
    if len(phases) != len(pdus):
        given = f"{len(phases)} phase{'' if len(phases) == 1 else 's'}"
        drawn = f"{len(pdus)} PDU{'' if len(pdus) == 1 else 's'}"
        named = f" ({', '.join(pdus)})" if pdus else ""
        return (
            f"{PHASE_LABEL} names {given} for {drawn}{named}: it gives one phase per PDU "
            f"of {PDU_LABEL}, in the same order (L2,L2 for a node on L2 of two)."
        )
    for phase in phases:
        if why := phase_token_refusal(phase):
            return f"{PHASE_LABEL}: {why}"
    return None


def phases_of(labels: Mapping[str, str]) -> tuple[str, ...]:
    """The PDU phases a node draws from, each named `<pdu>/<phase>` ("r12-a/L2"): its
    `llmgw.io/pdu-phase` label aligned with its `llmgw.io/pdu` list. None where the label
    cannot be read (`phase_refusal`): the node is then under its PDUs' budgets alone."""
    if not _listed(labels.get(PHASE_LABEL)) or phase_refusal(labels):
        return ()
    pairs = zip(_listed(labels.get(PDU_LABEL)), _listed(labels.get(PHASE_LABEL)), strict=True)
    return tuple(dict.fromkeys(f"{pdu}/{phase}" for pdu, phase in pairs))


def domains_of(labels: Mapping[str, str]) -> tuple[tuple[str, str], ...]:
    """The (kind, name) of every rack, PDU, PDU phase, row, room and site a node's labels
    put it in (a node without a row label is in no row's budget)."""
    rack = (labels.get(RACK_LABEL) or "").strip()
    out = [("rack", rack)] if rack else []
    out.extend(("pdu", p) for p in pdus_of(labels))
    out.extend(("phase", p) for p in phases_of(labels))
    out.extend((kind, v) for kind, label in _TREE if (v := (labels.get(label) or "").strip()))
    return tuple(out)


def domain_said(domain: tuple[str, str]) -> str:
    """A domain as a sentence names it: "rack r12-07", "pdu r12-a phase L2"."""
    kind, name = domain
    if kind == "phase":
        pdu, _, phase = name.rpartition("/")
        return f"pdu {pdu} phase {phase}"
    return f"{kind} {name}"


def watts(value: float) -> str:
    """14200.0 → "14,200"."""
    return f"{value:,.0f}"


def kilowatts(value: float) -> str:
    """9600.0 → "9.6"; whole kilowatts without a decimal."""
    kw = value / 1000
    return f"{kw:,.0f}" if abs(kw - round(kw)) < 0.05 else f"{kw:,.1f}"


Domain = tuple[str, str]


class Ledger:
    """Watts held per budgeted domain, taken and given back with the shards that draw them."""

    def __init__(
        self,
        budgets: Mapping[Domain, Budget],
        node_domains: Mapping[str, tuple[Domain, ...]],
        gpus: Mapping[str, Mapping[int, GpuPower]],
        held: Mapping[Domain, float],
        figures: Figures = Figures(),
    ):
        self.budgets = budgets
        self.node_domains = node_domains
        self.gpus = gpus
        self.figures = figures
        self.held: dict[Domain, float] = dict(held)
        # What a domain's meter reads above what is counted for it (`meter`), kept as the
        # replicas counted there come and go: a victim freed still frees its estimate.
        self.excess: dict[Domain, float] = {}

    @classmethod
    def of(cls, power: Power | None, labels: Mapping[str, Mapping[str, str]]) -> Ledger | None:
        """The ledger for these nodes' labels (keyed by node), None when no budget applies
        to any of them: placement is then exactly what it is without budgets. Each domain
        starts holding its base (`bases`)."""
        if power is None or not power.budgets:
            return None
        budgets = {(b.kind, b.name): b for b in power.budgets}
        node_domains = {}
        for node_id, node_labels in labels.items():
            mine = tuple(d for d in domains_of(node_labels) if d in budgets)
            if mine:
                node_domains[node_id] = mine
        if not node_domains:
            return None
        held = bases(budgets.values(), node_domains.values(), power.figures)
        return cls(budgets, node_domains, power.gpus, held, power.figures)

    def copy(self) -> Ledger:
        out = Ledger(self.budgets, self.node_domains, self.gpus, self.held, self.figures)
        out.excess = dict(self.excess)
        return out

    def meter(self, metered: Mapping[Domain, float]) -> None:
        """Fold the facility meter's readings in, once the replicas holding room are counted:
        a budgeted domain whose meter reads more than is counted for it holds the meter's
        figure (the larger of reserved and measured), and what is placed or freed after moves
        it from there."""
        self.excess = {
            d: w - self.held[d] for d, w in metered.items() if d in self.held and w > self.held[d]
        }

    def level(self, domain: Domain) -> float:
        """What a domain holds as placement counts it: what is counted, or its meter's
        reading where that is more."""
        return self.held[domain] + self.excess.get(domain, 0.0)

    def _gpu(self, node_id: str, index: int) -> GpuPower:
        return self.gpus.get(node_id, {}).get(index) or GpuPower()

    def held_w(
        self,
        node_id: str,
        indices: Iterable[int],
        cores: int | None = None,
        declared_w: float | None = None,
    ) -> float:
        """What a shard holding room counts (`shard_w`)."""
        gpus = [self._gpu(node_id, i) for i in indices]
        return shard_w(gpus, cores, declared_w, self.figures)

    def take(
        self,
        node_id: str,
        indices: Iterable[int],
        sign: int = 1,
        cores: int | None = None,
        declared_w: float | None = None,
    ) -> None:
        """Count (sign -1: stop counting) what a shard on these GPUs or cores draws."""
        domains = self.node_domains.get(node_id)
        if not domains:
            return
        drawn = self.held_w(node_id, indices, cores, declared_w)
        if not drawn:
            return
        for d in domains:
            self.held[d] += sign * drawn

    def need(
        self,
        node_id: str,
        indices: Iterable[int],
        cores: int | None = None,
        declared_w: float | None = None,
    ) -> float | None:
        """What a new shard is estimated to draw: the profile's declared figure; else for
        GPUs what each counts once held (its limit, or its draw where higher) summed, None
        when any limit is unknown; else its cores times the per-core figure, None without
        both."""
        if declared_w is not None:
            return declared_w
        gpus = [self._gpu(node_id, i) for i in indices]
        if gpus:
            return sum(g.held_w for g in gpus) if all(g.limit_w for g in gpus) else None
        if cores and self.figures.per_core_w:
            return cores * self.figures.per_core_w
        return None

    def over(self, domain: Domain) -> bool:
        """Whether a domain holds more than its limit already (its GPUs drew more than
        their estimate, or the budget was lowered): it takes no new replica at all."""
        return self.level(domain) > self.budgets[domain].limit_w + EPSILON

    def refusal(
        self,
        node_id: str,
        indices: tuple[int, ...],
        cores: int | None = None,
        declared_w: float | None = None,
    ) -> str | None:
        """Why this shard would take a budget past its limit, or lands in a domain already
        over it, in a sentence with the figures; None when it would not, or when its draw
        is unknown (and no domain of the node is over)."""
        domains = self.node_domains.get(node_id)
        if not domains:
            return None
        need = self.need(node_id, indices, cores, declared_w)
        for domain in domains:
            budget, held = self.budgets[domain], self.level(domain)
            limit = budget.limit_w
            said = [budget.said] if budget.said else []
            if self.excess.get(domain):
                said.append("as its meter reads")
            how = f" ({', '.join(said)})" if said else ""
            start = f"node {node_id} is in {domain_said(domain)}: {watts(max(held, 0))} of"
            if self.over(domain):
                return (
                    f"{start} {watts(limit)} W held{how}, over its budget: it takes no new replicas"
                )
            if need is not None and held + need > limit + EPSILON:
                return f"{start} {watts(limit)} W held{how}, this replica needs ~{watts(need)} W"
        return None

    def refusal_together(
        self, shards: Iterable[tuple[str, tuple[int, ...]]], declared_w: float | None = None
    ) -> str | None:
        """Why shards on several nodes (node, GPU indices) would together pass a budget;
        `declared_w` is each shard's declared figure, if its profile has one."""
        ledger = self.copy()
        for node_id, indices in shards:
            if why := ledger.refusal(node_id, indices, declared_w=declared_w):
                return why
            ledger.take(node_id, indices, declared_w=declared_w)
        return None

    def left(self, node_id: str) -> float | None:
        """The watts left in the fullest budgeted domain the node is in; None for a node
        under no budget."""
        return self.left_in(self.node_domains.get(node_id, ()))

    def left_in(self, domains: Iterable[Domain]) -> float | None:
        """The watts left in the fullest of these budgeted domains; None for none."""
        return min((self.budgets[d].limit_w - self.level(d) for d in domains), default=None)

    def roomiest(self, domains: Iterable[Domain]) -> tuple[float, float]:
        """How placement levels load by power (scorers.most_power_left), smaller first: the
        watts left in the fullest of these budgeted domains, then in the fullest of their
        PDU phases, each negated, so the node with most left comes first and, among nodes
        whose rack or PDU binds alike, the one on the phase with most headroom (three-phase
        load levels across phases). A node under no budget, or on no budgeted phase, has no
        limit there to level against: -inf, first. Without phase budgets the second figure
        is the same for every node and orders nothing."""
        domains = tuple(domains)
        left = self.left_in(domains)
        phase = self.left_in(d for d in domains if d[0] == "phase")
        return (
            float("-inf") if left is None else -left,
            float("-inf") if phase is None else -phase,
        )

    def unknown(
        self,
        node_id: str,
        indices: tuple[int, ...],
        cores: int | None = None,
        declared_w: float | None = None,
    ) -> str:
        """A sentence when a shard is under a budget but its draw cannot be estimated (so it
        is not counted against it); "" otherwise."""
        domains = self.node_domains.get(node_id)
        if not domains or self.need(node_id, indices, cores, declared_w) is not None:
            return ""
        if indices:
            why = f"node {node_id} does not report its GPUs' power limits"
        elif cores:
            why = "LLMGW_POWER_CORE_WATTS, a core's draw, is not set"
        else:
            why = "its profile reserves no cores and declares no power_watts"
        where = ", ".join(domain_said(d) for d in domains)
        return f"its draw is unknown ({why}), so it is not counted against {where}"


def shard_w(
    gpus: Iterable[GpuPower],
    cores: int | None = None,
    declared_w: float | None = None,
    figures: Figures = Figures(),
) -> float:
    """What a shard holding room counts against a budget: its declared figure, else its
    GPUs' (each the larger of its limit and its draw), else its cores at the per-core
    figure; never less than its GPUs' measured draw; 0 when nothing is known."""
    gpus = list(gpus)
    measured = sum(g.draw_w or 0.0 for g in gpus)
    if declared_w is not None:
        return max(declared_w, measured)
    if gpus:
        return sum(g.held_w for g in gpus)
    return (cores or 0) * (figures.per_core_w or 0.0)


def bases(
    budgets: Iterable[Budget],
    node_domains: Iterable[tuple[Domain, ...]],
    figures: Figures,
) -> dict[Domain, float]:
    """What each budgeted domain holds before any replica: its declared other equipment,
    and the per-node share of every node in it (an idle node still draws it)."""
    held = {(b.kind, b.name): b.other_w for b in budgets}
    for domains in node_domains:
        for d in domains:
            if d in held:
                held[d] += figures.node_w or 0.0
    return held


@dataclass(frozen=True)
class Draw:
    """What a rack or PDU draws as placement counts it: the estimate of the replicas held
    there (`shard_w`), what is measured there (`measured_w`, by `own_w`), and how many held
    GPUs said nothing at all (of replicas that declare no draw)."""

    estimated_w: float = 0.0
    measured_w: float | None = None
    unknown_gpus: int = 0


class Held(NamedTuple):
    """A shard holding room, as what it draws is counted: its node, its GPUs, its reserved
    cores, and its share of its profile's declared `power_watts` (None: none declared)."""

    node_id: str
    indices: Iterable[int]
    cores: int | None = None
    declared_w: float | None = None


def own_w(reading: float | None, figures: Figures) -> float:
    """What a node draws itself (CPUs, memory, fans) as a domain's measured draw counts it:
    its CPU packages' measured figure (RAPL) where it reports one, else the per-node share."""
    return reading if reading is not None else figures.node_w or 0.0


def draws(
    labels: Mapping[str, Mapping[str, str]],
    held: Iterable[tuple],
    gpus: Mapping[str, Mapping[int, GpuPower]],
    figures: Figures = Figures(),
    own: Mapping[str, float] | None = None,
    whole: Mapping[str, float] | None = None,
    away: Collection[str] = frozenset(),
) -> dict[tuple[str, str], Draw]:
    """Per rack and PDU the nodes' labels name, what the replicas held there draw, as the
    ledger counts them (`shard_w`), and what is measured there: the held GPUs' draw and
    each node's own (`own_w`: its reported draw, by node in `own`, else the per-node share).
    A node whose BMC reads its whole draw (by node in `whole`) counts that figure alone, in
    place of its GPUs', its own and the share: the BMC sees them all, and adding them would
    count them twice. A domain where nothing is measured (no held GPU and no node reports
    its draw) has no measured figure: estimates alone are not a measurement. `held` is a
    `Held` (or a (node, GPU indices) pair) per shard holding room; `labels` is keyed by
    node. A node `away` (not heard from lately, or not ready) adds nothing to what is
    measured, neither its readings, its GPUs' draw nor its share: its last figures are not
    what it draws now, and a node powered off draws nothing; what placement reserves for
    it stays."""
    own, whole = own or {}, whole or {}
    est: dict[tuple[str, str], float] = {}
    seen: dict[tuple[str, str], float] = {}
    nodes_w: dict[tuple[str, str], float] = {}
    unknown: dict[tuple[str, str], int] = {}
    domains = {n: domains_of(ls) for n, ls in labels.items()}
    for node_id, where in domains.items():
        for d in where:
            est.setdefault(d, 0.0)
            unknown.setdefault(d, 0)
        if node_id in away:
            continue
        reading = whole.get(node_id, own.get(node_id))
        mine_w = whole[node_id] if node_id in whole else own_w(reading, figures)
        for d in where:
            nodes_w[d] = nodes_w.get(d, 0.0) + mine_w
            if reading is not None:  # a node measured here: the domain has a measurement
                seen[d] = seen.get(d, 0.0)
    for item in held:
        shard = Held(*item)
        where = domains.get(shard.node_id, ())
        if not where:
            continue
        mine = [gpus.get(shard.node_id, {}).get(i) or GpuPower() for i in shard.indices]
        drawn = shard_w(mine, shard.cores, shard.declared_w, figures)
        # A node read whole by its BMC: its GPUs are in that figure already; one away: stale.
        read = shard.node_id not in whole and shard.node_id not in away
        gpu_w = sum(g.draw_w or 0.0 for g in mine) if read else 0.0
        silent = sum(1 for g in mine if not g.held_w) if shard.declared_w is None else 0
        for d in where:
            est[d] += drawn
            if gpu_w:
                seen[d] = seen.get(d, 0.0) + gpu_w
            unknown[d] += silent
    return {
        d: Draw(est[d], seen[d] + nodes_w.get(d, 0.0) if d in seen else None, unknown[d])
        for d in est
    }
