"""One reconciler pass as a pure function: `decide(snapshot, now, timings)` returns a Plan.

The shell loads the snapshot, applies the plan in one transaction and sends
the agents their commands after the commit. Nothing here reads a clock, a
setting or the database, so every rule is a table test.
"""

from __future__ import annotations

import secrets
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta

from catalog.domain import ModelSpec, Profile
from llmgw.core.config import Timings
from tenancy.quota import Amount, Policy

from .context import Context, context
from .health import HealthChange, health_changes
from .holdings import placement_amount, profile_amount
from .measured import autoscale, measured_for, ordered_profiles
from .placement import MAX_REASONS_PER_PROFILE, Inventory, Placement, ShardPlan
from .preemption import preempt
from .reserved import live_reservations, place_kept, reserved_amount
from .types import (
    ACTIVE,
    HOLDING,
    Failure,
    Measured,
    ModelState,
    NodeView,
    ReplicaView,
    Reservation,
    Snapshot,
    shard_id,
)
from .victims import Preemption

SETTLING = "waiting for agents to report their shards after a control plane restart"


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


class Event(str):
    """A decision in a sentence, which compares and prints as the sentence, with its kind and
    figures beside it for a structured log line (`LLMGW_LOG_FORMAT=json`)."""

    kind: str
    fields: dict

    def __new__(cls, text: str, kind: str, **fields) -> Event:
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
            or self.node_changes
            or self.health
        )


def new_replica_id(model: str) -> str:
    return f"{model}-{secrets.token_hex(3)}"


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


def decide(
    snap: Snapshot,
    now: datetime,
    t: Timings,
    new_id: Callable[[str], str] = new_replica_id,
) -> Plan:
    """Compare what should run with what runs, and say what to do about it."""
    plan = Plan()
    nodes = _liveness(snap, now, t, plan)
    plan.health = health_changes(
        snap.replicas, nodes, now, unreachable=t.unreachable, floor=snap.silence_floor
    )
    for h in plan.health:
        if h.reason is not None:
            plan.events.append(
                Event(
                    f"replica {h.replica_id} is not routed to: {h.reason}",
                    "replica_unhealthy",
                    replica=h.replica_id,
                )
            )
    states = {name: snap.states.get(name) or ModelState(model=name) for name in snap.models}
    alive = _housekeeping(snap, nodes, now, t, plan, states)
    reserved = live_reservations(states, now)
    for name, state in states.items():
        if state.reserved and name not in reserved:
            states[name] = replace(state, reserved=(), reserved_until=None)
    inventory = Inventory(nodes, alive, reserved)
    by_model: dict[str, list[ReplicaView]] = {}
    for r in alive:
        by_model.setdefault(r.model, []).append(r)
    for name in sorted(by_model.keys() - snap.models.keys()):
        for r in by_model[name]:
            if r.state not in ("stopping",):
                plan.stops.append(Stop(r.id, int(t.preempt_grace), f"model {name} was removed"))
    ctx = context(snap.models, alive, snap.policy, now, t, reserved)
    p = Pass(
        snap=snap,
        now=now,
        t=t,
        plan=plan,
        inv=inventory,
        states=states,
        ctx=ctx,
        draining=frozenset(n.id for n in nodes.values() if n.draining),
        new_id=new_id,
        live={
            name: sum(1 for r in reps if r.state in ACTIVE and not r.retiring)
            for name, reps in by_model.items()
        },
    )
    for model in pass_order(snap.models.values(), ctx.policy, ctx.usage, snap.measurements):
        states[model.name] = _reconcile_model(model, by_model.get(model.name, []), p)
    _end_holds(p)
    for name, state in states.items():
        was = snap.states.get(name)
        if state.parked_since and not (was and was.parked_since):
            plan.events.append(
                Event(
                    f"model {name} parked after {state.failures} failures in a row: "
                    f"{state.parked_reason}; llmgw ctl retry {name} to try again",
                    "park",
                    model=name,
                    failures=state.failures,
                )
            )
    plan.states = states
    return plan


def pass_order(
    models: Iterable[ModelSpec],
    policy: Policy,
    usage: Mapping[str, Amount],
    measurements: Mapping[tuple[str, str], Measured],
) -> list[ModelSpec]:
    """Higher class first; within a class, models whose placement keeps their owner within
    its guarantee before borrowers; then by name."""

    def key(m: ModelSpec) -> tuple:
        first = ordered_profiles(m, measurements)[0] if policy.quotas else None
        within = first is not None and policy.within_guarantee(
            m.owner, usage, profile_amount(first)
        )
        return (-m.class_rank, not within, m.name)

    return sorted(models, key=key)


def _liveness(snap: Snapshot, now: datetime, t: Timings, plan: Plan) -> dict[str, NodeView]:
    """Unreachable after a short silence, lost after a long one, counted from the floor."""
    nodes = {}
    for node in snap.nodes.values():
        seen = node.last_seen or now
        if snap.silence_floor is not None and seen < snap.silence_floor:
            seen = snap.silence_floor
        silent = _since(seen, now)
        state = node.state
        if state != "lost" and silent >= t.lost:
            state = "lost"
        elif state == "ready" and silent >= t.unreachable:
            state = "unreachable"
        if state != node.state:
            why = f"nothing heard for {duration(silent)}"
            plan.node_changes.append(NodeChange(node.id, state, why))
            plan.events.append(
                Event(f"node {node.id} is {state}: {why}", "node_state", node=node.id, state=state)
            )
            node = replace(node, state=state)
        nodes[node.id] = node
    return nodes


def _record_failure(
    state: ModelState, now: datetime, reason: str, t: Timings, failure: Failure
) -> ModelState:
    failures = state.failures + 1
    backoff = min(t.backoff_base * 2 ** (failures - 1), t.backoff_max)
    parked = failures >= t.park_after
    return replace(
        state,
        failures=failures,
        last_failure_at=now,
        backoff_until=now + timedelta(seconds=backoff),
        parked_since=state.parked_since or (now if parked else None),
        parked_reason=reason if parked and not state.parked_since else state.parked_reason,
        last_failure=replace(failure, at=now),
    )


def _failure(snap: Snapshot, r: ReplicaView, reason: str) -> Failure:
    """What the agent said of a failed replica, else the reason the pass has for it."""
    said = snap.failures.get(r.id)
    if said is not None:
        return said
    return Failure(r.id, node=r.shards[0].node_id if r.shards else "", detail=reason)


# A replica still stopping this long after its grace is asked again: the first stop_shard
# may have been lost (the agent away, the channel layer down).
STOP_AGAIN_AFTER_S = 30


def _housekeeping(
    snap: Snapshot,
    nodes: dict[str, NodeView],
    now: datetime,
    t: Timings,
    plan: Plan,
    states: dict[str, ModelState],
) -> list[ReplicaView]:
    """Forget what no longer runs, count failures, time out slow starts; return what still holds room."""
    alive = []
    for r in snap.replicas:
        if r.state == "stopped":
            plan.forgets.append(Forget(r.id, "stopped"))
            continue
        running = [s for s in r.shards if s.state not in ("failed", "stopped")]
        lost = sorted(
            s.node_id for s in r.shards if (n := nodes.get(s.node_id)) is None or n.state == "lost"
        )
        if lost:
            node = lost[0]
            if any(s.node_id not in lost for s in running):
                plan.stops.append(Stop(r.id, 0, f"node {node} was lost", lost_node=node))
            plan.forgets.append(Forget(r.id, f"node {node} was lost", lost_node=node))
            plan.events.append(
                Event(
                    f"replica {r.id} of {r.model} lost with node {node}",
                    "replica_lost",
                    replica=r.id,
                    model=r.model,
                    node=node,
                )
            )
            continue
        if r.state == "failed":
            reason = r.reason or "failed"
            if r.counts_as_failure and r.model in states:
                states[r.model] = _record_failure(
                    states[r.model], now, reason, t, _failure(snap, r, reason)
                )
            plan.events.append(
                Event(
                    f"replica {r.id} of {r.model} failed: {reason}",
                    "replica_failed",
                    replica=r.id,
                    model=r.model,
                )
            )
            if len(r.shards) < 2 or not running:
                plan.forgets.append(Forget(r.id, reason))
                continue
            # One shard of a multi-node replica failed: the others stop before their room is free.
            plan.stops.append(Stop(r.id, 0, f"replica {r.id} failed: {reason}"))
            r = replace(r, state="stopping")
        elif (
            r.state == "stopping"
            and _since(r.state_since, now) > r.stop_grace_s + STOP_AGAIN_AFTER_S
        ):
            plan.stops.append(
                Stop(r.id, 0, f"replica {r.id} is still stopping; asking its agents again")
            )
        elif (
            r.state in ("pending", "starting")
            and not snap.settling
            # Fetching weights has its own end: bytes stop coming and the agent says failed.
            and not any(s.state == "fetching" for s in r.shards)
        ):
            # Counted from the reconciler's restart at the earliest: agents had no chance
            # before; and from its start once starting, so a long fetch is not counted.
            started = r.state_since if r.state == "starting" else r.created_at
            started = max(started, snap.silence_floor) if snap.silence_floor else started
            if _since(started, now) > (timeout := _startup_timeout(snap, r)):
                reason = f"replica {r.id} did not become ready within {duration(timeout)}"
                plan.stops.append(Stop(r.id, 0, reason))
                plan.events.append(Event(reason, "replica_failed", replica=r.id, model=r.model))
                if r.model in states:
                    states[r.model] = _record_failure(
                        states[r.model], now, reason, t, _failure(snap, r, reason)
                    )
                r = replace(r, state="stopping")
        alive.append(r)
    return alive


def _since(then: datetime, now: datetime) -> float:
    return (now - then).total_seconds()


def _startup_timeout(snap: Snapshot, r: ReplicaView) -> int:
    model = snap.models.get(r.model)
    profile = model.profile(r.profile) if model else None
    return profile.startup_timeout_s if profile else 600


def desired_replicas(
    model: ModelSpec, state: ModelState, now: datetime, last_used: datetime | None = None
) -> int:
    """min plus what load added, at most max; an on-demand model wants one while asked for.

    `last_used` is when any of its replicas was last used: a replica its engine reports
    busy is in use even when nobody has asked for the model since (domain.md, Replica use).
    """
    if model.on_demand:
        asked = max((t for t in (state.last_requested_at, last_used) if t), default=None)
        recent = asked is not None and _since(asked, now) < model.idle_timeout_s
        return 1 if recent else 0
    return min(model.min_replicas + state.extra, model.max_replicas)


def _reconcile_model(model: ModelSpec, replicas: list[ReplicaView], p: Pass) -> ModelState:
    name, now, t, plan = model.name, p.now, p.t, p.plan
    state = _clear_failures_once_ready(replicas, p.states[name])
    if model.max_replicas > model.min_replicas or state.extra or state.busy_since:
        ready_count = sum(1 for r in replicas if r.state == "ready" and not r.retiring)
        running = [r.profile for r in replicas if r.state in ACTIVE]
        found = measured_for(model, running, p.snap.measurements)
        state, scaled = autoscale(
            model, state, p.snap.loads.get(name), ready_count, found and found[0], now, t
        )
        if scaled:
            plan.events.append(Event(scaled, "scale", model=name, extra=state.extra))
    # Only an on-demand model's wish depends on when its replicas were last used.
    last_used = (
        max((r.last_used_at for r in replicas if r.last_used_at), default=None)
        if model.on_demand
        else None
    )
    desired = desired_replicas(model, state, now, last_used)

    # Replicas on a node being drained retire: a replacement first, then they drain.
    retiring = {r.id for r in replicas if r.retiring}
    deadlines = {r.id: r.drain_deadline for r in replicas if r.retiring and r.drain_deadline}
    for r in replicas if p.draining else ():
        if (
            r.state in ACTIVE
            and r.id not in retiring
            and any(s.node_id in p.draining for s in r.shards)
        ):
            retiring.add(r.id)
            # It serves until its replacement is ready, or until the drain grace runs out when
            # no room is found for one: a node's drain always ends.
            deadline = now + timedelta(seconds=t.drain_grace)
            plan.retires.append(Retire(r.id, "its node is draining", deadline=deadline))
            deadlines[r.id] = deadline
    state = _restart_in_turn(model, replicas, state, retiring, plan)
    p.ctx.taken |= retiring

    # A replica another model's preemption took this pass is already on its way out.
    active = [
        r
        for r in replicas
        if r.state in ACTIVE and r.id not in retiring and r.id not in p.ctx.taken
    ]
    ready = [r for r in active if r.state == "ready"]
    replaced = len(ready) >= desired

    for r in replicas:
        if r.id in retiring and r.state in ("pending", "starting"):
            plan.stops.append(Stop(r.id, 0, f"replica {r.id} retired before it was ready"))
        elif r.id in retiring and r.state == "ready" and replaced:
            # Its replacement is ready: the stop's grace lets requests in flight finish.
            plan.stops.append(Stop(r.id, int(t.preempt_grace), f"replica {r.id} is replaced"))
        elif (
            r.id in retiring and r.state == "ready" and r.id in deadlines and now >= deadlines[r.id]
        ):
            why = f"replica {r.id} stops: its node drained {duration(t.drain_grace)} with no room for a replacement"
            plan.stops.append(Stop(r.id, int(t.preempt_grace), why))
        elif r.state == "draining":
            if r.id in retiring and replaced:
                plan.stops.append(
                    Stop(
                        r.id,
                        r.stop_grace_s,
                        f"stopping drained replica {r.id}: its replacement is ready",
                    )
                )
            elif r.drain_deadline is not None and now >= r.drain_deadline:
                why = (
                    f"stopping preempted replica {r.id}: it gave room to {r.preempted_for} "
                    f"after {duration(t.preempt_grace)}"
                    if r.preempted_for
                    else f"stopping drained replica {r.id}: no replacement after {duration(t.drain_grace)}"
                )
                plan.stops.append(Stop(r.id, r.stop_grace_s, why))

    if len(active) > desired:
        for r in sorted(active, key=lambda r: r.created_at, reverse=True)[: len(active) - desired]:
            p.ctx.taken.add(r.id)
            if r.state != "ready" or (model.on_demand and desired == 0):
                why = "idle past its idle timeout" if model.on_demand else "scaled down"
                plan.stops.append(Stop(r.id, int(t.preempt_grace), f"replica {r.id} {why}"))
            else:
                deadline = now + timedelta(seconds=t.drain_grace)
                plan.drains.append(
                    Drain(r.id, deadline, f"replica {r.id} drains: {name} scaled down to {desired}")
                )
        p.live[name] = desired

    missing = desired - len(active)
    if missing <= 0 and state.reserved:
        state = replace(state, reserved=(), reserved_until=None)
    unplaceable, explanation = False, state.explanation if state.unplaceable else ()
    if missing > 0:
        blocked = _why_not_now(state, p.snap, now) or _held(state, p)
        if blocked:
            explanation = ({"profile": "", "reasons": [blocked]},)
        else:
            state, unplaceable, explanation = _scale_up(model, state, missing, p)
            if unplaceable:
                _stop_first(model, replicas, retiring, deadlines, explanation, p)
    explanation = tuple(explanation)
    if (state.desired, state.unplaceable, state.explanation) == (desired, unplaceable, explanation):
        return state
    return replace(state, desired=desired, unplaceable=unplaceable, explanation=explanation)


def _stop_first(
    model: ModelSpec,
    replicas: list[ReplicaView],
    retiring: set[str],
    deadlines: dict[str, datetime],
    explanation: tuple,
    p: Pass,
) -> None:
    """A restart (or a roll) whose replacement finds no room stops the replica it replaces
    first, and its replacement is placed into the room that frees: one replica fewer for a
    while rather than a restart that never ends. A drain's retiring replica has a deadline
    of its own and waits for it."""
    stopping = {s.replica_id for s in p.plan.stops}
    old = [
        r
        for r in replicas
        if r.id in retiring
        and r.state == "ready"
        and r.id not in deadlines
        and r.id not in stopping
    ]
    if not old:
        return
    first = next((w for e in explanation for w in e["reasons"]), "no profile fits")
    r = old[0]
    why = (
        f"replica {r.id} of {model.name} stops before its replacement starts: no room for "
        f"both ({first}); the replacement is placed into the room it frees"
    )
    p.plan.stops.append(Stop(r.id, int(p.t.preempt_grace), why))
    p.plan.events.append(Event(why, "restart", model=model.name, replica=r.id))


def held_for(state: ModelState, now: datetime, live: int, wants: ModelState | None) -> str:
    """The model this one gave room to while it is held back, else "": the hold ends at
    held_until, or with its cause: once that model runs (`live`) the replicas it wants, is
    parked, or is gone (`wants` None: no state, no model)."""
    if not state.held_for or not state.held_until or now >= state.held_until:
        return ""
    if wants is None or wants.parked_since or live >= wants.desired:
        return ""
    return state.held_for


def _end_holds(p: Pass, to: str = "") -> None:
    """End the holds that are over for good, so that no view names them again: run out, or
    for a model removed or parked since; with `to`, every hold for that model, which let
    the room it was given go. (A hold for a model that has its replicas is over only while
    it has them: it holds again if that model wants more before the hold runs out.)"""
    for name, state in p.states.items():
        if not (state.held_for or state.held_until):
            continue
        if to and state.held_for != to:
            continue
        wants = p.states.get(state.held_for) if state.held_for in p.snap.models else None
        if (
            not to
            and state.held_until
            and p.now < state.held_until
            and wants is not None
            and not wants.parked_since
        ):
            continue
        p.states[name] = replace(state, held_for="", held_until=None)


def _held(state: ModelState, p: Pass) -> str:
    """Why a model that gave room to another may not take it back yet; "" once it may."""
    if state.held_for not in p.snap.models:
        return ""
    to = state.held_for
    if not held_for(state, p.now, p.live.get(to, 0), p.states.get(to)):
        return ""
    return (
        f"gave room to {state.held_for}; held until {state.held_until:%H:%M:%S} UTC "
        "or until it has its replicas"
    )


def _scale_up(
    model: ModelSpec, state: ModelState, missing: int, p: Pass
) -> tuple[ModelState, bool, tuple]:
    """Place the missing replicas one after another, each seeing what the previous took;
    when there is no room, preempt, and say why when that cannot help either."""
    name, plan, inv, ctx = model.name, p.plan, p.inv, p.ctx
    profiles = ordered_profiles(model, p.snap.measurements)
    for _ in range(missing):
        # The room kept for it is its own to place into, and no longer counted as coming.
        mine = inv.unreserve(name)
        kept = reserved_amount(state.reserved)
        ctx.charge(model.owner, kept, -1)
        # Into the room kept for it first, on the GPUs kept: not into another's leftovers.
        placed = place_kept(inv, profiles, state.reserved, model.source) or _place(
            model, profiles, inv
        )
        if isinstance(placed, Placement):
            need = placement_amount(placed)
            over = ctx.policy.at_limit(model.owner, ctx.usage, need) if model.owner else ""
            if over:
                inv.rereserve(name, mine)
                ctx.charge(model.owner, kept)
                explanation = ({"profile": placed.profile.name, "reasons": [over]},)
                _refusal_said(model, state, explanation, over, plan)
                return state, True, explanation
            _start(model, placed, p)
            ctx.charge(model.owner, need)
            state = replace(state, reserved=(), reserved_until=None)
            continue
        # Its victims, and room another's victims are freeing that it counts on.
        counted = {v for r in state.reserved for v in r.victims}
        in_flight = [
            r.id
            for r in ctx.alive
            if r.state in HOLDING and (r.preempted_for == name or r.id in counted)
        ]
        if in_flight:
            inv.rereserve(name, mine)
            ctx.charge(model.owner, kept)
            why = f"waiting for room being freed by {', '.join(in_flight)}"
            return state, False, ({"profile": "", "reasons": [why]},)
        # Its victims are gone and it still does not fit (the node went away, say): the
        # room kept is no use to it; let it go and look again. The holds for it end: the
        # room they gave is let go.
        if state.reserved:
            _end_holds(p, name)
        state = replace(state, reserved=(), reserved_until=None)
        result = preempt(model, profiles, p.live.get(name, 0), inv, ctx, _avoid(model, inv))
        if result.victims or result.waits_for:
            why = (
                f"making room: stopping {_victim_list(result)}"
                if result.victims
                else f"waiting for room being freed by {', '.join(r for r, _ in result.waits_for)}"
            )
            return (
                _apply_preemption(model, state, result, p),
                False,
                ({"profile": "", "reasons": [why]},),
            )
        lines = [*result.blocked, *(x.why for x in result.protected)]
        explanation = tuple(placed)
        if lines:
            explanation += ({"profile": "preemption", "reasons": lines[:MAX_REASONS_PER_PROFILE]},)
        first = next((r for e in placed for r in e["reasons"]), "no profile fits")
        _refusal_said(model, state, explanation, first, plan)
        return state, True, explanation
    return state, False, ()


def _refusal_said(
    model: ModelSpec, state: ModelState, explanation: tuple, first: str, plan: Plan
) -> None:
    """Say a model cannot be placed once, and again only when the reason changes."""
    if state.unplaceable and tuple(state.explanation) == tuple(explanation):
        return
    plan.events.append(
        Event(f"model {model.name} cannot be placed: {first}", "unplaceable", model=model.name)
    )


def _victim_list(result: Preemption) -> str:
    return ", ".join(f"{v.replica} of {v.model}" for v in result.victims)


def _apply_preemption(
    model: ModelSpec, state: ModelState, result: Preemption, p: Pass
) -> ModelState:
    """Drain the victims with the preemption grace, hold their models, keep the room (with
    the room already being freed that it counts on)."""
    now, t = p.now, p.t
    deadline = now + timedelta(seconds=t.preempt_grace)
    until = now + timedelta(seconds=t.preempt_hold)
    p.ctx.charge(model.owner, placement_amount(result.placement))
    # The whole placement it counted on is kept for it: the free part now, the victims'
    # part once they are gone. Another model later in this pass cannot take the free part.
    by_node: dict[str, list[str]] = {}
    for replica, node in [(v.replica, v.node) for v in result.victims] + result.waits_for:
        by_node.setdefault(node, []).append(replica)
    reserved = tuple(
        Reservation(
            s.node_id, s.gpu_indices, s.memory_gb, s.cpu_cores, tuple(by_node.get(s.node_id, ()))
        )
        for s in result.placement.shards
    )
    p.ctx.preempted(model.name, [v.replica for v in result.victims], reserved)
    p.inv.keep(model.name, reserved)
    for v in result.victims:
        why = (
            f"replica {v.replica} of {v.model} ({v.capacity_class}) preempted for {model.name} "
            f"({model.effective_class}): {v.why}"
        )
        p.plan.drains.append(Drain(v.replica, deadline, why, preempted_for=model.name))
        p.plan.events.append(
            Event(
                why,
                "preemption",
                replica=v.replica,
                model=v.model,
                model_class=v.capacity_class,
                node=v.node,
                preempted_for=model.name,
                preempted_for_class=model.effective_class,
            )
        )
        held = p.states.get(v.model) or ModelState(model=v.model)
        p.states[v.model] = replace(
            held, held_until=until, held_for=model.name, preempted=held.preempted + 1
        )
        p.live[v.model] = p.live.get(v.model, 0) - 1
    return replace(state, reserved=reserved, reserved_until=until)


def _avoid(model: ModelSpec, inv: Inventory) -> frozenset[str]:
    return frozenset(inv.model_nodes.get(model.name, ()))


def _start(model: ModelSpec, placed: Placement, p: Pass) -> None:
    replica_id = p.new_id(model.name)
    shards = tuple((shard_id(replica_id, s.rank), s) for s in placed.shards)
    p.inv.reserve(model.name, placed)
    where = ", ".join(s.node_id for s in placed.shards)
    p.plan.starts.append(
        Start(replica_id, model.name, placed.profile, shards, f"placed on {where}")
    )
    p.plan.events.append(
        Event(
            f"replica {replica_id} of {model.name} placed on {where} ({placed.profile.name})",
            "placement",
            replica=replica_id,
            model=model.name,
            profile=placed.profile.name,
            nodes=[s.node_id for s in placed.shards],
        )
    )
    p.live[model.name] = p.live.get(model.name, 0) + 1


def _clear_failures_once_ready(replicas: list[ReplicaView], state: ModelState) -> ModelState:
    """A replica that became ready since the last failure clears the count and the backoff."""
    if not state.failures:
        return state
    since = state.last_failure_at
    if any(
        r.state == "ready" and (since is None or (r.ready_at and r.ready_at >= since))
        for r in replicas
    ):
        return replace(state, failures=0, backoff_until=None, last_failure=None)
    return state


def _why_not_now(state: ModelState, snap: Snapshot, now: datetime) -> str:
    if state.parked_since:
        return f"parked after {state.failures} failures in a row: {state.parked_reason}; llmgw ctl retry to try again"
    if state.backoff_until and now < state.backoff_until:
        # An absolute time: a countdown would change the stored explanation every pass.
        return f"backing off after {state.failures} failures; next try at {state.backoff_until:%H:%M:%S} UTC"
    if snap.settling:
        return SETTLING
    return snap.weights_waiting.get(state.model, "")


def _place(model: ModelSpec, profiles: list[Profile], inv: Inventory) -> Placement | list[dict]:
    """Spread over nodes that do not run the model yet; give that up when it is the only obstacle."""
    placed = inv.place_spread(profiles, _avoid(model, inv), model.source)
    return placed if isinstance(placed, Placement) else placed.as_explanation()


def _restart_in_turn(
    model: ModelSpec, replicas: list[ReplicaView], state: ModelState, retiring: set[str], plan: Plan
) -> ModelState:
    """Retire one replica started before the restart was asked for at a time, replacement first."""
    asked = state.restart_requested_at
    if asked is None:
        return state
    if any(r.id in retiring and r.state in HOLDING for r in replicas):
        return state
    older = sorted(
        (
            r
            for r in replicas
            if r.state in ACTIVE and r.created_at <= asked and r.id not in retiring
        ),
        key=lambda r: r.created_at,
    )
    if not older:
        plan.events.append(Event(f"model {model.name} restarted", "restart", model=model.name))
        return replace(state, restart_requested_at=None)
    retiring.add(older[0].id)
    plan.retires.append(Retire(older[0].id, "restart"))
    return state
