"""How much more of a model fits, and how many replicas a throughput needs (domain.md,
Measured capacity: Headroom and Target). Pure: tried on a copy of the inventory."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from catalog.domain import ModelSpec
from llmgw.core.config import Timings
from tenancy.quota import ZERO, Amount, Policy

from .capped import Capped, Caps, capped, replicas_for, said
from .holdings import placement_amount
from .measured import measured_for, ordered_profiles
from .placement import Inventory, Placement
from .preemption import Context, context, live_reservations, preempt, reserved_amount
from .types import ACTIVE, HOLDING, Measured, ReplicaView, ShardView, Snapshot


@dataclass
class Headroom:
    model: str
    current: int
    more: int = 0
    # Replicas serving on their way out (a restart, a drain): not in `current`.
    retiring: int = 0
    # The nodes each further replica would use, one list per replica.
    nodes: list[list[str]] = field(default_factory=list)
    # It stopped at the number asked for, not at an edge: there may be room for more.
    limited: bool = False
    # Why one more than `more` does not fit: a line per node considered, or the quota limit.
    blocked: list[str] = field(default_factory=list)
    # What one more replica was measured to serve, on the profile it would get, at the
    # power limit of the GPUs it would get (capped.py).
    tok_per_sec: float | None = None
    # Why it counts less than was measured: its GPUs are held below their default power.
    capped: list[str] = field(default_factory=list)

    def as_dict(self) -> dict:
        return {
            "model": self.model,
            "current": self.current,
            "retiring": self.retiring,
            "more": self.more,
            "nodes": self.nodes,
            "limited": self.limited,
            "blocked": self.blocked,
            "tok_per_sec": self.tok_per_sec,
            "capped": self.capped,
        }


def headroom(
    model: ModelSpec,
    inv: Inventory,
    current: int,
    limit: int,
    policy: Policy,
    usage: Mapping[str, Amount],
    measurements: Mapping[tuple[str, str], Measured],
    caps: Caps | None = None,
) -> Headroom:
    """Place up to `limit` more replicas one after another on this inventory (a copy the
    caller does not keep), stopping at a full cluster or at a quota limit alike. The first
    one's measured figure counts at its GPUs' power limits (`caps`, capped.py)."""
    out = Headroom(model.name, current)
    profiles = ordered_profiles(model, measurements)
    usage = dict(usage)
    while out.more < limit:
        avoid = frozenset(inv.model_nodes.get(model.name, ()))
        placed = inv.place_spread(profiles, avoid, model.source, model.name)
        if not isinstance(placed, Placement):
            out.blocked = list(dict.fromkeys(r for _, rs in placed.reasons for r in rs))
            return out
        need = placement_amount(placed)
        if model.owner and (why := policy.at_limit(model.owner, usage, need)):
            out.blocked = [why]
            return out
        for s in policy.chain(model.owner):
            usage[s] = usage.get(s, ZERO) + need
        if out.more == 0 and (m := measurements.get((model.name, placed.profile.name))):
            out.tok_per_sec = m.tok_per_sec
            shards = [(s.node_id, s.gpu_indices) for s in placed.shards]
            if caps is not None and (c := capped(caps, shards, m.power_share)):
                out.tok_per_sec = m.tok_per_sec * c.factor
                out.capped = [said(c, m.tok_per_sec, m.power_share)]
        inv.reserve(model.name, placed)
        out.nodes.append([s.node_id for s in placed.shards])
        out.more += 1
    out.limited = True
    return out


class NotMeasured(ValueError):
    """A model with no measurement cannot be sized by throughput; the message says how to."""


def replicas_needed(
    model: ModelSpec,
    tokens_per_sec: float,
    running_profiles: list[str],
    measurements: Mapping[tuple[str, str], Measured],
    running: Sequence[ReplicaView] = (),
    caps: Caps | None = None,
) -> tuple[int, Measured, str]:
    """Replicas needed for a throughput: ceil(asked / measured per replica), at least one;
    with the measurement that sized it and its profile. A running replica on GPUs held
    below their default power counts less (`running`, `caps`: capped.py), and the
    replicas it leaves short are needed besides. Raises NotMeasured."""
    found = measured_for(model, running_profiles, measurements)
    if found is None or found[0].tok_per_sec <= 0:
        raise NotMeasured(
            f"{model.name} has not been measured; run `llmgw ctl bench {model.name} --save` first"
        )
    measured, profile = found
    held = running_capped(running, caps, measured)
    factors = [c.factor if c else 1.0 for c in held]
    return replicas_for(tokens_per_sec / measured.tok_per_sec, factors), measured, profile


def running_capped(
    running: Sequence[ReplicaView], caps: Caps | None, measured: Measured
) -> list[Capped | None]:
    """Per running replica, what it counts at its GPUs' power limits (None: all of it)."""
    if caps is None or not caps.shares:
        return [None] * len(running)
    return [capped(caps, _shards(r.shards), measured.power_share) for r in running]


def _shards(shards: Sequence[ShardView]) -> list[tuple[str, tuple[int, ...]]]:
    return [(s.node_id, s.gpu_indices) for s in shards]


def capped_said(
    tokens_per_sec: float,
    sized: tuple[int, Measured, str],
    held: Sequence[Capped | None],
) -> list[str]:
    """A sentence per capped running replica when counting them at their power limits is
    what asks for more replicas than the measurement alone would; else none."""
    needed, measured, _ = sized
    if needed <= replicas_for(tokens_per_sec / measured.tok_per_sec, [1.0] * len(held)):
        return []
    return list(
        dict.fromkeys(said(c, measured.tok_per_sec, measured.power_share) for c in held if c)
    )


def target(
    model: ModelSpec,
    tokens_per_sec: float,
    sized: tuple[int, Measured, str],
    room: Headroom,
    capped_running: Sequence[str] = (),
) -> dict:
    """How many replicas run of those needed, how many more fit, and why not when they do
    not. `sized` is replicas_needed's answer; `room` the headroom asked up to the rest;
    `capped_running` why running replicas count less than measured (capped_said)."""
    needed, measured, profile = sized
    more = max(needed - room.current, 0)
    fits = more <= room.more
    return {
        "model": model.name,
        "tok_per_sec": tokens_per_sec,
        "per_replica_tok_per_sec": measured.tok_per_sec,
        "profile": profile,
        "needed": needed,
        "current": room.current,
        "more": more,
        "room": room.more,
        "fits": fits,
        "blocked": [] if fits else room.blocked,
        "capped": list(capped_running),
    }


@dataclass
class Standing:
    """The room and the quota picture as a snapshot stands, for questions that change nothing."""

    inv: Inventory
    ctx: Context
    live: dict[str, int]


def standing(snap: Snapshot, now: datetime, t: Timings) -> Standing:
    alive = [r for r in snap.replicas if r.state in HOLDING]
    reserved = live_reservations(snap.states, now)
    live: dict[str, int] = {}
    for r in alive:
        if r.state in ACTIVE and not r.retiring:
            live[r.model] = live.get(r.model, 0) + 1
    return Standing(
        Inventory(snap.nodes, alive, reserved, snap.power, snap.facility),
        context(snap.models, alive, snap.policy, now, t, reserved),
        live,
    )


def preemption_dry_run(model: ModelSpec, snap: Snapshot, now: datetime, t: Timings) -> dict:
    """What would be stopped now to place one more replica of `model`, and why; which
    candidates are protected, and why; changing nothing."""
    st = standing(snap, now, t)
    state = snap.states.get(model.name)
    live = st.live.get(model.name, 0)
    wants = max((state.desired if state else model.min_replicas) - live, 0)
    profiles = ordered_profiles(model, snap.measurements)
    out: dict[str, Any] = {
        "model": model.name,
        "class": model.effective_class,
        "wants": wants,
        "fits": False,
        "victims": [],
        "protected": [],
        "blocked": [],
    }
    more = f"{wants} more" if wants else "one more (it has the replicas it wants)"
    if state and state.parked_since:
        out["blocked"] = [f"parked: {state.parked_reason}; llmgw ctl retry {model.name}"]
        out["summary"] = f"{model.name} is parked: nothing is placed or preempted for it"
        return out
    # Its victims, and room another's victims are freeing that it counts on (kept for it).
    counted = {v for r in st.ctx.promised.get(model.name, ()) for v in r.victims}
    in_flight = sorted(
        r.id for r in st.ctx.alive if r.preempted_for == model.name or r.id in counted
    )
    if in_flight:
        out["blocked"] = [f"waiting for room being freed by {', '.join(in_flight)}"]
        out["summary"] = f"{model.name} waits for room already being freed; nothing more is stopped"
        return out
    st.inv.unreserve(model.name)
    if state and state.reserved:
        st.ctx.charge(model.owner, reserved_amount(state.reserved), -1)
    avoid = frozenset(st.inv.model_nodes.get(model.name, ()))
    placed = st.inv.place_spread(profiles, avoid, model.source, model.name)
    if isinstance(placed, Placement):
        need = placement_amount(placed)
        if model.owner and (over := snap.policy.at_limit(model.owner, st.ctx.usage, need)):
            out["blocked"] = [over]
            out["summary"] = f"for {more}, {model.name} would not be placed: {over}"
            return out
        out["fits"] = True
        out["summary"] = f"{model.name} fits {more} without stopping anything"
        return out
    result = preempt(model, profiles, live, st.inv, st.ctx, avoid)
    out["victims"] = [
        {
            "replica": v.replica,
            "model": v.model,
            "class": v.capacity_class,
            "node": v.node,
            "why": v.why,
        }
        for v in result.victims
    ]
    out["protected"] = [
        {"replica": p.replica, "model": p.model, "why": p.why} for p in result.protected
    ]
    out["blocked"] = result.blocked
    freed = ", ".join(r for r, _ in result.waits_for)
    if result.waits_for:
        out["blocked"] = [*out["blocked"], f"would count on room being freed by {freed}"]
    if result.victims:
        out["summary"] = (
            f"for {more}, {model.name} ({model.effective_class}) would stop "
            f"{len(result.victims)} replica{'s' if len(result.victims) > 1 else ''}"
        )
        if freed:
            out["summary"] += f", counting on room already being freed by {freed}"
    elif freed:
        out["summary"] = (
            f"for {more}, {model.name} would wait for room already being freed by {freed}; "
            "nothing more is stopped"
        )
    else:
        out["summary"] = f"for {more}, preemption cannot make room for {model.name}"
    return out
