"""Shedding: load moved off a facility domain hot for long (docs/facility.md, "Shedding").

Opt-in (LLMGW_FACILITY_SHED: every domain, or those named). A domain `hot` for longer than
its shed delay has one replica moved off it per interval, through preemption's machinery:
only a replica ready and past its minimum lifetime (the context's standing; one over several
nodes too, shed when any of its nodes is in the domain), the lowest class first, replicas
above their model's minimum before any at it, a critical model's minimum never. The move is
make-before-break, as defragmentation's: the replacement is placed first on nodes none of
which is in a hot domain (a replica over several nodes through its fabric group, as
placement takes one), the old replica retires and stops once its replacement is ready
(stopping.py). With no room outside for a replacement nothing moves: shedding moves work,
it never drops it.

Under observe-only (LLMGW_FACILITY_ENFORCE off) every move is said ("would have shed …")
and nothing is done. `plan_shed` is the pure choice; `shed` does it in a pass.

Power capping is the gentler alternative (LLMGW_FACILITY_POWER_CAP): a node in a warm or
hot domain has its GPUs held to a share of their default power limit, and let go once none
of its domains is; `power_caps` decides which nodes change.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, replace

from catalog.domain import ModelSpec
from tenancy.quota import ZERO, Amount

from .capping import wanted
from .conditions import HOT, Domain, Facility, domains_of, duration_said
from .holdings import placement_amount
from .measured import ordered_profiles
from .placement import Inventory, Placement
from .plan import Event, Pass, Retire
from .preemption import Context
from .refusals import SHED
from .starting import start_replica
from .types import HOLDING, ReplicaView

BLOCKED = "facility_shed_blocked"  # the event of a domain due to shed that moved nothing
REASON = "shed "  # how a shed replica's retire reason (its move's sentence) begins


@dataclass(frozen=True)
class Candidate:
    """A replica that may be shed, and how early: lower class, above its minimum, first."""

    replica: ReplicaView
    model: ModelSpec
    above_min: bool

    @property
    def order(self) -> tuple:
        return (self.model.class_rank, not self.above_min, self.replica.id)


@dataclass(frozen=True)
class Shed:
    """One replica moved off a hot domain: its replacement's placement elsewhere."""

    domain: Domain
    candidate: Candidate
    to: Placement
    said: str  # "shed chat-1a2b3c of chat off rack r1 to gpu-b: hot for 7 min (inlet 34 °C)"
    # Every domain the replica leaves: the move counts for each (one per domain per interval).
    domains: tuple[Domain, ...] = ()


def due(fac: Facility, domain: Domain) -> bool:
    """Whether a domain is to shed now: opted in, hot for its shed delay, its readings still
    saying hot, and its last move an interval ago or more."""
    s = fac.states.get(domain)
    if s is None or s.condition != HOT or s.since is None or not fac.shed.applies(domain):
        return False
    if s.above[1] is None:
        return False  # its readings are back under hot: it is cooling, nothing moves
    if fac.now - s.since < fac.shed.delay:
        return False
    last = fac.shed_at.get(domain)
    return last is None or fac.now - last >= fac.shed.interval


def candidates(replicas: Iterable[tuple[ReplicaView, ModelSpec, bool]]) -> list[Candidate]:
    """The replicas that may be shed, in the order they go; a critical model's replica at
    its minimum is never one."""
    out = [
        Candidate(r, m, above)
        for r, m, above in replicas
        if above or m.effective_class != "critical"
    ]
    return sorted(out, key=lambda c: c.order)


def in_flight(alive: Iterable[ReplicaView], nodes: Mapping[str, tuple[Domain, ...]]) -> set[Domain]:
    """The domains a shed replica is still leaving: no other move there until it is gone."""
    out: set[Domain] = set()
    for r in alive:
        if r.retiring and r.reason.startswith(REASON) and r.state in HOLDING:
            for n in r.nodes:
                out.update(nodes.get(n, ()))
    return out


def _sentence(fac: Facility, domain: Domain, c: Candidate, to: Placement) -> str:
    s = fac.states[domain]
    kind, name = domain
    where = ", ".join(sh.node_id for sh in to.shards)
    since = fac.now if s.since is None else s.since  # 0 is a moment, not unknown
    hot = f"hot for {duration_said(fac.now - since)} ({s.why})"
    return f"shed {c.replica.id} of {c.model.name} off {kind} {name} to {where}: {hot}"


def plan_shed(
    fac: Facility,
    node_domains: Mapping[str, tuple[Domain, ...]],
    standing: Mapping[str, Iterable[tuple[ReplicaView, ModelSpec, bool]]],
    busy: set[Domain],
    place: Callable[[Candidate, frozenset[str]], Placement | None],
) -> tuple[list[Shed], list[tuple[Domain, str]]]:
    """Per domain due to shed, at most one move: its first candidate whose replacement
    `place` finds room for outside every hot domain; and why a due domain moved nothing.
    `busy` are the domains with a move in flight; a replica moved counts for every domain it
    is in, so no domain sees two moves in one pass."""
    hot = {d for d, s in fac.states.items() if s.condition == HOT}
    hot_nodes = frozenset(n for n, ds in node_domains.items() if hot.intersection(ds))
    moved: list[Shed] = []
    why: list[tuple[Domain, str]] = []
    done: set[Domain] = set(busy)
    taken: set[str] = set()
    for d in sorted(fac.states):
        if d in done or not due(fac, d):
            continue
        mine = [n for n, ds in node_domains.items() if d in ds]
        seen: dict[str, tuple[ReplicaView, ModelSpec, bool]] = {}
        for n in sorted(mine):
            for r, m, above in standing.get(n, ()):
                if r.id not in taken:
                    seen.setdefault(r.id, (r, m, above))
        found = candidates(seen.values())
        if not found:
            why.append((d, f"{d[0]} {d[1]} is hot and has nothing that may be shed"))
            continue
        for c in found:
            if any(x in done for n in c.replica.nodes for x in node_domains.get(n, ())):
                continue
            to = place(c, hot_nodes | frozenset(mine))
            if to is not None:
                left = tuple(sorted({x for n in c.replica.nodes for x in node_domains.get(n, ())}))
                moved.append(Shed(d, c, to, _sentence(fac, d, c, to), left))
                taken.add(c.replica.id)
                done.update(left)
                break
        else:
            why.append((d, f"{d[0]} {d[1]} is hot and no replica on it has room elsewhere"))
    return moved, why


def _standing(ctx: Context) -> dict[str, list[tuple[ReplicaView, ModelSpec, bool]]]:
    """Per node, the replicas that may be shed (ready, past their minimum lifetime, not taken
    this pass). Unlike preemption, which frees one node's room and so cannot use a replica
    over several, shedding moves the whole replica: one over several nodes is listed under
    each, and leaves every domain any of them is in."""
    return {
        n: [
            (s.replica, s.model, s.above_min)
            for s in entries
            if not s.refusal and s.replica.id not in ctx.taken
        ]
        for n, entries in ctx.standing.items()
    }


def _placer(p: Pass, reserve: bool) -> Callable[[Candidate, frozenset[str]], Placement | None]:
    """Where a shed replica's replacement goes, avoiding the nodes given: as its model's own
    step places (starting.py), on a node not running the model yet if there is one, within
    its owner's limits; None when nowhere. With `reserve` (enforced), its room is taken at
    once, so the next domain's move in this pass cannot choose it too."""
    inv: Inventory = p.inv
    ctx: Context = p.ctx
    usage: dict[str, Amount] = dict(ctx.usage)

    def place(c: Candidate, avoid: frozenset[str]) -> Placement | None:
        m = c.model
        runs = frozenset(inv.model_nodes.get(m.name, set()))
        profiles = ordered_profiles(m, p.snap.measurements)
        for away in (avoid | runs, avoid):
            placed = inv.place(profiles, avoid=away, weights_source=m.source, model=m.name)
            if isinstance(placed, Placement):
                need = placement_amount(placed)
                if m.owner and ctx.policy.at_limit(m.owner, usage, need):
                    return None
                for scope in ctx.policy.chain(m.owner):
                    usage[scope] = usage.get(scope, ZERO) + need
                if reserve:
                    inv.reserve(m.name, placed)
                return placed
        return None

    return place


def shed(p: Pass) -> None:
    """After every model's step: each domain due to shed moves one replica off it, said in
    an event and in the model's explanation; under observe-only, said and not done."""
    fac = p.snap.facility
    if fac is None or not (fac.shed.every_domain or fac.shed.domains):
        return
    if not any(due(fac, d) for d in fac.states):
        return  # the usual pass, hot or not: nothing read, the inventory not built
    node_domains = {n: domains_of(node.labels) for n, node in p.snap.nodes.items()}
    busy = in_flight(p.ctx.alive, node_domains)
    moves, why = plan_shed(fac, node_domains, _standing(p.ctx), busy, _placer(p, fac.enforce))
    for move in moves:
        _do(move, p, fac.enforce)
    for (kind, name), said in why:
        # Said once per interval, as a move would be (the shell keeps when: shed_at).
        where = f"{kind}:{name}"
        p.plan.events.append(Event(said, BLOCKED, domain=where, domains=[where]))


def _do(move: Shed, p: Pass, enforce: bool) -> None:
    c, name = move.candidate, move.candidate.model.name
    kind, dname = move.domain
    said = move.said if enforce else f"would have {move.said} (LLMGW_FACILITY_ENFORCE is off)"
    p.plan.events.append(
        Event(
            said,
            "facility_shed",
            model=name,
            replica=c.replica.id,
            domain=f"{kind}:{dname}",
            domains=[f"{k}:{n}" for k, n in move.domains],
        )
    )
    state = p.states.get(name)
    if state is not None:
        kept = tuple(e for e in state.explanation if e.get("profile") != SHED)
        p.states[name] = replace(state, explanation=(*kept, {"profile": SHED, "reasons": [said]}))
    if not enforce:
        return
    start_replica(c.model, move.to, p, reserved=True)  # taken as the move was chosen (_placer)
    p.plan.retires.append(Retire(c.replica.id, move.said))
    p.ctx.taken.add(c.replica.id)
    p.live[name] = p.live.get(name, 0) - 1


def power_caps(
    before: Mapping[Domain, str],
    after: Mapping[Domain, str],
    node_domains: Mapping[str, tuple[Domain, ...]],
    share: float,
) -> dict[str, float | None]:
    """Per node whose cap changes with the conditions, its GPUs' share of their default
    power limit now: `share` while any of its domains is warm or hot, None (the default)
    once none is. A node whose domains' conditions changed within warm-or-hot, or within
    ok-or-unknown, is left as it is. What a node is held to is capping.wanted's, the one
    rule the kept caps compare by too."""
    out: dict[str, float | None] = {}
    for node, ds in sorted(node_domains.items()):
        now = wanted(after, ds, share)
        if wanted(before, ds, share) != now:
            out[node] = now
    return out
