"""What a reconciler pass knows that preemption reads (`Context`).

The quota picture (what each scope holds, room in flight charged to whom it is
for), what this pass already took, the room kept for each model, the room
being freed, and each replica's standing: whether any preemptor may take it at
all, worked out once a pass however many models want room.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from functools import cached_property

from catalog.domain import ModelSpec, Profile
from llmgw.core.config import Timings
from tenancy.quota import ZERO, Amount, Holding, Policy

from ..holdings import holdings
from ..placement import Inventory, could_ever_run
from ..types import ACTIVE, HOLDING, ReplicaView, Reservation
from .reserved import reserved_amount


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


def _idle(r: ReplicaView, now: datetime) -> float:
    """Seconds unused; 0 when nobody has said, which is not the same as idle."""
    return (now - r.last_used_at).total_seconds() if r.last_used_at else 0.0


def _above_min(alive: Iterable[ReplicaView], models: Mapping[str, ModelSpec]) -> set[str]:
    """Per model, its newest live replicas past its minimum: room it grew into."""
    by_model: dict[str, list[ReplicaView]] = {}
    for r in alive:
        if r.state in ACTIVE and not r.retiring:
            by_model.setdefault(r.model, []).append(r)
    out: set[str] = set()
    for name, reps in by_model.items():
        spec = models.get(name)
        if spec is None:
            continue
        reps.sort(key=lambda r: (r.created_at, r.id), reverse=True)
        out.update(r.id for r in reps[: max(len(reps) - spec.min_replicas, 0)])
    return out
