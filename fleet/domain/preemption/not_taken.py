"""The sentences preemption says of what it does not take.

Which guarantee a set of victims would take the wanting owner past, or leave
a victim's owner below, with figures; and, once a search is over, every
candidate not taken named with why: spared by a rule, not needed, or stoppable
to no avail.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from tenancy.quota import ZERO, Amount, Policy

from .victims import MAX_PROTECTED, Candidate, Preemption, Protected


def guarantee_passed(policy: Policy, owner: str, usage: Mapping[str, Amount], need: Amount) -> str:
    """The first guarantee along an owner's chain `need` would take it past, with figures."""
    for q in policy.governing(owner):
        if q.guarantee.any() and (over := q.guarantee.over(usage.get(q.scope, ZERO) + need)):
            return f"{policy.name(q.scope)} ({over})"
    return policy.name(owner) or "its owner"


def guarantee_dropped(
    policy: Policy, owner: str, usage: Mapping[str, Amount], taken: Amount
) -> str:
    """The first scope along an owner's chain that taking `taken` leaves below its guarantee."""
    for q in policy.governing(owner):
        if q.guarantee.below(usage.get(q.scope, ZERO), taken):
            return policy.name(q.scope)
    return ""


def name_not_taken(
    result: Preemption,
    cands: Sequence[Candidate],
    spared: Mapping[str, str],
    node_why: Mapping[str, str],
    unsaid: int,
    why_not: str = "",
) -> Preemption:
    """Name every candidate not taken, with why, and return `result` with them.

    `spared` says why a rule spared a candidate, `node_why` why making room on a node
    failed, and `why_not` why none may be taken at all; past MAX_PROTECTED only how many
    more are left unsaid (`unsaid`: those candidates() already left unsaid).
    """
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
