"""What preemption answers and the order it takes victims in.

A `Preemption` holds the victims (each a `Victim`, with why), the candidates it
may not take (each `Protected`, with why not) and, when nothing can help, why.
A `Candidate` is a replica that may be stopped for a model, with its tier. The
tiers and their sentences (`TIER_WHY`), the most victims a set may have and the
most protected candidates said are here too, for every part of preemption.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from catalog.domain import ModelSpec
from tenancy.quota import ZERO, Amount

from ..placement import Placement
from ..types import ReplicaView

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
class Candidate:
    """A replica that may be stopped for a model: where it is, its tier, what it holds."""

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
        if self.reclaimable and self.tier != IDLE_ON_DEMAND:
            return BORROWED
        # Only a loan to take back has no tier by class (candidates.py refuses the rest).
        assert self.tier is not None
        return self.tier

    def order(self) -> tuple:
        """Class inside every tier: lower class first, then longest unused, smallest, id."""
        return (self.model.class_rank, -self.idle_s, self.amount.size_key(), self.replica.id)
