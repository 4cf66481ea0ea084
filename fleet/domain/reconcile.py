"""One reconciler pass as a pure function: `decide(snapshot, now, timings)` returns a Plan.

The shell loads the snapshot, applies the plan in one transaction and sends
the agents their commands after the commit. Nothing here reads a clock, a
setting or the database, so every rule is a table test.

Here are the pass's driver and each model's step: what it wants, then its
replicas on their way out (`stopping.py`) and its missing ones placed or
preempted for (`starting.py`). What comes first, nodes and replicas lost and
failed and the failures counted, is `housekeeping.py`; what follows every
step, moves that free an NVLink domain for a model still unplaced, is
`defrag.py`; the plan and the actions it holds are `plan.py`.
"""

from __future__ import annotations

import secrets
from collections.abc import Callable, Iterable, Mapping
from dataclasses import replace
from datetime import datetime, timedelta

from catalog.domain import ModelSpec
from llmgw.core.config import Timings
from tenancy.quota import Amount, Policy

from .defrag import defragment
from .health import health_changes
from .holdings import profile_amount
from .housekeeping import clear_failures_once_ready, housekeeping, liveness, why_not_now
from .measured import autoscale, counted_ready, measured_for, ordered_profiles
from .placement import Inventory
from .plan import Event, Pass, Plan, Stop, seconds_since
from .preemption import context, live_reservations
from .quiet import OWN, WORLD, Quiet, QuietModels, World, shared_key, world_of
from .shedding import shed
from .starting import end_holds, scale_up
from .stopping import retire, scale_down, stop_first, stop_retired
from .types import ACTIVE, Measured, ModelState, NodeView, ReplicaView, Snapshot


def new_replica_id(model: str) -> str:
    """A new replica's id: its model's name and six random hex digits."""
    return f"{model}-{secrets.token_hex(3)}"


def decide(
    snap: Snapshot,
    now: datetime,
    t: Timings,
    new_id: Callable[[str], str] = new_replica_id,
    quiet: QuietModels | None = None,
) -> Plan:
    """Compare what should run with what runs, and say what to do about it.

    With `quiet` (kept by the caller from pass to pass), a model whose step did nothing
    last time and whose inputs are the same is not looked at again (quiet.py): the plan
    is the same as without it."""
    plan = Plan()
    nodes = liveness(snap, now, t, plan)
    _say_health(snap, nodes, now, t, plan)
    states = {name: snap.states.get(name) or ModelState(model=name) for name in snap.models}
    alive = housekeeping(snap, nodes, now, t, plan, states)
    reserved = _live_reservations(states, now)
    by_model, live = _by_model(alive)
    _stop_removed(snap, by_model, t, plan)
    ctx = context(snap.models, alive, snap.policy, now, t, reserved)
    p = Pass(
        snap=snap,
        now=now,
        t=t,
        plan=plan,
        inv=Inventory(nodes, alive, reserved, snap.power, snap.facility),
        states=states,
        ctx=ctx,
        draining=frozenset(n.id for n in nodes.values() if n.draining),
        new_id=new_id,
        live=live,
    )
    _steps(p, by_model, quiet, lambda usage: world_of(p, nodes, alive, reserved, usage))
    defragment(p)
    shed(p)
    end_holds(p)
    _say_parked(snap, states, plan)
    plan.states = states
    return plan


def _say_health(
    snap: Snapshot, nodes: Mapping[str, NodeView], now: datetime, t: Timings, plan: Plan
) -> None:
    """Which replicas are routed to now, and a sentence for each that is not."""
    plan.health = health_changes(
        snap.replicas, nodes, snap.heard, now, unreachable=t.unreachable, floor=snap.silence_floor
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


def _live_reservations(states: dict[str, ModelState], now: datetime) -> dict:
    """Per model, the room kept for it that still holds; a model's kept room whose hold
    ended is let go from its state."""
    reserved = live_reservations(states, now)
    for name, state in states.items():
        if state.reserved and name not in reserved:
            states[name] = replace(state, reserved=(), reserved_until=None)
    return reserved


def _by_model(alive: Iterable[ReplicaView]) -> tuple[dict[str, list[ReplicaView]], dict[str, int]]:
    """Each model's replicas still alive, and how many of them are live (active, not
    retiring): the count the pass goes on with (placements add to it)."""
    by_model: dict[str, list[ReplicaView]] = {}
    live: dict[str, int] = {}
    for r in alive:
        reps = by_model.get(r.model)
        if reps is None:
            reps = by_model[r.model] = []
            live[r.model] = 0
        reps.append(r)
        if r.state in ACTIVE and not r.retiring:
            live[r.model] += 1
    return by_model, live


def _stop_removed(
    snap: Snapshot, by_model: Mapping[str, list[ReplicaView]], t: Timings, plan: Plan
) -> None:
    """Stop the replicas of models no longer in the catalog."""
    for name in sorted(by_model.keys() - snap.models.keys()):
        for r in by_model[name]:
            if r.state not in ("stopping",):
                plan.stops.append(Stop(r.id, int(t.preempt_grace), f"model {name} was removed"))


def _steps(
    p: Pass,
    by_model: Mapping[str, list[ReplicaView]],
    quiet: QuietModels | None,
    world: Callable[[dict], World],
) -> None:
    """Each model's step, in the pass's order; with `quiet`, the models that did nothing
    from the very same inputs are passed over (quiet.py). `world` is the pass's world,
    given what each scope held when the pass began."""
    snap, ctx = p.snap, p.ctx
    order = (snap.models.values(), ctx.policy, dict(ctx.usage), snap.measurements)
    if quiet is None:
        ordered = pass_order(*order)
    else:
        quiet.begin(
            shared_key(snap, p.t, p.draining),
            world=lambda: world(order[2]),
            touched=lambda: _touched(p),
        )
        ordered = quiet.ordered((list(order[0]), *order[1:]), lambda: pass_order(*order))
    for model in ordered:
        _step(model, by_model.get(model.name, []), p, quiet)
    if quiet is not None:
        quiet.trim(snap.models.keys())


def _say_parked(snap: Snapshot, states: Mapping[str, ModelState], plan: Plan) -> None:
    """A sentence for each model parked in this pass."""
    for name, state in states.items():
        if state.parked_since and not ((was := snap.states.get(name)) and was.parked_since):
            plan.events.append(
                Event(
                    f"model {name} parked after {state.failures} failures in a row: "
                    f"{state.parked_reason}; llmgw ctl retry {name} to try again",
                    "park",
                    model=name,
                    failures=state.failures,
                )
            )


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


def desired_replicas(
    model: ModelSpec, state: ModelState, now: datetime, last_used: datetime | None = None
) -> int:
    """min plus what load added, at most max; an on-demand model wants one while asked for.

    `last_used` is when any of its replicas was last used: a replica its engine reports
    busy is in use even when nobody has asked for the model since (domain.md, Replica use).
    """
    if model.on_demand:
        asked = max((t for t in (state.last_requested_at, last_used) if t), default=None)
        recent = asked is not None and seconds_since(asked, now) < model.idle_timeout_s
        return 1 if recent else 0
    return min(model.min_replicas + state.extra, model.max_replicas)


def _step(
    model: ModelSpec, replicas: list[ReplicaView], p: Pass, quiet: QuietModels | None
) -> None:
    """A model's step, or, when it did nothing last time from these very inputs, what it
    returned then (quiet.py); a step that did nothing now is kept for the next pass."""
    name, state_in, load = model.name, p.states[model.name], p.snap.loads.get(model.name)
    taken = bool(p.ctx.taken) and any(r.id in p.ctx.taken for r in replicas)
    if quiet is None or taken:
        p.states[name] = _reconcile_model(model, replicas, p)[0]
        if quiet is not None:
            quiet.put(None, name)
        return
    kept = quiet.get(model, replicas, state_in, load, p.now)
    if kept is not None:
        p.states[name] = kept
        return
    before = _marks(p, name)
    untouched = quiet.untouched()
    state, keep, until = _reconcile_model(model, replicas, p)
    p.states[name] = state
    world, kept_with = 0, None
    if keep == WORLD and untouched and state == state_in and (looked := quiet.world()):
        # It stays unplaceable from the same inputs: kept with the world it looked at.
        world, until = looked[0], _earliest(until, looked[1].until)
    if keep and (keep != WORLD or world) and _marks(p, name) == before:
        kept_with = Quiet(model, list(replicas), state_in, load, state, p.now, until, world)
    quiet.put(kept_with, name)


def _touched(p: Pass) -> tuple:
    """What the steps of a pass change that a step looking for room reads: the plan, the
    replicas taken, the room kept, what each scope holds."""
    return (*_plan_marks(p), sum(map(len, p.inv.reserved.values())), dict(p.ctx.usage))


def _marks(p: Pass, name: str) -> tuple:
    """What a step that did nothing leaves as it found: the plan, what the pass took, and
    the model's live count."""
    return (*_plan_marks(p), p.live.get(name))


def _plan_marks(p: Pass) -> tuple[int, ...]:
    plan = p.plan
    return (
        len(plan.starts),
        len(plan.drains),
        len(plan.stops),
        len(plan.forgets),
        len(plan.retires),
        len(plan.events),
        len(p.ctx.taken),
    )


def _earliest(a: datetime | None, b: datetime | None) -> datetime | None:
    return b if a is None else a if b is None else min(a, b)


def _reconcile_model(
    model: ModelSpec, replicas: list[ReplicaView], p: Pass
) -> tuple[ModelState, str, datetime | None]:
    """One model's step: scale from load, what it wants, its replicas on their way out,
    then what is missing placed (or why not). Returns its new state, what the step read
    beyond its own model and clocks (quiet.py: OWN nothing, WORLD the room it found none
    in, "" more), and the first moment one of its own clocks could decide otherwise
    (None: none runs)."""
    state = clear_failures_once_ready(replicas, p.states[model.name])
    # A step reading other models or a running load clock is not kept; one that looked for
    # room and found none is kept with the world it looked at (quiet.py).
    keep = "" if state.held_for else OWN
    if model.max_replicas > model.min_replicas or state.extra or state.busy_since:
        state, reads_load = _scale_from_load(model, replicas, state, p)
        keep = "" if reads_load else keep
    desired, until = _wanted(model, replicas, state, p.now)
    # Replicas that retire are taken from the pass (retire): such a step is not kept.
    state, retiring, deadlines = retire(model, replicas, state, p)
    for r in replicas:
        if r.state == "draining" and r.drain_deadline is not None:
            until = _earliest(until, r.drain_deadline)
    active = _on_the_way_out(model, replicas, retiring, deadlines, desired, p)
    missing = desired - len(active)
    if missing <= 0 and state.reserved:
        state = replace(state, reserved=(), reserved_until=None)
    unplaceable, explanation = False, state.explanation if state.unplaceable else ()
    if missing > 0:
        if state.backoff_until is not None and p.now < state.backoff_until:
            until = _earliest(until, state.backoff_until)
        state, unplaceable, explanation, looked = _place_missing(
            model, replicas, state, missing, (retiring, deadlines), p
        )
        if looked:
            keep = WORLD if keep and unplaceable else ""
    explanation = tuple(explanation)
    if (state.desired, state.unplaceable, state.explanation) != (desired, unplaceable, explanation):
        state = replace(state, desired=desired, unplaceable=unplaceable, explanation=explanation)
    return state, keep, until


def _scale_from_load(
    model: ModelSpec, replicas: list[ReplicaView], state: ModelState, p: Pass
) -> tuple[ModelState, bool]:
    """The autoscaler's step (measured.py), with a sentence when it scaled; and whether it
    read a running load clock (such a step is not kept, quiet.py)."""
    name, load = model.name, p.snap.loads.get(model.name)
    reads_load = (
        load is not None and not model.on_demand and model.max_replicas > model.min_replicas
    )
    ready = [r for r in replicas if r.state == "ready" and not r.retiring]
    running = [r.profile for r in replicas if r.state in ACTIVE]
    found = measured_for(model, running, p.snap.measurements)
    measured = found[0] if found else None
    counts = counted_ready(ready, p.snap.caps, measured)
    state, scaled = autoscale(model, state, load, len(ready), measured, p.now, p.t, counts)
    if scaled:
        p.plan.events.append(Event(scaled, "scale", model=name, extra=state.extra))
    return state, reads_load


def _wanted(
    model: ModelSpec, replicas: list[ReplicaView], state: ModelState, now: datetime
) -> tuple[int, datetime | None]:
    """How many replicas the model wants, and, for an on-demand model wanted now, when its
    idle timeout passes (from the last time it was asked for or used)."""
    # Only an on-demand model's wish depends on when its replicas were last used.
    last_used = (
        max((r.last_used_at for r in replicas if r.last_used_at), default=None)
        if model.on_demand
        else None
    )
    desired = desired_replicas(model, state, now, last_used)
    if model.on_demand and desired:
        asked = max(x for x in (state.last_requested_at, last_used) if x)
        return desired, asked + timedelta(seconds=model.idle_timeout_s)
    return desired, None


def _on_the_way_out(
    model: ModelSpec,
    replicas: list[ReplicaView],
    retiring: set[str],
    deadlines: dict[str, datetime],
    desired: int,
    p: Pass,
) -> list[ReplicaView]:
    """Stop retired replicas whose time has come and drain or stop what is too many;
    return the active replicas that stay (stopping.py)."""
    # A replica another model's preemption took this pass is already on its way out.
    active = [
        r
        for r in replicas
        if r.state in ACTIVE and r.id not in retiring and r.id not in p.ctx.taken
    ]
    replaced = len([r for r in active if r.state == "ready"]) >= desired
    stop_retired(replicas, retiring, deadlines, replaced, p)
    if len(active) > desired:
        scale_down(model, active, desired, p)
    return active


def _place_missing(
    model: ModelSpec,
    replicas: list[ReplicaView],
    state: ModelState,
    missing: int,
    retired: tuple[set[str], dict[str, datetime]],
    p: Pass,
) -> tuple[ModelState, bool, tuple, bool]:
    """Place what is missing (starting.py), or say why not now (parked, backing off, held).
    Returns the state, whether it is unplaceable, the explanation, and whether it looked
    for room. A restart whose replacement finds no room stops the replica it replaces."""
    blocked = why_not_now(state, p.snap, p.now) or _held(state, p)
    if blocked:
        return state, False, ({"profile": "", "reasons": [blocked]},), False
    state, unplaceable, explanation = scale_up(model, state, missing, p)
    if unplaceable:
        stop_first(model, replicas, *retired, explanation, p)
    return state, unplaceable, explanation, True


def held_for(state: ModelState, now: datetime, live: int, wants: ModelState | None) -> str:
    """The model this one gave room to while it is held back, else "": the hold ends at
    held_until, or with its cause: once that model runs (`live`) the replicas it wants, is
    parked, or is gone (`wants` None: no state, no model)."""
    if not state.held_for or not state.held_until or now >= state.held_until:
        return ""
    if wants is None or wants.parked_since or live >= wants.desired:
        return ""
    return state.held_for


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


# Plan and Event are decide()'s answer: the shell reads them from here with decide.
__all__ = [
    "Event",
    "Plan",
    "decide",
    "desired_replicas",
    "held_for",
    "new_replica_id",
    "pass_order",
]
