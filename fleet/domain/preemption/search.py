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

from catalog.domain import ModelSpec, Profile
from tenancy.quota import ZERO, Amount, Policy

from ..holdings import placement_amount, profile_amount
from ..placement import Inventory, Placement
from ..types import FABRIC_LABEL, ReplicaView
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
            fabric = inv.rooms[n].node.labels.get(FABRIC_LABEL)
            if fabric:
                fabrics.setdefault(fabric, set()).add(n)
        for fabric, nodes in sorted(fabrics.items()):
            if nodes & with_candidates:
                groups[f"{FABRIC_LABEL}={fabric}"] = frozenset(nodes)
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
        return name_not_taken(result, cands, spared, node_why, unsaid, why_not)

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
    by_node: dict[str, list[Candidate]] = {}
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
        group: frozenset[str], chosen: list[Candidate], flow: list[ReplicaView]
    ) -> Placement | None:
        trial = freed_trial(inv, group, [c.replica for c in chosen], flow, ctx.promised)
        placed = trial.place_spread(profiles, avoid & group, want.source, want.name)
        return placed if isinstance(placed, Placement) else None

    def reclaiming(chosen: list[Candidate], need: Amount) -> bool:
        return policy.within_guarantee(want.owner, _minus(policy, ctx.usage, chosen), need)

    def allowed(
        c: Candidate, chosen: list[Candidate], may_drop: bool, pool: list[Candidate]
    ) -> bool:
        rid = c.replica.id
        if c.tier is None:
            # A loan, taken back only by an owner within its guarantee on the trial: with
            # this one, and every victim of its own that could go with it, gone.
            theirs = [o for o in pool if o.replica.id in own_ids]
            if not reclaiming([*chosen, c, *theirs], need_guess):
                past = guarantee_passed(
                    policy, want.owner, _minus(policy, ctx.usage, [*chosen, c, *theirs]), need_guess
                )
                spared.setdefault(
                    rid,
                    f"candidate {rid} is on loan, but {want.name} would take {past} past its guarantee",
                )
                return False
        if not may_drop and policy.quotas:
            after = _minus(policy, ctx.usage, chosen)
            if scope := guarantee_dropped(policy, c.model.owner, after, c.amount):
                borrows = "" if could_reclaim else f", and {want.name} would borrow"
                spared.setdefault(
                    rid, f"candidate {rid} would take {scope} below its guarantee{borrows}"
                )
                return False
        if may_drop:
            spared.pop(rid, None)
        return True

    def still_valid(chosen: list[Candidate], need: Amount) -> bool:
        return all(c.tier is not None for c in chosen) or reclaiming(chosen, need)

    def pick(pool: list[Candidate], chosen: list[Candidate]) -> Candidate:
        """The next candidate in tier order; among loans, from whoever still borrows most."""
        taken: dict[str, Amount] = {}
        for c in chosen:
            taken[c.model.owner] = taken.get(c.model.owner, ZERO) + c.amount

        def key(c: Candidate) -> tuple:
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
        chosen: list[Candidate] = []
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
                    past = guarantee_passed(
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
