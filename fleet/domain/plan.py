"""What a reconciler pass decides, and what its steps share while deciding.

The actions (`Start`, `Drain`, `Stop`, `Forget`, `Retire`, `NodeChange`), the
sentence each decision is said in (`Event`), the `Plan` that holds them, and
the `Pass` every step of `reconcile.decide` reads and adds to; with the two
figures the sentences are written with (`duration`, `seconds_since`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime

from catalog.domain import Profile
from llmgw.core.config import Timings

from .health import HealthChange
from .placement import Inventory, ShardPlan
from .preemption import Context
from .types import ModelState, Snapshot


def duration(seconds: float) -> str:
    """Seconds as the seed writes durations: 5m0s, 1h2m3s, 30s."""
    seconds = int(seconds)
    h, rest = divmod(seconds, 3600)
    m, s = divmod(rest, 60)
    if h:
        return f"{h}h{m}m{s}s"
    if m:
        return f"{m}m{s}s"
    return f"{s}s"


def seconds_since(then: datetime, now: datetime) -> float:
    """Seconds from `then` to `now`."""
    return (now - then).total_seconds()


@dataclass(frozen=True)
class Start:
    replica_id: str
    model: str
    profile: Profile
    shards: tuple[tuple[str, ShardPlan], ...]
    reason: str


@dataclass(frozen=True)
class Drain:
    replica_id: str
    deadline: datetime
    reason: str
    # Set when it drains to make room for that model (the preemption grace, not the drain's).
    preempted_for: str = ""


@dataclass(frozen=True)
class Stop:
    replica_id: str
    grace_s: int
    reason: str
    # Set when the stop follows from a node found lost: undone if the node was heard meanwhile.
    lost_node: str = ""


@dataclass(frozen=True)
class Forget:
    """Remove a replica that no longer runs (stopped, failed, or on a lost node)."""

    replica_id: str
    reason: str
    lost_node: str = ""


@dataclass(frozen=True)
class Retire:
    replica_id: str
    reason: str
    # When it stops even if no replacement became ready (a node's drain); None: it waits.
    deadline: datetime | None = None


@dataclass(frozen=True)
class Unretire:
    """A replica a drain retired stays: its node no longer drains."""

    replica_id: str


class Event(str):
    """A decision in a sentence, which compares and prints as the sentence, with its kind and
    figures beside it for a structured log line (`LLMGW_LOG_FORMAT=json`)."""

    kind: str
    fields: dict

    def __new__(cls, text: str, kind: str, **fields: object) -> Event:
        event = super().__new__(cls, text)
        event.kind, event.fields = kind, fields
        return event


@dataclass(frozen=True)
class NodeChange:
    node_id: str
    state: str
    reason: str


@dataclass
class Plan:
    """What one pass decided: actions, the new per-model state, and a line per decision."""

    starts: list[Start] = field(default_factory=list)
    drains: list[Drain] = field(default_factory=list)
    stops: list[Stop] = field(default_factory=list)
    forgets: list[Forget] = field(default_factory=list)
    retires: list[Retire] = field(default_factory=list)
    unretires: list[Unretire] = field(default_factory=list)
    node_changes: list[NodeChange] = field(default_factory=list)
    health: list[HealthChange] = field(default_factory=list)
    states: dict[str, ModelState] = field(default_factory=dict)
    events: list[Event] = field(default_factory=list)

    @property
    def empty(self) -> bool:
        return not (
            self.starts
            or self.drains
            or self.stops
            or self.forgets
            or self.retires
            or self.unretires
            or self.node_changes
            or self.health
        )


@dataclass
class Pass:
    """What one pass works with: the snapshot, the room left, and what it decided so far."""

    snap: Snapshot
    now: datetime
    t: Timings
    plan: Plan
    inv: Inventory
    states: dict[str, ModelState]
    ctx: Context
    draining: frozenset[str]
    new_id: Callable[[str], str]
    # Per model, its live replicas' count as the pass goes (placements add to it).
    live: dict[str, int] = field(default_factory=dict)
