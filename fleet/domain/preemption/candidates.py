"""Choosing victims: which replicas may be stopped for a model, in which tier, and
why the others may not (domain.md, Preemption).

`candidates()` looks at the replicas standing on the nodes that could help and
puts each in a tier by its class, whether it is past its model's minimum, how
long it was unused and its owner's guarantee, or names it protected with why.
"""

from __future__ import annotations

from catalog.domain import ModelSpec
from llmgw.core.config import Timings

from ..types import ReplicaView
from .context import Context
from .victims import (
    GROWN_LOWER,
    GROWN_SAME,
    IDLE_ON_DEMAND,
    MAX_PROTECTED,
    MINIMUM_LOWER,
    Candidate,
    Protected,
)


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


def candidates(
    want: ModelSpec,
    live: int,
    ctx: Context,
    useful: set[str],
) -> tuple[list[Candidate], list[Protected], list[str], int]:
    """The replicas on useful nodes that may be stopped for `want`, those that may not (and
    why, at most MAX_PROTECTED of them, with how many more), and the multi-node replicas in
    the way."""
    t, policy = ctx.t, ctx.policy
    below_min = live < want.min_replicas
    # Only an owner with a guarantee can be within it and take back what others borrowed.
    may_reclaim = bool(policy.quotas) and policy.has_guarantee(want.owner)
    out: list[Candidate] = []
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

            def refuse(why: str, r: ReplicaView = r) -> None:
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
            out.append(Candidate(r, other, node, tier, reclaimable, s.idle_s, r.amount))
    return out, protected, blocked, unsaid
