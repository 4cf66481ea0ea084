"""Preemption (domain.md, both Preemption sections): which replicas to stop so a model fits.

Pure: `preempt()` takes the pass's inventory, the replicas that hold room, the
catalog and the quota policy, and answers the victims with why each, the
candidates it may not take with why not, and, when nothing can help, why. The
reconciler applies the victims; the dry run (`GET /models/{name}/preemption`)
only shows them.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from functools import cached_property

from catalog.domain import ModelSpec, Profile
from llmgw.core.config import Timings
from tenancy.quota import ZERO, Amount, Holding, Policy

from .holdings import holdings, placement_amount, profile_amount
from .placement import Inventory, Placement, could_ever_run
from .types import ACTIVE, FABRIC_LABEL, HOLDING, ModelState, ReplicaView, Reservation

MAX_VICTIMS = 3
# The protected candidates said, at most: at 5,000 nodes there may be thousands.
MAX_PROTECTED = 50

IDLE_ON_DEMAND, BORROWED, GROWN_LOWER, GROWN_SAME, MINIMUM_LOWER = range(5)
TIER_WHY = {
    IDLE_ON_DEMAND: "an idle on-demand replica",
    BORROWED: "borrowed beyond its owner's guarantee",
    GROWN_LOWER: "grown under load by a lower class",
    GROWN_SAME: "grown under load, for a model of its class below its minimum",
    MINIMUM_LOWER: "part of a lower class's minimum",
}


@dataclass(frozen=True)
class Victim:
    replica: str
    model: str
    capacity_class: str
    node: str
    why: str
    amount: Amount = ZERO


@dataclass(frozen=True)
class Protected:
    replica: str
    model: str
    why: str


@dataclass
class Preemption:
    """What preemption would do for a model: victims (empty when it cannot help), the
    candidates it may not take, and why nothing could be done when that is so."""

    victims: list[Victim] = field(default_factory=list)
    protected: list[Protected] = field(default_factory=list)
    blocked: list[str] = field(default_factory=list)
    placement: Placement | None = None
    # Room already being freed by other preemptions' victims that the placement counts on
    # as gone, (replica, node): with no victims the model waits for it and nothing stops.
    waits_for: list[tuple[str, str]] = field(default_factory=list)


@dataclass(frozen=True)
class _Candidate:
    replica: ReplicaView
    model: ModelSpec
    node: str
    tier: int | None  # by class; None when only taking back a loan could take it
    reclaimable: bool
    idle_s: float
    amount: Amount

    @property
    def rank(self) -> int:
        """Its tier as ordered: a loan to take back goes with the loans, unless it is idle."""
        return BORROWED if self.reclaimable and self.tier != IDLE_ON_DEMAND else self.tier

    def order(self) -> tuple:
        """Class inside every tier: lower class first, then longest unused, smallest, id."""
        return (self.model.class_rank, -self.idle_s, self.amount.size_key(), self.replica.id)


@dataclass(frozen=True)
class _Standing:
    """One replica as any preemptor in the pass sees it, before classes and owners."""

    replica: ReplicaView
    model: ModelSpec
    above_min: bool
    idle_s: float
    refusal: str  # why no preemptor may take it ("" when one may)
    multi: bool


@dataclass
class Context:
    """What the pass knows that preemption reads: the quota picture (what each scope holds,
    room in flight charged to whom it is for), and what this pass already took."""

    models: Mapping[str, ModelSpec]
    alive: Sequence[ReplicaView]
    policy: Policy
    usage: dict[str, Amount]
    now: datetime
    t: Timings
    held: list[Holding] = field(default_factory=list)
    # Replicas this pass already drains or stops: not chosen again for another model.
    taken: set[str] = field(default_factory=set)
    # Per model, the whole room kept for it (as it was kept, victims' part included): the
    # part of room being freed that is its own, which nobody else counts on.
    promised: dict[str, tuple[Reservation, ...]] = field(default_factory=dict)

    @cached_property
    def freeing(self) -> dict[str, ReplicaView]:
        """Replicas on their way out to make room for a model (preempted, draining or
        stopping): room being freed, which a later preemptor counts as gone rather than
        stopping more. This pass's victims are added as they are chosen."""
        return {r.id: r for r in self.alive if r.preempted_for and r.state in HOLDING}

    @cached_property
    def _by_id(self) -> dict[str, ReplicaView]:
        return {r.id: r for r in self.alive}

    def preempted(self, model: str, victims: Iterable[str], room: Sequence[Reservation]) -> None:
        """What this pass decided for `model`: its victims go (taken, their room being freed)
        and `room` is kept for it."""
        for v in victims:
            self.taken.add(v)
            if (r := self._by_id.get(v)) is not None:
                self.freeing[v] = r
        self.promised[model] = tuple(room)

    @cached_property
    def borrowed(self) -> set[str]:
        """What is held beyond a guarantee; worked out only when a model wants room."""
        return self.policy.borrowed(self.held) if self.policy.quotas else set()

    def charge(self, owner: str, amount: Amount, sign: int = 1) -> None:
        """Count (or, with sign -1, stop counting) `amount` against an owner's chain."""
        for s in self.policy.chain(owner):
            held = self.usage.get(s, ZERO)
            self.usage[s] = held + amount if sign > 0 else held - amount

    @cached_property
    def standing(self) -> dict[str, list[_Standing]]:
        """Per node, the replicas there that are not already on their way out: worked out
        once a pass, however many models want room."""
        now, t = self.now, self.t
        above = _above_min(self.alive, self.models)
        out: dict[str, list[_Standing]] = {}
        for r in self.alive:
            other = self.models.get(r.model)
            if other is None or r.retiring or r.preempted_for or r.state not in ACTIVE:
                continue
            refusal = ""
            if r.state != "ready" or r.ready_at is None:
                refusal = "is still starting"
            elif (ready_for := (now - r.ready_at).total_seconds()) < t.min_lifetime:
                until = r.ready_at + timedelta(seconds=t.min_lifetime)
                refusal = f"is protected until {until:%H:%M} (ready {int(ready_for // 60)} min)"
            entry = _Standing(r, other, r.id in above, _idle(r, now), refusal, len(r.nodes) > 1)
            for node in r.nodes:
                out.setdefault(node, []).append(entry)
        return out

    @cached_property
    def _useful(self) -> dict[tuple, set[str]]:
        return {}

    def useful_nodes(self, inv: Inventory, profiles: Sequence[Profile], source: str) -> set[str]:
        """The nodes that could run one of these profiles if empty, remembered for the pass."""
        key = (tuple(p.fingerprint() for p in profiles), source)
        if key not in self._useful:
            self._useful[key] = {
                room.node.id
                for room in inv.rooms.values()
                if any(could_ever_run(room.node, p, source) for p in profiles)
            }
        return self._useful[key]


def context(
    models: Mapping[str, ModelSpec],
    alive: Sequence[ReplicaView],
    policy: Policy,
    now: datetime,
    t: Timings,
    reserved: Mapping[str, Iterable[Reservation]] | None = None,
) -> Context:
    """The quota picture of the replicas holding room: what each scope holds, and room
    being freed for a model (`reserved`) charged to that model's owner. With no quotas
    nobody is guaranteed or limited, and the picture is not worked out."""
    promised = {name: tuple(room) for name, room in (reserved or {}).items()}
    if not policy.quotas:
        return Context(models, alive, policy, {}, now, t, promised=promised)
    held = holdings(alive, models)
    ctx = Context(models, alive, policy, policy.usage(held), now, t, held, promised=promised)
    for name, room in (reserved or {}).items():
        if name in models:
            ctx.charge(models[name].owner, reserved_amount(room))
    return ctx


def live_reservations(
    states: Mapping[str, ModelState], now: datetime
) -> dict[str, tuple[Reservation, ...]]:
    """Per model, the room kept for it whose hold has not ended."""
    return {
        name: s.reserved
        for name, s in states.items()
        if s.reserved and s.reserved_until and now < s.reserved_until
    }


def reserved_amount(room: Iterable[Reservation]) -> Amount:
    """What room kept for a model comes to, once it is placed there."""
    total = ZERO
    for r in room:
        total = total + Amount(len(r.gpu_indices), r.cpu_cores or 0, r.memory_gb or 0.0)
    return total


def _idle(r: ReplicaView, now: datetime) -> float:
    """Seconds unused; 0 when nobody has said, which is not the same as idle."""
    return (now - r.last_used_at).total_seconds() if r.last_used_at else 0.0


def _above_min(alive: Iterable[ReplicaView], models: Mapping[str, ModelSpec]) -> set[str]:
    """Per model, its newest live replicas past its minimum: room it grew into."""
    by_model: dict[str, list[ReplicaView]] = {}
    for r in alive:
        if r.state in ACTIVE and not r.retiring:
            by_model.setdefault(r.model, []).append(r)
    out = set()
    for name, reps in by_model.items():
        spec = models.get(name)
        if spec is None:
            continue
        reps.sort(key=lambda r: (r.created_at, r.id), reverse=True)
        out.update(r.id for r in reps[: max(len(reps) - spec.min_replicas, 0)])
    return out


def _class_tier(
    want: ModelSpec, other: ModelSpec, above_min: bool, idle_s: float, below_min: bool, t: Timings
) -> int | None:
    mine, theirs = want.class_rank, other.class_rank
    idle = other.on_demand and idle_s >= t.eviction_grace
    if idle and (theirs < mine or (want.on_demand and theirs <= mine)):
        return IDLE_ON_DEMAND
    if theirs < mine and above_min:
        return GROWN_LOWER
    if theirs == mine and above_min and below_min:
        return GROWN_SAME
    if theirs < mine and other.effective_class != "critical":
        return MINIMUM_LOWER
    return None


def _class_refusal(want: ModelSpec, other: ModelSpec, above_min: bool) -> str:
    if other.effective_class == "critical" and not above_min:
        return f"is part of critical model {other.name}'s minimum"
    if other.class_rank > want.class_rank:
        return f"is {other.effective_class}, above {want.name}'s {want.effective_class}"
    if above_min:
        return f"is {other.effective_class} like {want.name}, which is not below its minimum"
    return f"is {other.effective_class} like {want.name}, and at its own minimum"


def _groups(
    inv: Inventory, profiles: Sequence[Profile], useful: set[str], with_candidates: set[str]
) -> list[tuple[str, frozenset[str]]]:
    """Where room may be made: each node for one-node profiles, each fabric for the rest."""
    groups: dict[str, frozenset[str]] = {}
    if any(p.nodes == 1 for p in profiles):
        for n in sorted(useful & with_candidates):
            groups[n] = frozenset((n,))
    if any(p.nodes > 1 for p in profiles):
        fabrics: dict[str, set[str]] = {}
        for n in useful:
            fabric = inv.rooms[n].node.labels.get(FABRIC_LABEL)
            if fabric:
                fabrics.setdefault(fabric, set()).add(n)
        for fabric, nodes in sorted(fabrics.items()):
            if nodes & with_candidates:
                groups[f"{FABRIC_LABEL}={fabric}"] = frozenset(nodes)
    return list(groups.items())


def candidates(
    want: ModelSpec,
    live: int,
    ctx: Context,
    useful: set[str],
) -> tuple[list[_Candidate], list[Protected], list[str], int]:
    """The replicas on useful nodes that may be stopped for `want`, those that may not (and
    why, at most MAX_PROTECTED of them, with how many more), and the multi-node replicas in
    the way."""
    t, policy = ctx.t, ctx.policy
    below_min = live < want.min_replicas
    # Only an owner with a guarantee can be within it and take back what others borrowed.
    may_reclaim = bool(policy.quotas) and policy.has_guarantee(want.owner)
    out: list[_Candidate] = []
    protected: list[Protected] = []
    blocked: list[str] = []
    unsaid = 0
    seen: set[str] = set()
    by_node = ctx.standing
    for node in sorted(useful & by_node.keys()):
        for s in by_node[node]:
            r, other = s.replica, s.model
            if r.model == want.name or r.id in seen or r.id in ctx.taken:
                continue
            seen.add(r.id)

            def refuse(why: str, r=r) -> None:
                nonlocal unsaid
                if len(protected) < MAX_PROTECTED:
                    protected.append(Protected(r.id, r.model, f"candidate {r.id} {why}"))
                else:
                    unsaid += 1

            if s.multi:
                blocked.append(f"blocked by multi-node replica {r.id}")
                refuse("spans several nodes")
                continue
            if s.refusal:
                refuse(s.refusal)
                continue
            borrowed = r.id in ctx.borrowed
            if policy.quotas and not borrowed and other.owner != want.owner:
                refuse(f"is within {policy.name(other.owner)}'s guarantee")
                continue
            tier = _class_tier(want, other, s.above_min, s.idle_s, below_min, t)
            reclaimable = (
                may_reclaim
                and borrowed
                and other.owner != want.owner
                and (other.effective_class != "critical" or s.above_min)
            )
            if tier is None and not reclaimable:
                refuse(_class_refusal(want, other, s.above_min))
                continue
            out.append(_Candidate(r, other, node, tier, reclaimable, s.idle_s, r.amount))
    return out, protected, blocked, unsaid


def _minus(policy: Policy, usage: Mapping[str, Amount], gone: Iterable[_Candidate]) -> dict:
    out = dict(usage)
    for c in gone:
        for s in policy.chain(c.model.owner):
            out[s] = out.get(s, ZERO) - c.amount
    return out


def freed_trial(
    inv: Inventory,
    nodes: Iterable[str],
    release: Iterable[ReplicaView],
    freeing: Iterable[ReplicaView],
    promised: Mapping[str, Sequence[Reservation]],
) -> Inventory:
    """A copy of these nodes' room with `release` stopped and the room `freeing` is
    already being freed counted as gone too; what of that room is kept for the model it is
    being freed for (`promised`, as `inv.reserved` keeps it now) stays that model's."""
    gone = {r.id: r for r in (*release, *freeing)}
    trial = inv.trial(nodes, gone.values())
    if not freeing:
        return trial
    for model, kept in inv.reserved.items():
        whole = {r.node_id: r for r in promised.get(model, ())}
        for k in kept:
            r = whole.get(k.node_id)
            if r is None or k.node_id not in trial.rooms or not gone.keys() & set(r.victims):
                continue
            # The part its victims held, free in the trial, is kept for it again.
            trial.keep(
                model,
                [
                    Reservation(
                        k.node_id,
                        r.gpu_indices,
                        max((r.memory_gb or 0.0) - (k.memory_gb or 0.0), 0.0),
                        max((r.cpu_cores or 0) - (k.cpu_cores or 0), 0),
                    )
                ],
            )
    return trial


def place_kept(
    inv: Inventory, profiles: Sequence[Profile], room: Sequence[Reservation], source: str = ""
) -> Placement | None:
    """A placement into the room kept for a model, on the very GPUs kept, once that room is
    free; None while it is not (its victims still hold it) or when it no longer fits there."""
    if not room:
        return None
    gpus: dict[str, set[int]] = {}
    for r in room:
        gpus.setdefault(r.node_id, set()).update(r.gpu_indices)
    trial = inv.trial(gpus)
    if len(trial.rooms) != len(gpus):
        return None
    for node, kept in gpus.items():
        here = trial.rooms[node]
        if kept:
            here.free_gpus = {c: [i for i in ids if i in kept] for c, ids in here.free_gpus.items()}
    placed = trial.place(profiles, weights_source=source)
    return placed if isinstance(placed, Placement) else None


def _guarantee_passed(policy: Policy, owner: str, usage: Mapping[str, Amount], need: Amount) -> str:
    """The first guarantee along an owner's chain `need` would take it past, with figures."""
    for q in policy.governing(owner):
        if q.guarantee.any() and (over := q.guarantee.over(usage.get(q.scope, ZERO) + need)):
            return f"{policy.name(q.scope)} ({over})"
    return policy.name(owner) or "its owner"


def _guarantee_dropped(
    policy: Policy, owner: str, usage: Mapping[str, Amount], taken: Amount
) -> str:
    """The first scope along an owner's chain that taking `taken` leaves below its guarantee."""
    for q in policy.governing(owner):
        if q.guarantee.below(usage.get(q.scope, ZERO), taken):
            return policy.name(q.scope)
    return ""


def preempt(
    want: ModelSpec,
    profiles: Sequence[Profile],
    live: int,
    inv: Inventory,
    ctx: Context,
    avoid: frozenset[str] = frozenset(),
) -> Preemption:
    """Choose the fewest, least costly replicas whose stopping lets `want` be placed.

    Victim sets are built per node (per fabric for multi-node profiles) from candidates in
    tier order, each tried on a copy of that room, where room other preemptions are already
    freeing counts as gone (less what is kept for the models it is freed for): when that is
    enough, nothing more is stopped. Then every victim not needed is dropped again, and a
    set of more than three is refused. The owner's quota limit is checked in the trial with
    its own victims gone, and a loan is taken back only for an owner within its guarantee
    on the trial, with the victims removed. Victims whose owners would drop below a
    guarantee are taken only when nothing else makes the room, and only for an owner within
    its own. Every candidate not taken is named among the protected, with why.
    """
    useful = ctx.useful_nodes(inv, profiles, want.source)
    result = Preemption()
    if not useful:
        result.blocked.append(f"no node could run {want.name} even if it were empty")
        return result
    cands, result.protected, blocked, unsaid = candidates(want, live, ctx, useful)
    result.blocked.extend(sorted(set(blocked)))
    freeing: dict[str, list[ReplicaView]] = {}
    for r in ctx.freeing.values():
        for n in sorted(r.nodes & useful):
            freeing.setdefault(n, []).append(r)
    # Why each candidate that is not taken is spared by a rule, and why making room on a
    # node failed (for those merely not needed, or on a node where it could not help).
    spared: dict[str, str] = {}
    node_why: dict[str, str] = {}

    def finish(why_not: str = "") -> Preemption:
        """Name every candidate not taken, with why (`why_not`: why none may be taken)."""
        nonlocal unsaid
        victims = {v.replica for v in result.victims}
        if result.victims:
            enough = f"stopping {', '.join(sorted(victims))} makes the room"
        elif result.waits_for:
            enough = f"room being freed by {', '.join(r for r, _ in result.waits_for)} is enough"
        else:
            enough = ""
        for c in cands:
            rid = c.replica.id
            if rid in victims:
                continue
            if len(result.protected) >= MAX_PROTECTED:
                unsaid += 1
                continue
            if rid in spared:
                why = spared[rid]
            elif enough:
                why = f"candidate {rid} is not needed: {enough}"
            else:
                failed = (
                    why_not
                    or node_why.get(c.node)
                    or "stopping what may be stopped would not make room"
                )
                why = f"candidate {rid} may be stopped, but {failed}"
            result.protected.append(Protected(rid, c.model.name, why))
        if unsaid:
            result.blocked.append(f"and {unsaid} more candidates not listed")
        return result

    if not cands and not freeing:
        if result.protected or blocked:
            result.blocked.append("no replica in its way may be stopped for it")
        return finish()
    policy = ctx.policy
    need_guess = _first_need(profiles)
    smallest = min((profile_amount(p) for p in profiles), key=Amount.size_key, default=ZERO)
    mine = set(policy.chain(want.owner))
    # Candidates whose going lowers what the wanting owner's chain holds: its own victims,
    # and those of scopes sharing a guarantee with it.
    own = [c for c in cands if mine & set(policy.chain(c.model.owner))]
    own_ids = {c.replica.id for c in own}
    # Limits first: with every victim of its own gone, would it still pass a limit?
    if (
        want.owner
        and policy.quotas
        and (why := policy.at_limit(want.owner, _minus(policy, ctx.usage, own), smallest))
    ):
        result.blocked.append(why)
        return finish(why)
    by_node: dict[str, list[_Candidate]] = {}
    for c in cands:
        by_node.setdefault(c.node, []).append(c)
    owner_loans: dict[str, Amount] = {}
    for c in cands:
        if c.reclaimable:
            owner_loans[c.model.owner] = owner_loans.get(c.model.owner, ZERO) + c.amount
    # Whether any trial could find it within its guarantee: else it borrows, whatever it takes.
    could_reclaim = (
        bool(policy.quotas)
        and policy.has_guarantee(want.owner)
        and policy.within_guarantee(want.owner, _minus(policy, ctx.usage, own), smallest)
    )

    def flow_of(group: frozenset[str]) -> list[ReplicaView]:
        return list({r.id: r for n in sorted(group) for r in freeing.get(n, ())}.values())

    def fits(
        group: frozenset[str], chosen: list[_Candidate], flow: list[ReplicaView]
    ) -> Placement | None:
        trial = freed_trial(inv, group, [c.replica for c in chosen], flow, ctx.promised)
        placed = trial.place_spread(profiles, avoid & group, want.source)
        return placed if isinstance(placed, Placement) else None

    def reclaiming(chosen: list[_Candidate], need: Amount) -> bool:
        return policy.within_guarantee(want.owner, _minus(policy, ctx.usage, chosen), need)

    def allowed(
        c: _Candidate, chosen: list[_Candidate], may_drop: bool, pool: list[_Candidate]
    ) -> bool:
        rid = c.replica.id
        if c.tier is None:
            # A loan, taken back only by an owner within its guarantee on the trial: with
            # this one, and every victim of its own that could go with it, gone.
            theirs = [o for o in pool if o.replica.id in own_ids]
            if not reclaiming([*chosen, c, *theirs], need_guess):
                past = _guarantee_passed(
                    policy, want.owner, _minus(policy, ctx.usage, [*chosen, c, *theirs]), need_guess
                )
                spared.setdefault(
                    rid,
                    f"candidate {rid} is on loan, but {want.name} would take {past} past its guarantee",
                )
                return False
        if not may_drop and policy.quotas:
            after = _minus(policy, ctx.usage, chosen)
            if scope := _guarantee_dropped(policy, c.model.owner, after, c.amount):
                borrows = "" if could_reclaim else f", and {want.name} would borrow"
                spared.setdefault(
                    rid, f"candidate {rid} would take {scope} below its guarantee{borrows}"
                )
                return False
        if may_drop:
            spared.pop(rid, None)
        return True

    def still_valid(chosen: list[_Candidate], need: Amount) -> bool:
        return all(c.tier is not None for c in chosen) or reclaiming(chosen, need)

    def pick(pool: list[_Candidate], chosen: list[_Candidate]) -> _Candidate:
        """The next candidate in tier order; among loans, from whoever still borrows most."""
        taken: dict[str, Amount] = {}
        for c in chosen:
            taken[c.model.owner] = taken.get(c.model.owner, ZERO) + c.amount

        def key(c: _Candidate) -> tuple:
            if c.rank == BORROWED:
                left = owner_loans.get(c.model.owner, ZERO) - taken.get(c.model.owner, ZERO)
                return (c.rank, tuple(-x for x in left.size_key()), c.order())
            return (c.rank, (), c.order())

        return min(pool, key=key)

    def build(group: frozenset[str], may_drop: bool, loans: bool = True):
        """The victim set for this group: (score, victims, placement, room being freed it
        counts on), a sentence when it is refused, None when there is none; "loans" when
        the set found needs a loan back its owner would not be within its guarantee for."""
        pool = [c for n in sorted(group) for c in by_node.get(n, ()) if loans or c.tier is not None]
        flow = flow_of(group)
        chosen: list[_Candidate] = []
        # Room already being freed may be enough: then nothing more is stopped.
        placed = fits(group, chosen, flow) if flow else None
        while pool and placed is None:
            c = pick(pool, chosen)
            pool.remove(c)
            if allowed(c, chosen, may_drop, pool):
                chosen.append(c)
                placed = fits(group, chosen, flow)
        if placed is None:
            return None
        for i in reversed(range(len(chosen))):
            fewer = chosen[:i] + chosen[i + 1 :]
            if (
                fewer
                and (p := fits(group, fewer, flow))
                and still_valid(fewer, placement_amount(p))
            ):
                chosen, placed = fewer, p
        # Of the room being freed, only what it needs is counted on.
        for r in list(flow):
            fewer_flow = [f for f in flow if f is not r]
            if p := fits(group, chosen, fewer_flow):
                flow, placed = fewer_flow, p
        need = placement_amount(placed)
        if (may_drop and not reclaiming(chosen, need)) or not still_valid(chosen, need):
            for c in chosen:
                if c.tier is None:
                    past = _guarantee_passed(
                        policy, want.owner, _minus(policy, ctx.usage, chosen), need
                    )
                    spared.setdefault(
                        c.replica.id,
                        f"candidate {c.replica.id} is on loan, but {want.name} would take "
                        f"{past} past its guarantee",
                    )
            return "loans" if loans and any(c.tier is None for c in chosen) else None
        if len(chosen) > MAX_VICTIMS:
            return f"would need {len(chosen)} victims (at most {MAX_VICTIMS})"
        # Limits first, on the trial: the victims' holds are gone, so an owner's own (or a
        # sibling's under the same limit) count for it.
        if want.owner and (
            why := policy.at_limit(want.owner, _minus(policy, ctx.usage, chosen), need)
        ):
            return why
        worst = max((c.rank for c in chosen), default=-1)
        klass = max((c.model.class_rank for c in chosen), default=0)
        size = sum((c.amount for c in chosen), ZERO).size_key()
        return (worst, klass, len(chosen), size), chosen, placed, flow

    groups = _groups(inv, profiles, useful, by_node.keys() | freeing.keys())
    reasons: list[str] = []

    def failed(group: frozenset[str], why: str) -> None:
        for n in group:
            node_why.setdefault(n, why)

    # Groups by the best any set there could score: a group whose bound is no better than
    # the best set found is not tried, and one that could not make the room at all is not
    # either (at 5,000 nodes this is what keeps a decision in milliseconds).
    bounded = []
    for name, group in groups:
        pool = [c for n in group for c in by_node.get(n, ())]
        flow = flow_of(group)
        if flow and fits(group, [], flow):
            bound = (-1, 0, 0, ZERO.size_key())
        else:
            base = freed_trial(inv, group, (), flow, ctx.promised) if flow else inv
            bound = _lower_bound(pool, group, profiles, base)
        where = f"node {name}" if len(group) == 1 else name
        if bound is None:
            failed(group, f"stopping all that may be stopped on {where} would not make room")
            continue
        if bound[2] > MAX_VICTIMS:
            why = f"would need {bound[2]} victims (at most {MAX_VICTIMS})"
            reasons.append(why)
            failed(group, f"making room on {where} {why}")
            continue
        bounded.append((bound, name, group))
    bounded.sort(key=lambda b: (b[0], b[1]))
    for may_drop in (False, True):
        if may_drop and not could_reclaim:
            break
        best = None
        for bound, name, group in bounded:
            if best is not None and (bound, name) > best[0]:
                break
            found = build(group, may_drop)
            if found == "loans":
                found = build(group, may_drop, loans=False)
            where = f"node {name}" if len(group) == 1 else name
            if isinstance(found, str):
                reasons.append(found)
                failed(
                    group, f"making room on {where} {found}" if found.startswith("would") else found
                )
            elif found is None:
                failed(group, f"stopping what may be stopped on {where} would not make room")
            elif best is None or (found[0], name) < best[0]:
                best = ((found[0], name), found[1], found[2], found[3])
        if best is not None:
            _, chosen, placed, flow = best
            reclaimed = reclaiming(chosen, placement_amount(placed))
            result.victims = [
                Victim(
                    c.replica.id,
                    c.model.name,
                    c.model.effective_class,
                    c.node,
                    TIER_WHY[c.rank if reclaimed or c.tier is None else c.tier],
                    c.amount,
                )
                for c in chosen
            ]
            nodes = {s.node_id for s in placed.shards}
            result.waits_for = [(r.id, n) for r in flow for n in sorted(r.nodes & nodes)]
            result.placement = placed
            return finish()
        if not policy.quotas:
            break
    if reasons:
        result.blocked.extend(dict.fromkeys(reasons))
    elif any(c.replica.id not in spared for c in cands):
        result.blocked.append("stopping what it may stop would not make room for it")
    else:
        result.blocked.append("no replica in its way may be stopped for it")
    return finish()


def _fewest(amounts: list[float], deficit: float) -> int | None:
    """The fewest of these amounts that together reach `deficit`; None when all do not."""
    if deficit <= 1e-9:
        return 0
    total = 0.0
    for i, a in enumerate(sorted(amounts, reverse=True), start=1):
        total += a
        if total >= deficit - 1e-9:
            return i
    return None


def _lower_bound(
    pool: list[_Candidate], group: frozenset[str], profiles: Sequence[Profile], inv: Inventory
) -> tuple | None:
    """The best score a victim set in this group could have, comparable with build()'s; None
    when even all its candidates could not make the room. Exact for one-node profiles' GPUs,
    memory and cores; for a fabric, only the candidates' tiers and classes bound it."""
    if not pool:
        return None
    rank = min(c.rank for c in pool)
    klass = min(c.model.class_rank for c in pool)
    if len(group) > 1:
        return (rank, klass, 1, ZERO.size_key())
    room = inv.rooms[next(iter(group))]
    fewest: list[tuple[int, float]] = []
    for p in profiles:
        if p.nodes != 1:
            continue
        gpus = p.gpus_on_each_node - len(room.free_gpus.get(p.gpu_class, ())) if p.gpu_class else 0
        memory = (
            p.min_memory_gb - room.memory_free
            if p.min_memory_gb is not None and room.memory_free is not None
            else 0
        )
        cores = (
            p.reserved_cores - room.cores_free
            if p.reserved_cores and room.cores_free is not None
            else 0
        )
        counts = [
            _fewest([c.amount.gpus for c in pool], gpus),
            _fewest([c.amount.memory_gb for c in pool], memory),
            _fewest([c.amount.cpu_cores for c in pool], cores),
        ]
        if None not in counts:
            fewest.append((max(max(counts), 1), max(gpus, 0)))
    if not fewest:
        return None
    k, gpus = min(fewest)
    return (rank, klass, k, (gpus, 0.0, 0))


def _first_need(profiles: Sequence[Profile]) -> Amount:
    return profile_amount(profiles[0]) if profiles else ZERO
