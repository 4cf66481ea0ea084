"""Placement's scorers: each preference among the nodes that pass the filters a named
function, asked in a declared order (`SCORERS`); the node with the smallest score is
taken (a later scorer only breaks the ties of the earlier ones).

A scorer takes a node's room and what is asked (`room.Ask`) and answers a tuple
(smaller first); `order` joins them into the key eligible nodes are sorted by.

To add a preference: write one function here and put it, as a `Scorer`, in `SCORERS`
where it should weigh: before the ones it should overrule, after the ones that overrule it. The index
`Inventory` searches on large fleets (`inventory._first_fit`) walks the nodes in this
same order, and a property test holds it to that: a scorer that changes the order of
one-node GPU placements must be followed there too (`most_power_left` is, by
`Inventory._walk_by_power`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from .room import Ask, NodeRoom


def coolest_domain_first(room: NodeRoom, ask: Ask) -> tuple:
    """While conditions are enforced, nodes in no warm domain first (conditions.py): a warm
    rack still takes work, after the others."""
    standing = ask.standing.get(room.node.id) if ask.standing else None
    return (standing.level if standing is not None and ask.enforce else 0,)


def cools(ask: Ask) -> bool:
    """Whether `coolest_domain_first` can order anything for this ask."""
    standing = ask.standing
    return ask.enforce and standing is not None and any(s.level for s in standing.values())


def fewest_of_the_model_nearby(room: NodeRoom, ask: Ask) -> tuple:
    """While the model's replicas are spread, the rack, then the PDU, row, room, zone and
    site holding fewest of them first (spread.py)."""
    if ask.spread is None:
        return ()
    return ask.spread.key(ask.model, room.node.id)


def most_power_left(room: NodeRoom, ask: Ask) -> tuple:
    """Under power budgets, the node whose fullest rack or PDU has the most watts left
    first, so load levels across racks, then the one whose PDU phase has most left, so it
    levels across phases (power.py, `Ledger.roomiest`). What is left before the replica,
    not after: its need is the same wherever its GPUs' limits are alike, and the index
    walks whole domains in this order (`Inventory._walk_by_power`). A node under no
    budget has no limit to level against and comes first."""
    if ask.ledger is None:
        return (0.0, 0.0)
    return ask.ledger.roomiest(ask.ledger.node_domains.get(room.node.id, ()))


def levels_power(ask: Ask) -> bool:
    """Whether `most_power_left` can order anything for this ask: a budget applies."""
    return ask.ledger is not None


def holds_the_weights(room: NodeRoom, ask: Ask) -> tuple:
    """A node that holds the model's weights already first: it starts without a download."""
    return (not (bool(ask.source) and ask.source in room.node.weights),)


def joined_by_nvlink(room: NodeRoom, ask: Ask) -> tuple:
    """A shard of two GPUs or more: a node that can give a set joined each to each by
    NVLink first, before one whose links say it cannot (its shard would talk over PCIe).
    A node that says nothing of its links is not put behind: unknown is not "not
    joined" (an NVSwitch board's links reach the switch, not a GPU)."""
    if ask.need < 2 or not room.node.links:
        return (0,)
    free = sorted(room.free_gpus.get(ask.profile.gpu_class, ()))
    return (0 if room.joined(free, ask.need) is not None else 1,)


def joins(ask: Ask) -> bool:
    """Whether `joined_by_nvlink` can order anything for this ask."""
    return ask.links and ask.need >= 2


def packs_gpus_or_spreads_cpu(room: NodeRoom, ask: Ask) -> tuple:
    """GPU profiles pack (the fewest free GPUs of the class first, keeping whole nodes free
    for large profiles); CPU profiles spread (the fewest shards first)."""
    if ask.profile.cpu_only:
        return (room.shards,)
    return (len(room.free_gpus.get(ask.profile.gpu_class, [])),)


def by_id(room: NodeRoom, ask: Ask) -> tuple:
    """Ties go by node id, so the same fleet always gives the same answer."""
    return (room.node.id,)


@dataclass(frozen=True)
class Scorer:
    """A preference: `score` answers a node's part of the key; `applies` says, once per ask,
    whether it orders anything (one that gives every node the same part is left out)."""

    score: Callable[[NodeRoom, Ask], tuple]
    applies: Callable[[Ask], bool] = lambda ask: True


SCORERS: tuple[Scorer, ...] = (
    Scorer(coolest_domain_first, cools),
    Scorer(fewest_of_the_model_nearby, lambda ask: ask.spread is not None),
    Scorer(holds_the_weights, lambda ask: bool(ask.source)),
    Scorer(joined_by_nvlink, joins),
    Scorer(packs_gpus_or_spreads_cpu),
    # After the pack, not before: levelling first left every node part-used, and a replica
    # needing a whole node found none (the property test of unreachable budgets found it).
    Scorer(most_power_left, levels_power),
    Scorer(by_id),
)


def order(ask: Ask) -> Callable[[NodeRoom], tuple]:
    """The key nodes are ordered by for this ask, smallest first: the part of every scorer
    that applies, in `SCORERS` order. While the model is spread, its first parts are the
    spread's, one per level (`Spread.first` reads them)."""
    asked = tuple(s.score for s in SCORERS if s.applies(ask))

    def key(room: NodeRoom) -> tuple:
        parts: tuple = ()
        for score in asked:
            parts += score(room, ask)
        return parts

    return key
