"""Preemption (domain.md, both Preemption sections): which replicas to stop so a model fits.

Pure: `preempt()` takes the pass's inventory, the replicas that hold room, the
catalog and the quota policy, and answers the victims with why each, the
candidates it may not take with why not, and, when nothing can help, why. The
reconciler applies the victims; the dry run (`GET /models/{name}/preemption`)
only shows them.

The search is here: victim sets built per node (per fabric) and tried on a copy
of the room. Who may be taken and in which tier is `candidates.py`, what the
pass knows `context.py`, the room kept for a model `reserved.py`, the sentences
for what is not taken `not_taken.py`, and what it answers `victims.py`, all in
this package.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from functools import cached_property

from catalog.domain import ModelSpec, Profile
from tenancy.quota import ZERO, Amount, Policy

from ..holdings import placement_amount, profile_amount
from ..placement import Inventory, Placement
from ..placement.fabric import fabric_of
from ..types import ReplicaView
from .candidates import candidates
from .context import Context
from .not_taken import guarantee_dropped, guarantee_passed, name_not_taken
from .reserved import freed_trial
from .victims import BORROWED, MAX_VICTIMS, TIER_WHY, Candidate, Preemption, Victim


def _groups(
    inv: Inventory, profiles: Sequence[Profile], useful: set[str], with_candidates: set[str]
) -> list[tuple[str, frozenset[str]]]:
    """Where room may be made: each node for one-node profiles, and each rack or PDU under a
    budget; each fabric for the rest."""
    groups: dict[str, frozenset[str]] = {}
    if any(p.nodes == 1 for p in profiles):
        for n in sorted(useful & with_candidates):
            groups[n] = frozenset((n,))
    if any(p.nodes == 1 for p in profiles) and inv.ledger is not None:
        # A rack or PDU under a budget: a victim anywhere in it frees the watts a node of it
        # needs, though not the node's GPUs (docs/facility.md).
        domains: dict[tuple[str, str], set[str]] = {}
        for n, mine in inv.ledger.node_domains.items():
            for d in mine:
                domains.setdefault(d, set()).add(n)
        for (kind, name), nodes in sorted(domains.items()):
            if nodes & useful and nodes & with_candidates and len(nodes) > 1:
                groups[f"{kind} {name}"] = frozenset(nodes & (useful | with_candidates))
    if any(p.nodes > 1 for p in profiles):
        fabrics: dict[str, set[str]] = {}
        for n in useful:
            if fabric := fabric_of(inv.rooms[n].node):
                fabrics.setdefault(fabric, set()).add(n)
        for fabric, nodes in sorted(fabrics.items()):
            if nodes & with_candidates:
                groups[fabric] = frozenset(nodes)
    return list(groups.items())


def _budget_mates(inv: Inventory, useful: set[str], profiles: Sequence[Profile]) -> set[str]:
    """The nodes sharing a rack or PDU under a budget with a useful node: a replica there
    may be stopped for the watts it holds."""
    ledger = inv.ledger
    if ledger is None or not any(p.nodes == 1 for p in profiles):
        return set()
    wanted = {d for n in useful for d in ledger.node_domains.get(n, ())}
    return {n for n, mine in ledger.node_domains.items() if wanted.intersection(mine)} - useful


def _minus(policy: Policy, usage: Mapping[str, Amount], gone: Iterable[Candidate]) -> dict:
    out = dict(usage)
    for c in gone:
        for s in policy.chain(c.model.owner):
            out[s] = out.get(s, ZERO) - c.amount
    return out


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
    cands, result.protected, blocked, unsaid = candidates(
        want, live, ctx, useful | _budget_mates(inv, useful, profiles)
    )
    result.blocked.extend(sorted(set(blocked)))
    search = _Search(want, profiles, inv, ctx, avoid, cands, _freeing(ctx, useful))
    if not cands and not search.freeing:
        if result.protected or blocked:
            result.blocked.append("no replica in its way may be stopped for it")
        return search.finish(result, unsaid)
    # Limits first: with every victim of its own gone, would it still pass a limit?
    if why := search.past_limit():
        result.blocked.append(why)
        return search.finish(result, unsaid, why)
    groups = _groups(inv, profiles, useful, search.by_node.keys() | search.freeing.keys())
    best = search.best(search.bounded(groups))
    if best is not None:
        search.answer(result, best)
    else:
        result.blocked.extend(search.why_none())
    return search.finish(result, unsaid)


def _freeing(ctx: Context, useful: set[str]) -> dict[str, list[ReplicaView]]:
    """Per useful node, the replicas other preemptions are already stopping there."""
    freeing: dict[str, list[ReplicaView]] = {}
    for r in ctx.freeing.values():
        for n in sorted(r.nodes & useful):
            freeing.setdefault(n, []).append(r)
    return freeing


# A victim set found: (score, victims, placement, room being freed it counts on).
Found = tuple[tuple, list[Candidate], Placement, list[ReplicaView]]


class _Search:
    """One preemption search: what it reads, and what it learns on the way: why each
    candidate not taken is spared by a rule (`spared`), why making room on a node failed
    (`node_why`, for those merely not needed or where they could not help), and the
    refusals of whole victim sets (`reasons`)."""

    def __init__(
        self,
        want: ModelSpec,
        profiles: Sequence[Profile],
        inv: Inventory,
        ctx: Context,
        avoid: frozenset[str],
        cands: list[Candidate],
        freeing: dict[str, list[ReplicaView]],
    ):
        self.want, self.profiles, self.inv, self.ctx, self.avoid = want, profiles, inv, ctx, avoid
        self.cands, self.freeing, self.policy = cands, freeing, ctx.policy
        self.spared: dict[str, str] = {}
        self.node_why: dict[str, str] = {}
        self.reasons: list[str] = []
        self.need_guess = _first_need(profiles)
        self.smallest = min(
            (profile_amount(p) for p in profiles), key=Amount.size_key, default=ZERO
        )
        mine = set(self.policy.chain(want.owner))
        # Candidates whose going lowers what the wanting owner's chain holds: its own
        # victims, and those of scopes sharing a guarantee with it.
        self.own = [c for c in cands if mine & set(self.policy.chain(c.model.owner))]
        self.own_ids = {c.replica.id for c in self.own}
        self.by_node: dict[str, list[Candidate]] = {}
        self.owner_loans: dict[str, Amount] = {}
        for c in cands:
            self.by_node.setdefault(c.node, []).append(c)
            if c.reclaimable:
                self.owner_loans[c.model.owner] = (
                    self.owner_loans.get(c.model.owner, ZERO) + c.amount
                )

    def finish(self, result: Preemption, unsaid: int, why_not: str = "") -> Preemption:
        """Name every candidate not taken, with why (`why_not`: why none may be taken)."""
        return name_not_taken(result, self.cands, self.spared, self.node_why, unsaid, why_not)

    def minus(self, gone: Iterable[Candidate]) -> dict:
        return _minus(self.policy, self.ctx.usage, gone)

    def past_limit(self) -> str:
        """The limit the owner would still pass with every victim of its own gone, or ""."""
        want, policy = self.want, self.policy
        if want.owner and policy.quotas:
            return policy.at_limit(want.owner, self.minus(self.own), self.smallest) or ""
        return ""

    @cached_property
    def could_reclaim(self) -> bool:
        """Whether any trial could find it within its guarantee: else it borrows, whatever
        it takes."""
        policy = self.policy
        return (
            bool(policy.quotas)
            and policy.has_guarantee(self.want.owner)
            and policy.within_guarantee(self.want.owner, self.minus(self.own), self.smallest)
        )

    # -- Trials ------------------------------------------------------------------------

    def flow_of(self, group: frozenset[str]) -> list[ReplicaView]:
        return list({r.id: r for n in sorted(group) for r in self.freeing.get(n, ())}.values())

    def fits(
        self, group: frozenset[str], chosen: list[Candidate], flow: list[ReplicaView]
    ) -> Placement | None:
        """Where the model goes with these victims and this room being freed gone, if it fits."""
        trial = freed_trial(self.inv, group, [c.replica for c in chosen], flow, self.ctx.promised)
        want = self.want
        placed = trial.place_spread(self.profiles, self.avoid & group, want.source, want.name)
        return placed if isinstance(placed, Placement) else None

    def reclaiming(self, chosen: list[Candidate], need: Amount) -> bool:
        return self.policy.within_guarantee(self.want.owner, self.minus(chosen), need)

    def still_valid(self, chosen: list[Candidate], need: Amount) -> bool:
        return all(c.tier is not None for c in chosen) or self.reclaiming(chosen, need)

    def spare_loan(self, rid: str, chosen: list[Candidate], need: Amount) -> None:
        """Say a loan is spared: taking it back would take the owner past its guarantee."""
        past = guarantee_passed(self.policy, self.want.owner, self.minus(chosen), need)
        self.spared.setdefault(
            rid,
            f"candidate {rid} is on loan, but {self.want.name} would take {past} past its guarantee",
        )

    # -- One victim set ----------------------------------------------------------------

    def allowed(
        self, c: Candidate, chosen: list[Candidate], may_drop: bool, pool: list[Candidate]
    ) -> bool:
        """Whether `c` may join the victims: a loan only for an owner within its guarantee
        on the trial; one that would take its owner below a guarantee only with `may_drop`."""
        rid, policy = c.replica.id, self.policy
        if c.tier is None:
            # A loan, taken back only by an owner within its guarantee on the trial: with
            # this one, and every victim of its own that could go with it, gone.
            theirs = [o for o in pool if o.replica.id in self.own_ids]
            if not self.reclaiming([*chosen, c, *theirs], self.need_guess):
                self.spare_loan(rid, [*chosen, c, *theirs], self.need_guess)
                return False
        if not may_drop and policy.quotas:
            after = self.minus(chosen)
            if scope := guarantee_dropped(policy, c.model.owner, after, c.amount):
                borrows = "" if self.could_reclaim else f", and {self.want.name} would borrow"
                self.spared.setdefault(
                    rid, f"candidate {rid} would take {scope} below its guarantee{borrows}"
                )
                return False
        if may_drop:
            self.spared.pop(rid, None)
        return True

    def pick(self, pool: list[Candidate], chosen: list[Candidate]) -> Candidate:
        """The next candidate in tier order; among loans, from whoever still borrows most."""
        taken: dict[str, Amount] = {}
        for c in chosen:
            taken[c.model.owner] = taken.get(c.model.owner, ZERO) + c.amount

        def key(c: Candidate) -> tuple:
            if c.rank == BORROWED:
                owner = c.model.owner
                left = self.owner_loans.get(owner, ZERO) - taken.get(owner, ZERO)
                return (c.rank, tuple(-x for x in left.size_key()), c.order())
            return (c.rank, (), c.order())

        return min(pool, key=key)

    def build(
        self, group: frozenset[str], may_drop: bool, loans: bool = True
    ) -> Found | str | None:
        """The victim set for this group, a sentence when it is refused, None when there is
        none; "loans" when the set found needs a loan back its owner would not be within
        its guarantee for."""
        grown = self.grow(group, may_drop, loans)
        if grown is None:
            return None
        chosen, placed, flow = self.trim(group, *grown)
        return self.judge(chosen, placed, flow, may_drop, loans)

    def grow(
        self, group: frozenset[str], may_drop: bool, loans: bool
    ) -> tuple[list[Candidate], Placement, list[ReplicaView]] | None:
        """Victims taken in tier order until the model fits, none when the room being
        freed is enough already; None when all that may be taken is not."""
        pool = [
            c for n in sorted(group) for c in self.by_node.get(n, ()) if loans or c.tier is not None
        ]
        flow = self.flow_of(group)
        chosen: list[Candidate] = []
        # Room already being freed may be enough: then nothing more is stopped.
        placed = self.fits(group, chosen, flow) if flow else None
        while pool and placed is None:
            c = self.pick(pool, chosen)
            pool.remove(c)
            if self.allowed(c, chosen, may_drop, pool):
                chosen.append(c)
                placed = self.fits(group, chosen, flow)
        return None if placed is None else (chosen, placed, flow)

    def trim(
        self,
        group: frozenset[str],
        chosen: list[Candidate],
        placed: Placement,
        flow: list[ReplicaView],
    ) -> tuple[list[Candidate], Placement, list[ReplicaView]]:
        """Every victim not needed dropped again, last taken first; and of the room being
        freed, only what it needs counted on."""
        for i in reversed(range(len(chosen))):
            fewer = chosen[:i] + chosen[i + 1 :]
            if (
                fewer
                and (p := self.fits(group, fewer, flow))
                and self.still_valid(fewer, placement_amount(p))
            ):
                chosen, placed = fewer, p
        for r in list(flow):
            fewer_flow = [f for f in flow if f is not r]
            if p := self.fits(group, chosen, fewer_flow):
                flow, placed = fewer_flow, p
        return chosen, placed, flow

    def judge(
        self,
        chosen: list[Candidate],
        placed: Placement,
        flow: list[ReplicaView],
        may_drop: bool,
        loans: bool,
    ) -> Found | str | None:
        """The set found with its score, or why it may not be taken: loans its owner would
        not be within its guarantee for, too many victims, a quota limit."""
        need, want, policy = placement_amount(placed), self.want, self.policy
        if (may_drop and not self.reclaiming(chosen, need)) or not self.still_valid(chosen, need):
            for c in chosen:
                if c.tier is None:
                    self.spare_loan(c.replica.id, chosen, need)
            return "loans" if loans and any(c.tier is None for c in chosen) else None
        if len(chosen) > MAX_VICTIMS:
            return f"would need {len(chosen)} victims (at most {MAX_VICTIMS})"
        # Limits first, on the trial: the victims' holds are gone, so an owner's own (or a
        # sibling's under the same limit) count for it.
        if want.owner and (why := policy.at_limit(want.owner, self.minus(chosen), need)):
            return why
        worst = max((c.rank for c in chosen), default=-1)
        klass = max((c.model.class_rank for c in chosen), default=0)
        size = sum((c.amount for c in chosen), ZERO).size_key()
        return (worst, klass, len(chosen), size), chosen, placed, flow

    # -- Over the groups ---------------------------------------------------------------

    def failed(self, group: frozenset[str], why: str) -> None:
        for n in group:
            self.node_why.setdefault(n, why)

    def bounded(self, groups: list[tuple[str, frozenset[str]]]) -> list[tuple]:
        """Groups by the best any set there could score, best first; a group that could not
        make the room at all, or only with too many victims, is left out (at 5,000 nodes
        this is what keeps a decision in milliseconds)."""
        bounded = []
        for name, group in groups:
            bound = self.bound(group)
            where = f"node {name}" if len(group) == 1 else name
            if bound is None:
                self.failed(
                    group, f"stopping all that may be stopped on {where} would not make room"
                )
                continue
            if bound[2] > MAX_VICTIMS:
                why = f"would need {bound[2]} victims (at most {MAX_VICTIMS})"
                self.reasons.append(why)
                self.failed(group, f"making room on {where} {why}")
                continue
            bounded.append((bound, name, group))
        bounded.sort(key=lambda b: (b[0], b[1]))
        return bounded

    def bound(self, group: frozenset[str]) -> tuple | None:
        """The best score any victim set in this group could have (`_lower_bound`)."""
        pool = [c for n in group for c in self.by_node.get(n, ())]
        flow = self.flow_of(group)
        if flow and self.fits(group, [], flow):
            return (-1, 0, 0, ZERO.size_key())
        base = freed_trial(self.inv, group, (), flow, self.ctx.promised) if flow else self.inv
        return _lower_bound(pool, group, self.profiles, base)

    def best(self, bounded: list[tuple]) -> tuple | None:
        """The best victim set of all groups: first taking no owner below a guarantee; only
        when none is found, and the owner could be within its own, one that may."""
        for may_drop in (False, True):
            if may_drop and not self.could_reclaim:
                break
            best = self.best_with(bounded, may_drop)
            if best is not None:
                return best
            if not self.policy.quotas:
                break
        return None

    def best_with(self, bounded: list[tuple], may_drop: bool) -> tuple | None:
        """The best set, trying groups in the order of their bound until no group left could
        do better than the best found; each group that fails says why on its nodes."""
        best = None
        for bound, name, group in bounded:
            if best is not None and (bound, name) > best[0]:
                break
            found = self.build(group, may_drop)
            if found == "loans":
                found = self.build(group, may_drop, loans=False)
            where = f"node {name}" if len(group) == 1 else name
            if isinstance(found, str):
                self.reasons.append(found)
                self.failed(
                    group, f"making room on {where} {found}" if found.startswith("would") else found
                )
            elif found is None:
                self.failed(group, f"stopping what may be stopped on {where} would not make room")
            elif best is None or (found[0], name) < best[0]:
                best = ((found[0], name), found[1], found[2], found[3])
        return best

    def answer(self, result: Preemption, best: tuple) -> None:
        """The victims, with why each, the room being freed counted on, and the placement."""
        _, chosen, placed, flow = best
        reclaimed = self.reclaiming(chosen, placement_amount(placed))
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

    def why_none(self) -> list[str]:
        """Why no victim set was found, when none was."""
        if self.reasons:
            return list(dict.fromkeys(self.reasons))
        if any(c.replica.id not in self.spared for c in self.cands):
            return ["stopping what it may stop would not make room for it"]
        return ["no replica in its way may be stopped for it"]


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
    pool: list[Candidate], group: frozenset[str], profiles: Sequence[Profile], inv: Inventory
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
    fewest: list[tuple[int, int]] = []
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
        known = [n for n in counts if n is not None]
        if len(known) == len(counts):
            fewest.append((max(max(known), 1), max(gpus, 0)))
    if not fewest:
        return None
    k, gpus = min(fewest)
    return (rank, klass, k, (gpus, 0.0, 0))


def _first_need(profiles: Sequence[Profile]) -> Amount:
    return profile_amount(profiles[0]) if profiles else ZERO
